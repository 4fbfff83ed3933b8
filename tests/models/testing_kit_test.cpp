// The installed testing kit (<mom/testing.hpp>) checked against modules that are wrong on purpose: a check that
// cannot fail is no check. A backward that misses a factor, a backward that writes one element past its declared
// scratch, a forward that writes past its planned workspace: each is reported, with what and where; the
// library's own modules and a dense model pass.
#include <catch2/catch.hpp>

#include <string>

#include "mom/mom.hpp"
#include "mom/testing.hpp"

using namespace mom;

namespace {

constexpr Dims tiny{.d_model = 8, .heads = 2, .d_ff = 12, .vocab = 11, .context = 20};

// The library's FFN with one wrong gradient: the output projection's bias gradient is doubled.
template <Dims D>
struct WrongBiasGrad : modules::FeedForward<D> {
  using Base = modules::FeedForward<D>;
  template <class Be, class T>
  static void backward(Be& be, const T* p, T* g, const T* ws, const typename Base::Saved& s, MatrixView<const T> x,
                       MatrixView<T> dx, MatrixView<const T> df, T* sc, index_t batch, index_t seq) {
    Base::backward(be, p, g, ws, s, x, dx, df, sc, batch, seq);
    for (index_t j = 0; j < Base::d; ++j) g[Base::o_b_proj + j] *= 2;
  }
};

// Writes one element past the scratch it declares.
template <Dims D>
struct ScratchOverrun : modules::FeedForward<D> {
  using Base = modules::FeedForward<D>;
  template <class Be, class T>
  static void backward(Be& be, const T* p, T* g, const T* ws, const typename Base::Saved& s, MatrixView<const T> x,
                       MatrixView<T> dx, MatrixView<const T> df, T* sc, index_t batch, index_t seq) {
    Base::backward(be, p, g, ws, s, x, dx, df, sc, batch, seq);
    sc[Base::scratch(batch, seq)] = T(0);
  }
};

// Keeps a statistic at an offset it never took from the arena: written past the planned workspace.
template <Dims D>
struct WorkspaceOverrun : modules::FeedForward<D> {
  using Base = modules::FeedForward<D>;
  struct Saved : Base::Saved {
    index_t stat = 0;
  };
  static constexpr Saved plan(Arena& a, index_t batch, index_t seq) {
    Saved s{Base::plan(a, batch, seq)};
    s.stat = a.used + 3;  // not a.take(1)
    return s;
  }
  template <class Be, class T>
  static void forward(Be& be, const T* p, T* ws, const Saved& s, MatrixView<const T> x, MatrixView<T> out, index_t batch,
                      index_t seq) {
    Base::forward(be, p, ws, s, x, out, batch, seq);
    ws[s.stat] = out.data[0];
  }
  template <class Be, class T>
  static void backward(Be& be, const T* p, T* g, const T* ws, const Saved& s, MatrixView<const T> x, MatrixView<T> dx,
                       MatrixView<const T> df, T* sc, index_t batch, index_t seq) {
    Base::backward(be, p, g, ws, s, x, dx, df, sc, batch, seq);
  }
};

// One dense layer whose FFN is Impl.
template <template <Dims> class Impl>
using OneLayer = Assembly<Router<Sequential>, ModuleSet<MHA<1>, FFN<1, Impl>>, K<1>, H<1>>;

}  // namespace

TEST_CASE("testing kit: the library's modules pass the module check", "[testing_kit]") {
  const auto ffn = testing::module_gradient_check<modules::FeedForward<tiny>>(1);
  INFO(ffn.summary());
  CHECK(ffn.ok());
  CHECK(ffn.checked == int(modules::FeedForward<tiny>::params) + 2 * 3 * 8);
  const auto attn = testing::module_gradient_check<modules::Attention<tiny>>(2, 2, 5);
  INFO(attn.summary());
  CHECK(attn.ok());
  CHECK(attn.checked == int(modules::Attention<tiny>::params) + 2 * 5 * 8);
}

TEST_CASE("testing kit: a wrong gradient is reported with the tensor and element", "[testing_kit]") {
  const auto r = testing::module_gradient_check<WrongBiasGrad<tiny>>(3);
  CHECK_FALSE(r.ok());
  CHECK(r.mismatch_count == 8);  // the 8 entries of mlp.b_proj, nothing else
  REQUIRE(!r.mismatches.empty());
  CHECK(r.mismatches[0].tensor == "mlp.b_proj");
  CHECK(r.mismatches[0].backward == Approx(2 * r.mismatches[0].finite_difference).epsilon(1e-6));
  CHECK_THAT(r.summary(), Catch::Contains("mlp.b_proj[0]: backward"));
  CHECK(r.workspace_overrun == 0);
  CHECK(r.scratch_overrun == 0);

  // The same module inside a model: the whole-model check names the layer's tensor.
  const auto m = testing::gradient_check<LM<tiny, OneLayer<WrongBiasGrad>>>(4);
  CHECK_FALSE(m.ok());
  CHECK(m.mismatch_count == 8);
  REQUIRE(!m.mismatches.empty());
  CHECK(m.mismatches[0].tensor == "h.0.mlp.b_proj");
  const auto good = testing::gradient_check<LM<tiny, OneLayer<modules::FeedForward>>>(4);
  INFO(good.summary());
  CHECK(good.ok());
  CHECK(good.checked == int(LM<tiny, OneLayer<modules::FeedForward>>::params));
}

TEST_CASE("testing kit: writes outside the declared scratch and workspace are reported", "[testing_kit]") {
  const auto s = testing::module_gradient_check<ScratchOverrun<tiny>>(5);
  CHECK_FALSE(s.ok());
  CHECK(s.scratch_overrun == 1);
  CHECK(s.workspace_overrun == 0);
  CHECK(s.mismatch_count == 0);  // its gradients are right
  CHECK_THAT(s.summary(), Catch::Contains("backward wrote 1 element(s) past the scratch() it declared"));

  const auto w = testing::module_gradient_check<WorkspaceOverrun<tiny>>(6);
  CHECK_FALSE(w.ok());
  CHECK(w.workspace_overrun == 4);
  CHECK_THAT(w.summary(), Catch::Contains("wrote 4 element(s) past the workspace plan() declared"));
}

TEST_CASE("testing kit: decode_check and the counting backend on a dense model", "[testing_kit]") {
  using Model = LM<tiny, Dense<2>>;
  const auto r = testing::decode_check<Model, double>();
  INFO(r.summary());
  CHECK(r.ok(1e-12));
  CHECK(r.rows == 4 + (20 - 5) + (9 - 1) + (17 - 17) + (1 - 1));  // prefill's last rows, then one per step

  auto m = Model::make<testing::CountingBackend<float>>(1);
  m.reserve(2, 16);
  const auto tokens = testing::random_tokens(32, tiny.vocab, 1), targets = testing::random_tokens(32, tiny.vocab, 2);
  m.forward(tokens, targets, 2, 16);
  CHECK(m.backend().flops == Model::forward_flops(2, 16));
  CHECK(m.backend().flops > 0);
}

TEST_CASE("testing kit: guarded buffers find writes just outside, in float and double", "[testing_kit]") {
  auto check = []<class T>(T) {
    testing::GuardedBuffer<T> b(10);
    b.get()[0] = T(1);
    b.get()[9] = T(-1);
    CHECK(b.overrun() == 0);
    b.get()[12] = T(0);
    CHECK(b.overrun() == 3);
    b.get()[-2] = T(0);
    CHECK(b.overrun() == -2);
  };
  check(float{});
  check(double{});
}

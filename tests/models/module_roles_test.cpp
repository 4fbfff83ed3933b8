// Misplaced modules are refused before anything trains: a module that declares its single_role is checked by
// MHA<N, Impl> / FFN<N, Impl> at compile time (tests/compile_fail/ffn_as_attention.cpp, attention_as_ffn.cpp);
// one that declares none and names its tensors like a neighbour's is refused by LM::make, not at the first save.
#include <catch2/catch.hpp>

#include <string>

#include "mom/mom.hpp"

using namespace mom;

namespace {
constexpr Dims tiny{.d_model = 8, .heads = 2, .d_ff = 12, .vocab = 11, .context = 6};

// GPT-2's feed-forward module as a user might copy it: without a single_role.
template <Dims D>
struct RolelessFfn : modules::FeedForward<D> {
  static constexpr int single_role = 0;  // hides the base's ModuleRole: declares none
};
static_assert(!DeclaresSingleRole<RolelessFfn<tiny>> && DeclaresSingleRole<modules::FeedForward<tiny>>);
using FfnAsAttention = Assembly<Router<Sequential>, ModuleSet<MHA<1, RolelessFfn>, FFN<1>>, K<1>, H<1>>;
}  // namespace

TEST_CASE("LM::make refuses a model whose modules name a tensor twice", "[contracts]") {
  using Bad = LM<tiny, FfnAsAttention>;
  CHECK_THROWS_WITH(Bad::make<cpu::Backend<float>>(1), Catch::Contains("mom::LM::make: two tensors of this model are named 'h.0.ln_2.b'"));
  CHECK(first_duplicate_name(LM<tiny, FfnAsAttention>::layout) == "h.0.ln_2.b");
  CHECK(first_duplicate_name(LM<tiny, Dense<2>>::layout).empty());
  using Good = LM<tiny, Dense<2>>;
  CHECK_NOTHROW(Good::make<cpu::Backend<float>>(1));
}

// Workspace guards (core/layout.hpp; on in the library's test builds, MOM_WORKSPACE_GUARD=16): every call of a
// module through mom::checked verifies the guard gaps after it, so a module that writes past what its plan()
// or scratch() reserves is reported by name at the call that did it, not as corrupted activations later.
namespace {
constexpr Dims guarded{.d_model = 16, .heads = 2, .d_ff = 32, .vocab = 11, .context = 8};

// Keeps a copy of its output, but reserves 16 elements less than the copy it writes.
template <Dims D>
struct LongForward : modules::FeedForward<D> {
  using Base = modules::FeedForward<D>;
  static constexpr ModuleRole single_role = ModuleRole::TokenMixer;
  struct Saved {
    typename Base::Saved base;
    index_t copy = 0;
  };
  static constexpr Saved plan(Arena& a, index_t batch, index_t seq) {
    Saved s{Base::plan(a, batch, seq)};
    s.copy = a.take(batch * seq * D.d_model - 16);
    return s;
  }
  template <class Be, class T>
  static void forward(Be& be, const T* p, T* ws, const Saved& s, MatrixView<const T> x, MatrixView<T> f_out,
                      index_t batch, index_t seq) {
    Base::forward(be, p, ws, s.base, x, f_out, batch, seq);
    be.copy(std::span<T>(ws + s.copy, std::size_t(x.rows * D.d_model)), std::span<const T>(f_out.flat()));
  }
  template <class Be, class T>
  static void backward(Be& be, const T* p, T* g, const T* ws, const Saved& s, MatrixView<const T> x, MatrixView<T> dx,
                       MatrixView<const T> df, T* scratch, index_t batch, index_t seq) {
    Base::backward(be, p, g, ws, s.base, x, dx, df, scratch, batch, seq);
  }
};

// Declares 16 elements less backward scratch than the feed-forward backward it runs uses.
template <Dims D>
struct ShortScratch : modules::FeedForward<D> {
  static constexpr index_t scratch(index_t batch, index_t seq) {
    return modules::FeedForward<D>::scratch(batch, seq) - 16;
  }
};

template <template <Dims> class Ffn>
using StackOf = Assembly<Router<Sequential>, ModuleSet<MHA<2>, FFN<2, Ffn>>, K<1>, H<2>>;

template <class Arch>
void run_step(ModelInstance<LM<guarded, Arch>, cpu::Backend<float>>& m) {
  const std::vector<token_t> tokens{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3, 4, 5, 6};
  m.reserve(2, 8);
  m.forward(tokens, tokens, 2, 8);
  m.backward();
}
}  // namespace

TEST_CASE("a module that writes past its workspace or its scratch is named at the call that did it", "[contracts]") {
  static_assert(workspace_guard == 16, "the test binaries build with MOM_WORKSPACE_GUARD=16 (tests/CMakeLists.txt)");
  auto good = LM<guarded, StackOf<modules::FeedForward>>::make<cpu::Backend<float>>(1);
  CHECK_NOTHROW(run_step(good));

  auto long_forward = LM<guarded, StackOf<LongForward>>::make<cpu::Backend<float>>(1);
  CHECK_THROWS_WITH(run_step(long_forward),
                    Catch::Contains("mom module") && Catch::Contains("LongForward<") &&
                        Catch::Contains("its forward wrote past its workspace"));

  auto short_scratch = LM<guarded, StackOf<ShortScratch>>::make<cpu::Backend<float>>(1);
  CHECK_THROWS_WITH(run_step(short_scratch),
                    Catch::Contains("mom module") && Catch::Contains("ShortScratch<") &&
                        Catch::Contains("its backward wrote past its declared scratch") &&
                        Catch::Contains("its scratch() is too small"));
}

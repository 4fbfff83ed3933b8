// The weights' bf16 copies under Precision::BF16 (backend/cuda/weight_copies.hpp; backend_concept.hpp,
// KeepsWeightCopies): inside a window a product's operand lying in the window's block is converted once and every
// later product reads that copy; the results are those of staging it every time, bit for bit; a new window converts
// again (the weights may have changed between windows); outside a window nothing is copied. The Trainer opens one
// around a step's micro-batches: its BF16 runs are those of a backend without the copies, bit for bit.
#include <catch2/catch.hpp>

#include <cstddef>
#include <span>
#include <vector>

#include "cuda/cuda_test_support.hpp"
#include "cuda/small_models.hpp"
#include "cuda/trainer_support.hpp"
#include "mom/backend/cuda.hpp"
#include "mom/train/train.hpp"
#include "ops/grad_check.hpp"

using namespace mom;
using namespace mom::test::small_models;

namespace {

using CM = MatrixView<const float>;
using M = MatrixView<float>;

// cuda::Backend<float> with the weight copies hidden: KeepsWeightCopies is false for it, so the Trainer's window does
// nothing and every product stages its weights as before.
struct NoWeightCopies : cuda::Backend<float> {
  using cuda::Backend<float>::Backend;
  void begin_weight_copies(std::span<const float>) const = delete;
  void end_weight_copies() const = delete;
};
static_assert(KeepsWeightCopies<cuda::Backend<float>, float> && !KeepsWeightCopies<NoWeightCopies, float>);
static_assert(mom::Backend<NoWeightCopies>);

long staging_copies() { return mom_emu_staging_copies ? mom_emu_staging_copies() : 0; }

// A linear (w, b) and a tied LM head (wh, vocab 70 laid out 72 wide: its products stage wh with zero rows to the
// padded width) in one parameter block; their inputs and gradients outside it.
struct Linears {
  static constexpr index_t n = 24, in = 32, out = 48, vocab = 70, vp = 72;
  cuda::Backend<float>& be;
  cuda::Buffer<float> block, x, dy, dlogits, y, dx, dw, db, logits, hdx, hdw;
  test::Rng rng{5};
  explicit Linears(cuda::Backend<float>& b)
      : be(b), block(be.alloc<float>(out * in + out + vocab * in)), x(upload(n * in)), dy(upload(n * out)),
        dlogits(upload(n * vp)), y(be.alloc<float>(n * out)), dx(be.alloc<float>(n * in)),
        dw(be.alloc<float>(out * in)), db(be.alloc<float>(out)), logits(be.alloc<float>(n * vp)),
        hdx(be.alloc<float>(n * in)), hdw(be.alloc<float>(vocab * in)) {
    set_weights();
  }
  cuda::Buffer<float> upload(index_t size) {
    auto buf = be.alloc<float>(size);
    be.from_host(buf.span(), std::span<const float>(test::random_vec<float>(std::size_t(size), rng, -1, 1)));
    return buf;
  }
  void set_weights() {  // new random weights, written outside any window
    be.from_host(block.span(), std::span<const float>(test::random_vec<float>(block.span().size(), rng, -1, 1)));
  }
  CM w() const { return {block.data(), out, in}; }
  std::span<const float> b() const { return {block.data() + out * in, std::size_t(out)}; }
  CM wh() const { return {block.data() + out * in + out, vocab, in}; }
  std::vector<float> fetch(const cuda::Buffer<float>& buf) const {
    std::vector<float> h(buf.span().size());
    be.to_host(std::span<float>(h), std::span<const float>(buf.span()));
    return h;
  }
  // The products: the linear forward and backward, the head forward and backward; every output, fetched.
  std::vector<std::vector<float>> pass() {
    for (auto* g : {&dx, &dw, &db, &hdx, &hdw}) be.zero(g->span());
    be.linear_forward(M(y.data(), n, out), CM(x.data(), n, in), w(), b());
    be.linear_backward(M(dx.data(), n, in), M(dw.data(), out, in), db.span(), CM(dy.data(), n, out),
                       CM(x.data(), n, in), w());
    be.lm_head_forward(M(logits.data(), n, vocab, vp), CM(x.data(), n, in), wh());
    be.lm_head_backward(M(hdx.data(), n, in), M(hdw.data(), vocab, in), CM(dlogits.data(), n, vocab, vp),
                        CM(x.data(), n, in), wh());
    return {fetch(y), fetch(dx), fetch(dw), fetch(db), fetch(logits), fetch(hdx), fetch(hdw)};
  }
};

// The products' bits, and what a pass converted: staging copies (emulation only; 0 elsewhere) and weight copies.
struct Pass {
  std::vector<std::vector<float>> out;
  long staged = 0;
  index_t converted = 0;
};
Pass run(Linears& l) {
  const long s0 = staging_copies();
  const index_t c0 = l.be.weight_copy_conversions();
  Pass p{l.pass()};
  p.staged = staging_copies() - s0;
  p.converted = l.be.weight_copy_conversions() - c0;
  return p;
}

void check_same_bits(const Pass& a, const Pass& b) {
  REQUIRE(a.out.size() == b.out.size());
  for (std::size_t i = 0; i < a.out.size(); ++i) {
    INFO("output " << i << " (y, dx, dw, db, logits, the head's dx, dw)");
    CHECK(a.out[i] == b.out[i]);
  }
}

// Trainer runs of three steps (2 micro-batches each) in BF16 on backend Be: the losses and the parameters.
template <class Model, class Be>
std::pair<std::vector<double>, std::vector<float>> train_bf16(const test::Data& data) {
  Be be;
  be.set_precision(cuda::Precision::BF16);
  train::TokenFile train_file(data.prep.train);
  ModelInstance<Model, Be> m(11, be);
  train::Trainer trainer(m, train_file, nullptr, test::config({}, 3));
  std::vector<double> losses;
  for (int s = 0; s < 3; ++s) losses.push_back(trainer.train_step());
  std::vector<float> p(m.params().size());
  be.to_host(std::span<float>(p), std::span<const float>(m.params()));
  return {losses, p};
}

}  // namespace

TEST_CASE("a weight window converts each weight once and reads its copy: the staged products' bits, new weights seen "
          "by the next window",
          "[cuda][bf16][weights]") {
  MOM_REQUIRE_GPU();
  cuda::Backend<float> be;
  be.set_precision(cuda::Precision::BF16);
  Linears l(be);
  const Pass staged = run(l);  // no window: every operand staged, as before
  CHECK(staged.converted == 0);
  Pass first, second;
  {
    const WeightCopyWindow<cuda::Backend<float>, float> window(be, std::span<const float>(l.block.span()));
    first = run(l);
    second = run(l);  // the same window: the copies as they are
  }
  check_same_bits(first, staged);
  check_same_bits(second, staged);
  CHECK(first.converted == 2);  // w, and wh in the head's padded shape (its forward's and backward's)
  CHECK(second.converted == 0);
  if (mom_emu_staging_copies) {
    // Without a window: x, w (forward); dy, w, x (backward); the head's x, wh and dlogits, wh, x.
    CHECK(staged.staged == 10);
    CHECK(first.staged == 8);  // each weight converted once, into its copy
    CHECK(second.staged == 6);
  }
  // After the window: staged again. New weights, then a new window: its products read them, not the old copies.
  CHECK(run(l).converted == 0);
  l.set_weights();
  const Pass new_staged = run(l);
  Pass new_window;
  {
    const WeightCopyWindow<cuda::Backend<float>, float> window(be, std::span<const float>(l.block.span()));
    new_window = run(l);
  }
  CHECK(new_window.converted == 2);
  CHECK(new_staged.out[0] != staged.out[0]);  // (the weights did change what the products give)
  check_same_bits(new_window, new_staged);
  // A window over part of the block: an operand reaching outside it is staged as before.
  {
    const WeightCopyWindow<cuda::Backend<float>, float> window(
        be, std::span<const float>(l.block.data(), std::size_t(Linears::out * Linears::in - 1)));
    const Pass part = run(l);
    CHECK(part.converted == 0);
    check_same_bits(part, new_staged);
  }
}

TEST_CASE("the Trainer's BF16 steps with the weight copies are those without them, bit for bit",
          "[cuda][bf16][weights][trainer]") {
  MOM_REQUIRE_GPU();
  const test::Data data;
  const auto dense = train_bf16<DenseSmall, cuda::Backend<float>>(data);
  const auto dense_staged = train_bf16<DenseSmall, NoWeightCopies>(data);
  CHECK(dense.first == dense_staged.first);
  CHECK(dense.second == dense_staged.second);
  const auto momp = train_bf16<MoMP, cuda::Backend<float>>(data);
  const auto momp_staged = train_bf16<MoMP, NoWeightCopies>(data);
  CHECK(momp.first == momp_staged.first);
  CHECK(momp.second == momp_staged.second);
}

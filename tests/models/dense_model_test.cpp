// The dense GPT end to end on the CPU backend: executed FLOPs equal the cost model,
// whole-model finite-difference gradients in double, overfitting one batch with AdamW,
// bit-identical reruns from the same seed.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <new>
#include <random>
#include <vector>

#include "models/random_tokens.hpp"
#include "models/routed_gradient_check.hpp"
#include "mom/mom.hpp"

using namespace mom;

// Every operator new of this test binary is counted, so a test can prove that a training
// step allocates nothing on the C++ heap (malloc inside BLAS/OpenMP is not seen). All the
// replaceable forms are replaced (plain, array, nothrow, aligned; every delete): each new
// counts and calls malloc/aligned_alloc, each delete calls free. Replacing only some would
// mix this hook's malloc/free with the runtime's own new/delete (the library's or
// AddressSanitizer's), which ASan reports as alloc-dealloc-mismatch.
static std::atomic<long> heap_allocations{0};
namespace {
void* counted_alloc(std::size_t n) noexcept {
  ++heap_allocations;
  return std::malloc(n ? n : 1);
}
void* counted_alloc(std::size_t n, std::align_val_t a) noexcept {
  ++heap_allocations;
  const std::size_t al = std::max(static_cast<std::size_t>(a), sizeof(void*));
  return std::aligned_alloc(al, (std::max<std::size_t>(n, 1) + al - 1) / al * al);
}
void* or_throw(void* p) {
  if (!p) throw std::bad_alloc();
  return p;
}
}  // namespace
void* operator new(std::size_t n) { return or_throw(counted_alloc(n)); }
void* operator new[](std::size_t n) { return or_throw(counted_alloc(n)); }
void* operator new(std::size_t n, std::align_val_t a) { return or_throw(counted_alloc(n, a)); }
void* operator new[](std::size_t n, std::align_val_t a) { return or_throw(counted_alloc(n, a)); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return counted_alloc(n); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return counted_alloc(n); }
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept { return counted_alloc(n, a); }
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept { return counted_alloc(n, a); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }

namespace {

// Forwards every op to cpu::Backend<T> and tallies the FLOPs actually executed (counted per position,
// independently of the testing kit's closed forms, mom/testing/counting_backend.hpp): 2*m*n*k for
// every matrix product, and for attention the causal dot products (query t against keys
// 0..t: QK^T and PV, 2*hd*(t+1) FLOPs each, per head and sequence).
template <class T>
struct CountingBackend : cpu::Backend<T> {
  using Base = cpu::Backend<T>;
  using typename Base::CM;
  using typename Base::CS;
  using typename Base::M;
  using typename Base::S;
  index_t flops = 0;
  index_t matmul_calls = 0;

  void linear_forward(M y, CM x, CM w, CS b) {
    flops += 2 * x.rows * x.cols * w.rows;
    ++matmul_calls;
    Base::linear_forward(y, x, w, b);
  }
  void gemm(M C, CM A, typename Base::Trans ta, CM B, typename Base::Trans tb, T alpha = T(1), T beta = T(0)) {
    const index_t k = ta == Base::Trans::N ? A.cols : A.rows;
    flops += 2 * C.rows * C.cols * k;
    ++matmul_calls;
    Base::gemm(C, A, ta, B, tb, alpha, beta);
  }
  void linear_backward(M dx, M dw, S db, CM dy, CM x, CM w, Store dx_store = Store::add) {
    const index_t products = (dx.empty() ? 0 : 1) + (dw.empty() ? 0 : 1);
    flops += products * 2 * x.rows * x.cols * w.rows;
    matmul_calls += products;
    Base::linear_backward(dx, dw, db, dy, x, w, dx_store);
  }
  // Backward recomputes QK^T, then dP = dO V^T, dV = P^T dO, dQ = dS K, dK = dS^T Q.
  void attention_backward(M dqkv, CM dout, CM out, CS lse, CM qkv, index_t batch, index_t seq, index_t heads) {
    const index_t hd = qkv.cols / 3 / heads;
    for (index_t b = 0; b < batch; ++b)
      for (index_t h = 0; h < heads; ++h)
        for (index_t t = 0; t < seq; ++t) flops += 5 * (2 * hd * (t + 1));
    Base::attention_backward(dqkv, dout, out, lse, qkv, batch, seq, heads);
  }
  void attention_forward(M out, S lse, CM qkv, index_t batch, index_t seq, index_t heads) {
    const index_t hd = qkv.cols / 3 / heads;
    for (index_t b = 0; b < batch; ++b)
      for (index_t h = 0; h < heads; ++h)
        for (index_t t = 0; t < seq; ++t) flops += 2 * (2 * hd * (t + 1));
    Base::attention_forward(out, lse, qkv, batch, seq, heads);
  }
};

using test::random_tokens;

// One AdamW step over the flat buffers.
template <class Instance, class T>
void adamw(Instance& m, std::vector<T>& mom1, std::vector<T>& mom2, double lr, std::int64_t step) {
  cpu::AdamWConfig cfg{.lr = lr, .weight_decay = 0.0};
  m.backend().adamw_step(m.params(), std::span<const T>(m.grads()), std::span<T>(mom1), std::span<T>(mom2), cfg, step);
}

}  // namespace

TEST_CASE("FLOPs executed by forward and backward equal the cost model", "[model]") {
  constexpr Dims dims{.d_model = 32, .heads = 4, .d_ff = 96, .vocab = 50, .context = 16};
  using Model = LM<dims, Chunked<Layer, Dense<2>>>;
  auto m = Model::make<CountingBackend<float>>(7);
  for (auto [batch, seq] : {std::pair<index_t, index_t>{2, 16}, {3, 7}, {1, 1}}) {
    m.reserve(batch, seq);
    const auto tokens = random_tokens(batch * seq, dims.vocab, 1);
    m.backend().flops = 0;
    m.backend().matmul_calls = 0;
    m.forward(tokens, tokens, batch, seq);
    INFO("batch " << batch << " seq " << seq);
    CHECK(m.backend().flops == Model::forward_flops(batch, seq));
    CHECK(m.backend().matmul_calls == 3 * 4 + 1);  // qkv, proj, fc, proj per layer + head
    m.backward();
    CHECK(m.backend().flops == Model::training_flops(batch, seq));
    CHECK(m.backend().matmul_calls == 3 * (3 * 4 + 1));  // dx and dW of each
  }
}

TEST_CASE("whole-model gradient equals central finite differences (double)", "[model][gradcheck]") {
  constexpr Dims dims{.d_model = 8, .heads = 2, .d_ff = 12, .vocab = 11, .context = 6};
  using Model = LM<dims, Chunked<Layer, Dense<2>>>;  // exercises the chunk boundary too
  auto m = Model::make<cpu::Backend<double>>(3);
  // Replace the GPT-2 init (tiny values, nearly uniform outputs) by O(1) parameters so that
  // every path of the graph contributes visibly to the loss.
  std::mt19937_64 rng(11);
  std::normal_distribution<double> normal(0.0, 0.35);
  for (auto& p : m.params()) p = normal(rng);
  const index_t batch = 2, seq = 5;
  m.reserve(batch, seq);
  const auto tokens = random_tokens(batch * seq, dims.vocab, 5);
  auto targets = random_tokens(batch * seq, dims.vocab, 6);
  targets[3] = -1;  // ignored position

  m.zero_grad();
  const double loss = m.forward(tokens, targets, batch, seq);
  m.backward();
  const std::vector<double> grad(m.grads().begin(), m.grads().end());
  CHECK(std::isfinite(loss));

  double max_err = 0, max_grad = 0;
  test::check_central_differences(
      m, grad, 1e-5, [&](const auto&) { return m.forward(tokens, targets, batch, seq); }, test::no_routing,
      [&](const auto&, double fd, double g) {
        max_err = std::max(max_err, std::abs(fd - g));
        max_grad = std::max(max_grad, std::abs(g));
      });
  INFO("max |fd - grad| " << max_err << ", max |grad| " << max_grad);
  CHECK(max_err < 1e-8);
  CHECK(max_grad > 1e-2);  // the check is not vacuous
  // wpe rows beyond seq get no gradient; wte rows of unused tokens only through the tied head.
  const auto wpe = Model::find("wpe");
  CHECK(grad[static_cast<std::size_t>(wpe.offset + seq * dims.d_model)] == 0.0);
}

TEST_CASE("a training step allocates nothing, the workspace is the cost model's size", "[model]") {
  constexpr Dims dims{.d_model = 32, .heads = 4, .d_ff = 64, .vocab = 40, .context = 16};
  using Model = LM<dims, Chunked<Layer, Dense<2>>>;
  auto m = Model::make<cpu::Backend<float>>(3);
  const long before_reserve = heap_allocations;
  m.reserve(4, 16);
  CHECK(heap_allocations > before_reserve);  // the counter sees Buffer allocations
  CHECK(m.workspace_size() == Model::activation_elements(4, 16));
  const auto tokens = random_tokens(64, dims.vocab, 4);
  long before = 0;
  // Step 0 is the warm-up: some ops keep per-thread scratch that grows once to the largest
  // shape seen (attention, layernorm backward); after that nothing may allocate.
  for (int step = 0; step < 3; ++step) {
    if (step == 1) before = heap_allocations;
    m.zero_grad();
    m.forward(tokens, tokens, 4, 16);
    m.backward();
    m.forward(std::span(tokens).first(24), {}, 2, 12);  // smaller shapes reuse the workspace
  }
  CHECK(heap_allocations == before);
}

TEST_CASE("a chunking of layers computes exactly what the dense stack computes", "[model]") {
  constexpr Dims dims{.d_model = 32, .heads = 4, .d_ff = 64, .vocab = 40, .context = 16};
  using Dense4 = LM<dims, Dense<4>>;
  using Chunks = LM<dims, Chunked<Layer, Dense<2>, Layer>>;
  static_assert(Dense4::params == Chunks::params);
  auto a = Dense4::make<cpu::Backend<double>>(8);
  auto b = Chunks::make<cpu::Backend<double>>(8);
  a.reserve(2, 16);
  b.reserve(2, 16);
  const auto tokens = random_tokens(32, dims.vocab, 9);
  REQUIRE(std::equal(a.params().begin(), a.params().end(), b.params().begin()));  // same layout, same init
  CHECK(a.forward(tokens, tokens, 2, 16) == b.forward(tokens, tokens, 2, 16));
  a.backward();
  b.backward();
  CHECK(std::equal(a.grads().begin(), a.grads().end(), b.grads().begin()));
}

TEST_CASE("backward accumulates: two backwards give twice the gradient", "[model]") {
  constexpr Dims dims{.d_model = 16, .heads = 2, .d_ff = 32, .vocab = 20, .context = 8};
  using Model = LM<dims, Dense<2>>;
  auto m = Model::make<cpu::Backend<double>>(9);
  m.reserve(2, 8);
  const auto tokens = random_tokens(16, dims.vocab, 2);
  m.forward(tokens, tokens, 2, 8);
  m.backward();
  const std::vector<double> once(m.grads().begin(), m.grads().end());
  m.forward(tokens, tokens, 2, 8);
  m.backward();
  for (std::size_t i = 0; i < once.size(); i += 97) CHECK(m.grads()[i] == Approx(2 * once[i]).margin(1e-15));
  m.zero_grad();
  for (double g : m.grads()) REQUIRE(g == 0.0);
  CHECK_THROWS_WITH(m.backward(), Catch::Contains("backward"));
}

TEST_CASE("GPT-2 initialisation", "[model]") {
  constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 300, .context = 64};
  using Model = LM<dims, Dense<4>>;
  auto m = Model::make<cpu::Backend<float>>(1);
  auto stddev = [&](std::string_view name) {
    const auto info = Model::find(name);
    double s = 0;
    for (index_t i = 0; i < info.size(); ++i) s += double(m.params()[std::size_t(info.offset + i)]) * m.params()[std::size_t(info.offset + i)];
    return std::sqrt(s / double(info.size()));
  };
  CHECK(stddev("wte") == Approx(0.02).epsilon(0.02));
  CHECK(stddev("h.1.attn.w_qkv") == Approx(0.02).epsilon(0.03));
  CHECK(stddev("h.2.mlp.w_proj") == Approx(0.02 / std::sqrt(8.0)).epsilon(0.03));
  CHECK(stddev("h.3.attn.w_proj") == Approx(0.02 / std::sqrt(8.0)).epsilon(0.05));
  CHECK(stddev("h.0.attn.b_qkv") == 0.0);
  CHECK(m.param(Model::find("h.3.ln_2.w"))(0, 17) == 1.0f);
  CHECK(m.param(Model::find("ln_f.b"))(0, 5) == 0.0f);
  for (float g : m.grads()) REQUIRE(g == 0.0f);
}

TEST_CASE("overfitting one batch with AdamW drives the loss below 0.1 nats", "[model][train]") {
  constexpr Dims dims{.d_model = 32, .heads = 4, .d_ff = 128, .vocab = 32, .context = 16};
  using Model = LM<dims, Dense<2>>;
  auto m = Model::make<cpu::Backend<float>>(42);
  const index_t batch = 4, seq = 16;
  m.reserve(batch, seq);
  const auto tokens = random_tokens(batch * seq, dims.vocab, 100);
  const auto targets = random_tokens(batch * seq, dims.vocab, 101);
  std::vector<float> m1(std::size_t(Model::params)), m2(std::size_t(Model::params));
  float first = 0, loss = 0;
  int step = 1;
  for (; step <= 400; ++step) {
    m.zero_grad();
    loss = m.forward(tokens, targets, batch, seq);
    if (step == 1) first = loss;
    if (loss < 0.1f) break;
    m.backward();
    adamw(m, m1, m2, 1e-2, step);
  }
  INFO("first loss " << first << ", loss " << loss << " after " << step << " steps");
  CHECK(first == Approx(std::log(32.0)).epsilon(0.05));  // uniform prediction at init
  CHECK(loss < 0.1f);
}

TEST_CASE("the same seed gives bit-identical losses", "[model][train]") {
  constexpr Dims dims{.d_model = 32, .heads = 4, .d_ff = 64, .vocab = 40, .context = 16};
  using Model = LM<dims, Chunked<Layer, Layer>>;
  auto run = [&](std::uint64_t seed) {
    auto m = Model::make<cpu::Backend<float>>(seed);
    m.reserve(3, 16);
    std::vector<float> m1(std::size_t(Model::params)), m2(std::size_t(Model::params));
    std::vector<float> losses;
    for (int step = 1; step <= 5; ++step) {
      const auto tokens = random_tokens(48, dims.vocab, std::uint64_t(step));
      m.zero_grad();
      losses.push_back(m.forward(tokens, tokens, 3, 16));
      m.backward();
      adamw(m, m1, m2, 3e-3, step);
    }
    return losses;
  };
  const auto a = run(5), b = run(5), c = run(6);
  REQUIRE(a.size() == 5);
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i] == b[i]);  // bitwise, not approximately
  CHECK(a[0] != c[0]);
}

TEST_CASE("runtime errors name the problem", "[model]") {
  constexpr Dims dims{.d_model = 16, .heads = 2, .d_ff = 32, .vocab = 20, .context = 8};
  using Model = LM<dims, Dense<1>>;
  auto m = Model::make<cpu::Backend<float>>(1);
  const auto tokens = random_tokens(16, dims.vocab, 2);
  CHECK_THROWS_WITH(m.forward(tokens, {}, 2, 8), Catch::Contains("reserve"));
  CHECK_THROWS_WITH(m.reserve(1, 9), Catch::Contains("context"));
  m.reserve(2, 8);
  CHECK_THROWS_WITH(m.forward(tokens, {}, 4, 8), Catch::Contains("reserved"));
  CHECK_THROWS_WITH(m.forward(std::span(tokens).first(15), {}, 2, 8), Catch::Contains("tokens"));
  CHECK(m.forward(tokens, {}, 2, 8) == 0.0f);  // no targets: logits only
  CHECK(m.logits().rows == 16);
  CHECK(m.logits().cols == 20);
  CHECK_THROWS_WITH(m.backward(), Catch::Contains("targets"));
  // Smaller batches and sequences than reserved are fine.
  CHECK(m.forward(std::span(tokens).first(5), std::span(tokens).first(5), 1, 5) > 0.0f);
}

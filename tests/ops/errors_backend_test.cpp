// Checked errors (every kind: shape mismatch, out-of-range index, bad configuration) and the
// Backend<T> object (aligned RAII buffers, memory helpers, forwarding to the ops).
#include <catch2/catch.hpp>

#include <cstdint>

#include <mom/backend/cpu.hpp>

#include "ops/grad_check.hpp"

using namespace mom;
using namespace mom::test;
using Catch::Contains;

TEST_CASE("checked errors: shape mismatches name the op and the shapes", "[ops][errors]") {
  std::vector<float> a(64), b(64), c(64);
  SECTION("linear") {
    REQUIRE_THROWS_AS(cpu::linear_forward<float>(mat(a, 4, 5), cmat(b, 4, 3), cmat(c, 5, 2), {}), Error);
    REQUIRE_THROWS_WITH(cpu::linear_forward<float>(mat(a, 4, 5), cmat(b, 4, 3), cmat(c, 5, 2), {}),
                        Contains("linear_forward: x [4x3] and w [5x2] disagree on in_features"));
    REQUIRE_THROWS_WITH(cpu::linear_forward<float>(mat(a, 4, 6), cmat(b, 4, 3), cmat(c, 5, 3), {}),
                        Contains("linear_forward: y [4x6] must be [4x5]"));
    REQUIRE_THROWS_WITH(cpu::linear_forward<float>(mat(a, 4, 5), cmat(b, 4, 3), cmat(c, 5, 3), std::span(c).first(4)),
                        Contains("linear_forward: bias has 4 elements"));
    REQUIRE_THROWS_WITH(cpu::linear_backward<float>(mat(a, 4, 2), mat(b, 5, 3), {}, cmat(c, 4, 5), cmat(c, 4, 3),
                                                    cmat(c, 5, 3)),
                        Contains("linear_backward: dx [4x2] must match x [4x3]"));
    // dy read through a row list (a routed expert's weight · dout[token]) has no stored rows to sum for a bias.
    const std::vector<token_t> rows{0, 2, 1, 1};
    REQUIRE_THROWS_WITH(cpu::linear_backward<float>({}, mat(b, 5, 3), std::span(c).first(5),
                                                    ScaledRows<float>{cmat(c, 3, 5), rows, {}},
                                                    ScaledRows<float>{cmat(a, 4, 3), {}, {}}, cmat(c, 5, 3)),
                        Contains("linear_backward: a bias gradient needs dy stored, not read through rows"));
    REQUIRE_THROWS_WITH(cpu::linear_backward<float>({}, mat(b, 5, 3), {}, ScaledRows<float>{cmat(c, 3, 5), rows, {}},
                                                    ScaledRows<float>{cmat(a, 4, 3), {}, std::span<const float>(c).first(4)},
                                                    cmat(c, 5, 3)),
                        Contains("linear_backward: x's rows carry no scale"));
  }
  SECTION("embedding") {
    REQUIRE_THROWS_WITH(cpu::embedding_forward<float>(mat(a, 6, 4), std::vector<token_t>(6, 0), cmat(b, 8, 4),
                                                      cmat(c, 8, 4), 4),
                        Contains("embedding_forward: seq = 4 does not divide the 6 rows"));
    REQUIRE_THROWS_WITH(cpu::embedding_forward<float>(mat(a, 6, 4), std::vector<token_t>(6, 0), cmat(b, 8, 4),
                                                      cmat(c, 2, 4), 3),
                        Contains("embedding_forward: seq = 3 exceeds the context 2 of wpe [2x4]"));
    REQUIRE_THROWS_WITH(cpu::embedding_forward<float>(mat(a, 6, 4), std::vector<token_t>(5, 0), cmat(b, 8, 4),
                                                      cmat(c, 8, 4), 3),
                        Contains("embedding_forward: 5 tokens for [6x4] rows"));
    // Rows at positions of their own.
    const std::vector<index_t> pos{0, 1, 2, 3, 1, 7};
    REQUIRE_THROWS_WITH(cpu::embedding_forward<float>(mat(a, 6, 4), std::vector<token_t>(6, 0), cmat(b, 8, 4),
                                                      cmat(c, 7, 4), std::span<const index_t>(pos)),
                        Contains("embedding_forward: position 7 of row 5 is out of range for wpe [7x4]"));
    REQUIRE_THROWS_WITH(cpu::embedding_forward<float>(mat(a, 6, 4), std::vector<token_t>(6, 0), cmat(b, 8, 4),
                                                      cmat(c, 8, 4), std::span<const index_t>(pos).first(5)),
                        Contains("embedding_forward: 5 positions for [6x4] rows"));
  }
  SECTION("layernorm") {
    std::vector<float> m(4), r(4), g(5);
    REQUIRE_THROWS_WITH(cpu::layernorm_forward<float>(mat(a, 4, 6), m, r, cmat(b, 4, 6), g, g),
                        Contains("layernorm_forward: gamma/beta have 5/5 elements for x [4x6]"));
    REQUIRE_THROWS_WITH(cpu::layernorm_backward<float>(mat(a, 4, 5), g, g, cmat(b, 3, 5), cmat(c, 4, 5), m, r, g),
                        Contains("layernorm_backward: dout [3x5] must match x [4x5]"));
  }
  SECTION("activations") {
    REQUIRE_THROWS_WITH(cpu::gelu_forward<float>(std::span(a).first(3), std::span(b).first(4)),
                        Contains("gelu_forward: out has 3 elements, x has 4"));
    REQUIRE_THROWS_WITH(cpu::relu_backward<float>(std::span(a).first(3), std::span(b).first(3), std::span(c).first(2)),
                        Contains("relu_backward: dx/x/dout have 3/3/2 elements"));
  }
  SECTION("cross entropy") {
    std::vector<float> loss(1), lse(3);
    REQUIRE_THROWS_WITH(cpu::cross_entropy_forward<float>(loss, lse, cmat(a, 4, 8), std::vector<token_t>(4, 0)),
                        Contains("cross_entropy_forward: logits [4x8] with 3 lse and 4 targets"));
  }
  SECTION("attention") {
    std::vector<float> qkv(4 * 18), out(4 * 6), lse(16);
    REQUIRE_THROWS_WITH(cpu::attention_forward<float>(mat(out, 4, 6), std::span(lse).first(4 * 4), cmat(qkv, 4, 18), 1,
                                                      4, 4),
                        Contains("attention_forward: d = 6 (qkv [4x18]) is not divisible by heads = 4"));
    REQUIRE_THROWS_WITH(cpu::attention_forward<float>(mat(out, 4, 6), std::span(lse).first(4), cmat(qkv, 4, 18), 2, 3,
                                                      1),
                        Contains("attention_forward: qkv [4x18] must have batch*seq = 2*3 rows"));
    REQUIRE_THROWS_WITH(cpu::attention_forward<float>(mat(out, 4, 5), std::span(lse).first(8), cmat(qkv, 4, 18), 1, 4,
                                                      2),
                        Contains("attention_forward: out [4x5] must be [4x6]"));
    REQUIRE_THROWS_WITH(cpu::attention_forward<float>(mat(out, 4, 4), std::span(lse).first(4), cmat(qkv, 4, 16), 1, 4,
                                                      1),
                        Contains("attention_forward: qkv [4x16] must have 3*d columns"));
  }
  SECTION("dispatch") {
    REQUIRE_THROWS_WITH(cpu::scatter_add_rows<float>(mat(a, 4, 3), cmat(b, 2, 3), std::vector<token_t>{0, 1},
                                                     std::vector<float>(3)),
                        Contains("scatter_add_rows: 3 weights for in [2x3]"));
    REQUIRE_THROWS_WITH(cpu::gather_rows<float>(mat(a, 2, 3), cmat(b, 4, 4), std::vector<token_t>{0, 1}),
                        Contains("gather_rows: out [2x3], in [4x4], 2 indices"));
  }
  SECTION("top-k and softmax") {
    std::vector<token_t> ind(64);
    REQUIRE_THROWS_WITH(cpu::topk_rows<float>(mat(a, 2, 5), mat(ind, 2, 5), cmat(b, 2, 4)),
                        Contains("topk_rows: k = 5 (values [2x5]) must be in [1, 4] for x [2x4]"));
    REQUIRE_THROWS_WITH(cpu::softmax_rows<float>(mat(a, 2, 5), cmat(b, 2, 4)),
                        Contains("softmax_rows: y [2x5] must match x [2x4]"));
  }
  SECTION("gru") {
    const index_t n = 2, I = 3, H = 4;
    std::vector<float> big(512);
    REQUIRE_THROWS_WITH(cpu::gru_cell_forward<float>(mat(a, n, H), mat(big, n, 6 * H), cmat(b, n, I + 1), cmat(c, n, H),
                                                     cmat(big, 3 * H, I), cmat(big, 3 * H, H),
                                                     std::span<const float>(big).first(3 * H),
                                                     std::span<const float>(big).first(3 * H)),
                        Contains("gru_cell_forward: x [2x4] and w_ih [12x3] disagree on input size"));
    REQUIRE_THROWS_WITH(cpu::gru_cell_forward<float>(mat(a, n, H), mat(big, n, 6 * H), cmat(b, n, I), cmat(c, n, H),
                                                     cmat(big, 3 * H, I), cmat(big, 3 * H, H),
                                                     std::span<const float>(big).first(3 * H),
                                                     std::span<const float>(big).first(H)),
                        Contains("gru_cell_forward: b_ih / b_hh have 12 / 4 elements, expected 3H = 12"));
  }
  SECTION("optimizer") {
    std::vector<float> p(4), g(3), m(4), v(4);
    REQUIRE_THROWS_WITH(cpu::adamw_step<float>(p, g, m, v, {}, 1), Contains("adamw_step: params/grads/m/v have 4/3/4/4"));
    std::vector<float> g4(4);
    REQUIRE_THROWS_WITH(cpu::adamw_step<float>(p, g4, m, v, {}, 0), Contains("adamw_step: step = 0 must be >= 1"));
  }
}

TEST_CASE("checked errors: out-of-range indices name the op, the index and the shape", "[ops][errors]") {
  std::vector<float> a(64), b(64), c(64);
  SECTION("token id >= vocab in the embedding") {
    REQUIRE_THROWS_WITH(cpu::embedding_forward<float>(mat(a, 4, 2), std::vector<token_t>{0, 1, 9, 2}, cmat(b, 9, 2),
                                                      cmat(c, 4, 2), 4),
                        Contains("embedding_forward: token id 9 at position 2 is out of range for wte [9x2]"));
    REQUIRE_THROWS_WITH(cpu::embedding_backward<float>(mat(a, 9, 2), mat(b, 4, 2), cmat(c, 4, 2),
                                                       std::vector<token_t>{0, -3, 1, 2}, 4),
                        Contains("embedding_backward: token id -3 at position 1"));
  }
  SECTION("cross-entropy target >= vocab (and not the ignore index)") {
    std::vector<float> loss(1), lse(2);
    REQUIRE_THROWS_WITH(cpu::cross_entropy_forward<float>(loss, lse, cmat(a, 2, 8), std::vector<token_t>{8, 0}),
                        Contains("cross_entropy_forward: target 8 at row 0 is out of range for vocab 8"));
    REQUIRE_THROWS_WITH(cpu::cross_entropy_backward<float>(mat(a, 2, 8), cmat(a, 2, 8), lse,
                                                           std::vector<token_t>{0, -2}, 1.f),
                        Contains("cross_entropy_backward: target -2 at row 1"));
  }
  SECTION("gather / scatter index outside [0, T)") {
    REQUIRE_THROWS_WITH(cpu::gather_rows<float>(mat(a, 2, 3), cmat(b, 4, 3), std::vector<token_t>{1, 4}),
                        Contains("gather_rows: idx[1] = 4 is out of range [0, 4) for [4x3]"));
    REQUIRE_THROWS_WITH(cpu::scatter_add_rows<float>(mat(a, 4, 3), cmat(b, 2, 3), std::vector<token_t>{-1, 0}, {}),
                        Contains("scatter_add_rows: idx[0] = -1 is out of range [0, 4)"));
    REQUIRE_THROWS_WITH(cpu::scatter_add_rows_backward<float>(mat(a, 2, 3), {}, cmat(b, 4, 3), cmat(c, 2, 3),
                                                              std::vector<token_t>{0, 7}, {}),
                        Contains("scatter_add_rows_backward: idx[1] = 7 is out of range [0, 4)"));
  }
  SECTION("top-k backward index outside the row") {
    std::vector<token_t> ind{0, 5};
    REQUIRE_THROWS_WITH(cpu::topk_rows_backward<float>(mat(a, 1, 5), cmat(b, 1, 2), cmat(ind, 1, 2)),
                        Contains("topk_rows_backward: indices(0,1) = 5 is out of range for dx [1x5]"));
  }
  SECTION("nothing was written before the check fired") {
    std::vector<float> out(8, 3.f);
    REQUIRE_THROWS(cpu::gather_rows<float>(mat(out, 2, 4), cmat(b, 4, 4), std::vector<token_t>{0, 9}));
    CHECK(out == std::vector<float>(8, 3.f));
  }
}

TEST_CASE("Backend: aligned RAII buffers and memory helpers", "[ops][backend]") {
  cpu::Backend<float> be;
  static_assert(std::is_same_v<decltype(be)::scalar, float>);
  auto buf = be.alloc(1000);
  REQUIRE(buf.size() == 1000);
  CHECK(reinterpret_cast<std::uintptr_t>(buf.data()) % 64 == 0);
  CHECK(std::all_of(buf.begin(), buf.end(), [](float x) { return x == 0.f; }));  // zero-initialised
  be.fill(buf.span(), 2.5f);
  CHECK(buf[999] == 2.5f);
  auto other = be.alloc(1000);
  be.copy(other.span(), buf.span());
  CHECK(other[0] == 2.5f);
  be.zero(buf.span());
  CHECK(buf[500] == 0.f);
  float* p = other.data();
  auto moved = std::move(other);
  CHECK(moved.data() == p);
  CHECK(other.data() == nullptr);
  CHECK(other.size() == 0);
  auto ids = be.alloc<token_t>(5);
  CHECK(reinterpret_cast<std::uintptr_t>(ids.data()) % 64 == 0);
  CHECK(ids.size() == 5);
  REQUIRE_THROWS_WITH(buf.view(40, 30), Contains("Buffer::view: [40x30] exceeds 1000 elements"));
  REQUIRE_THROWS_WITH(be.copy(buf.span(), ids.size() == 5 ? std::span<const float>(p, 3) : std::span<const float>()),
                      Contains("copy: dst has 1000 elements, src has 3"));
  // A strided view is zeroed row by row, leaving the columns outside it alone.
  be.fill(moved.span(), 1.f);
  be.zero(MatrixView<float>(moved.data(), 4, 3, 10));
  CHECK(moved[0] == 0.f);
  CHECK(moved[2] == 0.f);
  CHECK(moved[3] == 1.f);
  CHECK(moved[32] == 0.f);
  CHECK(moved[40] == 1.f);
}

TEST_CASE("Backend: members forward to the ops (linear, gemm, layernorm, CE through the object)", "[ops][backend]") {
  using B = cpu::Backend<double>;
  B be;
  Rng rng(70);
  const index_t n = 3, in = 4, out = 2;
  auto x = be.alloc(n * in), w = be.alloc(out * in), bias = be.alloc(out), y = be.alloc(n * out), y2 = be.alloc(n * out);
  for (auto& v : x) v = rng.uniform();
  for (auto& v : w) v = rng.uniform();
  for (auto& v : bias) v = rng.uniform();
  be.linear_forward(y.view(n, out), x.view(n, in), w.view(out, in), bias.span());
  be.gemm(y2.view(n, out), x.view(n, in), B::Trans::N, w.view(out, in), B::Trans::T);
  for (index_t i = 0; i < n; ++i)
    for (index_t o = 0; o < out; ++o) CHECK(y[i * out + o] == Approx(y2[i * out + o] + bias[o]).epsilon(1e-14));

  auto logits = be.alloc(2 * 3), lse = be.alloc(2), loss = be.alloc(1);
  const std::vector<token_t> targets{2, 0};
  be.cross_entropy_forward(loss.span(), lse.span(), logits.view(2, 3), targets);
  CHECK(be.read(loss.data()) == Approx(std::log(3.0)));
  double norm = 0;
  be.fill(logits.span(), 2.0);
  be.grad_norm(logits.span(), &norm);
  CHECK(norm == Approx(std::sqrt(24.0)));
}

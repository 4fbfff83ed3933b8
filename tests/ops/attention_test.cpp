// Causal multi-head attention: finite-difference gradients (double), float vs naive loops,
// causality, and independence of the sequences of a batch.
#include <catch2/catch.hpp>

#include <cmath>

#include <mom/backend/cpu.hpp>

#include "ops/grad_check.hpp"

using namespace mom;
using namespace mom::test;

namespace {
// Naive causal attention in double: out[b*S+i, h*hd+c] = Σ_{j<=i} softmax_j(q_i·k_j / sqrt(hd)) v_j[c].
template <class T>
std::vector<double> naive_attention(const std::vector<T>& qkv, index_t B, index_t S, index_t heads, index_t d,
                                    std::vector<double>* lse_out = nullptr) {
  const index_t hd = d / heads;
  std::vector<double> out(B * S * d, 0.0);
  auto at = [&](index_t row, index_t col) { return double(qkv[row * 3 * d + col]); };
  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < heads; ++h)
      for (index_t i = 0; i < S; ++i) {
        std::vector<double> s(i + 1);
        double m = -1e300;
        for (index_t j = 0; j <= i; ++j) {
          double acc = 0;
          for (index_t c = 0; c < hd; ++c) acc += at(b * S + i, h * hd + c) * at(b * S + j, d + h * hd + c);
          s[j] = acc / std::sqrt(double(hd));
          m = std::max(m, s[j]);
        }
        double sum = 0;
        for (auto& v : s) sum += (v = std::exp(v - m));
        if (lse_out) lse_out->push_back(m + std::log(sum));
        for (index_t j = 0; j <= i; ++j)
          for (index_t c = 0; c < hd; ++c) out[(b * S + i) * d + h * hd + c] += s[j] / sum * at(b * S + j, 2 * d + h * hd + c);
      }
  return out;
}
}  // namespace

TEST_CASE("attention: gradient matches finite differences (double)", "[ops][attention]") {
  Rng rng(30);
  const index_t S = GENERATE(5, 69);  // one query block, and two (kAttentionBlock = 64) with a partial one
  const index_t B = 2, heads = 2, d = 6;
  auto qkv = random_vec(B * S * 3 * d, rng, -1.5, 1.5);
  const auto proj = random_vec(B * S * d, rng);
  std::vector<double> out(B * S * d), lse(B * heads * S);
  auto loss = [&] {
    cpu::attention_forward<double>(mat(out, B * S, d), lse, cmat(qkv, B * S, 3 * d), B, S, heads);
    return dot(proj, out);
  };
  loss();
  std::vector<double> dqkv(B * S * 3 * d, 0.5);
  cpu::attention_backward<double>(mat(dqkv, B * S, 3 * d), cmat(proj, B * S, d), cmat(out, B * S, d), lse,
                                  cmat(qkv, B * S, 3 * d), B, S, heads);
  for (auto& g : dqkv) g -= 0.5;  // accumulated onto 0.5
  CHECK(rel_error(dqkv, numeric_grad(qkv, loss)) < fd_tol);
}

TEST_CASE("attention: float forward and lse match naive loops (parallel size)", "[ops][attention]") {
  Rng rng(31);
  const index_t B = 2, S = 70, heads = 4, d = 64;
  auto qkv = random_vec<float>(B * S * 3 * d, rng, -2, 2);
  std::vector<float> out(B * S * d), lse(B * heads * S);
  cpu::attention_forward<float>(mat(out, B * S, d), lse, cmat(qkv, B * S, 3 * d), B, S, heads);
  std::vector<double> want_lse;
  const auto want = naive_attention(qkv, B, S, heads, d, &want_lse);
  CHECK(rel_error(out, want) < float_tol);
  CHECK(rel_error(lse, want_lse) < float_tol);
  // lse order is ((b*heads + h)*S + i): row 0 of every (b, h) sees only itself, lse = q0·k0/sqrt(hd).
  const index_t hd = d / heads;
  double s = 0;
  for (index_t c = 0; c < hd; ++c) s += double(qkv[S * 3 * d + 2 * hd + c]) * qkv[S * 3 * d + d + 2 * hd + c];
  CHECK(lse[(1 * heads + 2) * S + 0] == Approx(s / std::sqrt(double(hd))).epsilon(1e-5));

  SECTION("float backward agrees with the double backward") {
    auto dout = random_vec<float>(B * S * d, rng);
    std::vector<float> dqkv(B * S * 3 * d, 0.f);
    cpu::attention_backward<float>(mat(dqkv, B * S, 3 * d), cmat(dout, B * S, d), cmat(out, B * S, d), lse,
                                   cmat(qkv, B * S, 3 * d), B, S, heads);
    std::vector<double> qkv64(qkv.begin(), qkv.end()), dout64(dout.begin(), dout.end());
    std::vector<double> out64(B * S * d), lse64(B * heads * S), dqkv64(B * S * 3 * d, 0.0);
    cpu::attention_forward<double>(mat(out64, B * S, d), lse64, cmat(qkv64, B * S, 3 * d), B, S, heads);
    cpu::attention_backward<double>(mat(dqkv64, B * S, 3 * d), cmat(dout64, B * S, d), cmat(out64, B * S, d), lse64,
                                    cmat(qkv64, B * S, 3 * d), B, S, heads);
    CHECK(rel_error(dqkv, dqkv64) < float_tol);
  }
}

TEST_CASE("attention: causal - changing a later token never changes an earlier output", "[ops][attention]") {
  Rng rng(32);
  const index_t B = 1, S = 150, heads = 2, d = 8;  // three query blocks
  auto qkv = random_vec(B * S * 3 * d, rng);
  std::vector<double> before(S * d), after(S * d), lse(heads * S);
  cpu::attention_forward<double>(mat(before, S, d), lse, cmat(qkv, S, 3 * d), B, S, heads);
  for (index_t t : {149, 128, 127, 64, 63, 3}) {
    for (index_t c = 0; c < 3 * d; ++c) qkv[t * 3 * d + c] += 10.0 * rng.uniform();  // q, k and v of token t
    cpu::attention_forward<double>(mat(after, S, d), lse, cmat(qkv, S, 3 * d), B, S, heads);
    for (index_t i = 0; i < t * d; ++i) REQUIRE(after[i] == before[i]);  // rows < t: bit-identical
    bool row_t_changed = false;
    for (index_t c = 0; c < d; ++c) row_t_changed |= after[t * d + c] != before[t * d + c];
    CHECK(row_t_changed);
    before = after;
  }

  SECTION("and the gradient of an earlier output never reaches a later token") {
    std::vector<double> dout(S * d, 0.0), dqkv(S * 3 * d, 0.0);
    for (index_t c = 0; c < d; ++c) dout[5 * d + c] = 1.0;  // d(sum of row 5)
    cpu::attention_backward<double>(mat(dqkv, S, 3 * d), cmat(dout, S, d), cmat(after, S, d), lse, cmat(qkv, S, 3 * d),
                                    B, S, heads);
    for (index_t i = 6 * 3 * d; i < S * 3 * d; ++i) REQUIRE(dqkv[i] == 0.0);
  }
}

TEST_CASE("attention: batch > 1 - sequences do not see each other", "[ops][attention]") {
  Rng rng(33);
  const index_t B = 3, S = 70, heads = 2, d = 8;
  auto qkv = random_vec(B * S * 3 * d, rng);
  std::vector<double> out(B * S * d), lse(B * heads * S);
  cpu::attention_forward<double>(mat(out, B * S, d), lse, cmat(qkv, B * S, 3 * d), B, S, heads);
  // Each sequence alone gives the same rows as inside the batch.
  for (index_t b = 0; b < B; ++b) {
    std::vector<double> one(qkv.begin() + b * S * 3 * d, qkv.begin() + (b + 1) * S * 3 * d), o1(S * d), l1(heads * S);
    cpu::attention_forward<double>(mat(o1, S, d), l1, cmat(one, S, 3 * d), 1, S, heads);
    for (index_t i = 0; i < S * d; ++i) REQUIRE(o1[i] == Approx(out[b * S * d + i]).epsilon(1e-13));
  }
  // Changing all of sequence 0 leaves sequences 1 and 2 untouched.
  for (index_t i = 0; i < S * 3 * d; ++i) qkv[i] = -qkv[i] * 3;
  std::vector<double> out2(B * S * d);
  cpu::attention_forward<double>(mat(out2, B * S, d), lse, cmat(qkv, B * S, 3 * d), B, S, heads);
  for (index_t i = S * d; i < B * S * d; ++i) REQUIRE(out2[i] == out[i]);
  CHECK(out2[0] != out[0]);
}

TEST_CASE("attention_decode + kv_write: token by token through the cache equals causal attention (float, double)",
          "[ops][attention][decode]") {
  // B sequences of S tokens fed in an interleaved order (sequence b's token t at step t, sequences in
  // reverse slot order), each row attending through the cache to its own sequence's earlier tokens.
  const index_t B = 3, S = 11, heads = 4, d = 32, max_len = 16;
  Rng rng(77);
  const auto qkv = random_vec<double>(std::size_t(B * S * 3 * d), rng);
  const auto want = naive_attention(qkv, B, S, heads, d);
  auto run = [&]<class T>(T) {
    std::vector<T> kc(std::size_t(B * max_len * d), T(7)), vc(kc.size(), T(7));  // stale values must not leak in
    std::vector<T> rows(std::size_t(B * 3 * d)), out(std::size_t(B * d));
    double worst = 0;
    for (index_t t = 0; t < S; ++t) {
      std::vector<index_t> slot, pos;
      for (index_t b = B - 1; b >= 0; --b) {
        const index_t r = ssize(slot);
        for (index_t c = 0; c < 3 * d; ++c) rows[std::size_t(r * 3 * d + c)] = T(qkv[std::size_t((b * S + t) * 3 * d + c)]);
        slot.push_back(b);
        pos.push_back(t);
      }
      const MatrixView<const T> q{rows.data(), B, 3 * d};
      cpu::kv_write<T>(MatrixView<T>{kc.data(), B * max_len, d}, MatrixView<T>{vc.data(), B * max_len, d}, q, slot, pos,
                       max_len);
      cpu::attention_decode<T>(MatrixView<T>{out.data(), B, d}, q, MatrixView<const T>{kc.data(), B * max_len, d},
                               MatrixView<const T>{vc.data(), B * max_len, d}, slot, pos, max_len, heads);
      for (index_t r = 0; r < B; ++r)
        for (index_t c = 0; c < d; ++c)
          worst = std::max(worst, std::abs(double(out[std::size_t(r * d + c)]) -
                                           want[std::size_t((slot[std::size_t(r)] * S + t) * d + c)]));
    }
    return worst;
  };
  CHECK(run(double{}) < 1e-13);
  CHECK(run(float{}) < 2e-6);
  // Rows outside the cache are one-line errors.
  std::vector<double> kc(static_cast<std::size_t>(max_len * d)), vc(kc.size()), q(static_cast<std::size_t>(3 * d)),
      out(static_cast<std::size_t>(d));
  const std::vector<index_t> slot{0}, far{max_len}, other{1};
  CHECK_THROWS_WITH(cpu::kv_write<double>(MatrixView<double>{kc.data(), max_len, d}, MatrixView<double>{vc.data(), max_len, d},
                                          MatrixView<const double>{q.data(), 1, 3 * d}, slot, far, max_len),
                    Catch::Contains("kv_write: row 0 (slot 0, position 16) is outside the cache of 1 x 16"));
  CHECK_THROWS_WITH(cpu::attention_decode<double>(MatrixView<double>{out.data(), 1, d}, MatrixView<const double>{q.data(), 1, 3 * d},
                                                  MatrixView<const double>{kc.data(), max_len, d},
                                                  MatrixView<const double>{vc.data(), max_len, d}, other, slot, max_len, heads),
                    Catch::Contains("attention_decode: row 0 (slot 1, position 0) is outside the cache of 1 x 16"));
}

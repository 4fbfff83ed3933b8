// Stick-breaking attention (ModuleFormer, arXiv 2306.04640, §3.2): the forward against the paper's
// product written out literally (O(T³)), finite-difference gradients in double, causality, the mass
// bound Σ_i p <= 1 (its closed form 1 − Π(1 − β)), stability at seq 4096 with |z| ~ 50 against a long
// double reference, float vs double, decode through the KV cache equal to the forward's rows, grouped and
// shared (multi-query) key/value heads against the literal product, finite differences and decode, and the
// one-line shape and kv_heads errors; in the denormal range (long rows, small gradients): the caller's
// floating-point state kept, the same bits on 1 and 2 threads, float against double.
#include <catch2/catch.hpp>

#include <omp.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <mom/backend/cpu.hpp>
#include <mom/backend/cpu/stick_breaking.hpp>

#include "ops/grad_check.hpp"

using namespace mom;
using namespace mom::test;

namespace {

// Row t of query head h of sequence b, literally: p_i = β_i Π_{i<j<=t} (1 − β_j), o = Σ_i p_i v_i, in R. d is
// the query width heads·hd; kv key/value heads (-1: = heads), query head h reading key/value head h / (heads / kv).
template <class R, class T>
std::vector<R> naive_row(const std::vector<T>& qkv, index_t S, index_t d, index_t heads, index_t b, index_t h,
                         index_t t, index_t kv = -1) {
  if (kv < 0) kv = heads;
  const index_t hd = d / heads, W = (heads + 2 * kv) * hd, kc = d + (h / (heads / kv)) * hd, vc = kc + kv * hd;
  auto at = [&](index_t row, index_t col) { return R(qkv[std::size_t((b * S + row) * W + col)]); };
  std::vector<R> beta(std::size_t(t + 1)), o(std::size_t(hd), R(0));
  for (index_t i = 0; i <= t; ++i) {
    R z = 0;
    for (index_t c = 0; c < hd; ++c) z += at(t, h * hd + c) * at(i, kc + c);
    z /= std::sqrt(R(hd));
    beta[std::size_t(i)] = R(1) / (R(1) + std::exp(-z));
  }
  for (index_t i = 0; i <= t; ++i) {
    R p = beta[std::size_t(i)];
    for (index_t j = i + 1; j <= t; ++j) p *= R(1) - beta[std::size_t(j)];
    for (index_t c = 0; c < hd; ++c) o[std::size_t(c)] += p * at(i, vc + c);
  }
  return o;
}

template <class T>
std::vector<double> naive_sb(const std::vector<T>& qkv, index_t B, index_t S, index_t heads, index_t d, index_t kv = -1) {
  const index_t hd = d / heads;
  std::vector<double> out(std::size_t(B * S * d));
  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < heads; ++h)
      for (index_t t = 0; t < S; ++t) {
        const auto o = naive_row<double>(qkv, S, d, heads, b, h, t, kv);
        for (index_t c = 0; c < hd; ++c) out[std::size_t((b * S + t) * d + h * hd + c)] = o[std::size_t(c)];
      }
  return out;
}

// The width of a [q | k | v] row of heads query heads (d columns) and kv key/value heads (-1: = heads).
constexpr index_t qkv_width(index_t heads, index_t d, index_t kv = -1) { return d + 2 * (kv < 0 ? heads : kv) * (d / heads); }

template <class T>
void forward(std::vector<T>& out, const std::vector<T>& qkv, index_t B, index_t S, index_t heads, index_t d,
             index_t kv = -1) {
  out.resize(std::size_t(B * S * d));
  cpu::stick_breaking_forward<T>(mat(out, B * S, d), cmat(qkv, B * S, qkv_width(heads, d, kv)), B, S, heads,
                                 kv < 0 ? heads : kv);
}
// dqkv (accumulated onto a constant `onto`, which is subtracted again) for loss = Σ dout ∘ out. onto = 0 for
// gradients far below 1 in float (0.5 + 1e-6 would round them).
template <class T>
std::vector<T> backward(const std::vector<T>& dout, const std::vector<T>& qkv, index_t B, index_t S, index_t heads,
                        index_t d, index_t kv = -1, T onto = T(0.5)) {
  std::vector<T> out;
  forward(out, qkv, B, S, heads, d, kv);
  std::vector<T> dqkv(qkv.size(), onto);
  const index_t W = qkv_width(heads, d, kv);
  cpu::stick_breaking_backward<T>(mat(dqkv, B * S, W), cmat(dout, B * S, d), cmat(out, B * S, d), cmat(qkv, B * S, W), B,
                                  S, heads, kv < 0 ? heads : kv);
  for (auto& g : dqkv) g -= onto;
  return dqkv;
}

template <class V>
bool all_finite(const V& v) {
  for (const auto x : v)
    if (!std::isfinite(double(x))) return false;
  return true;
}

}  // namespace

TEST_CASE("stick_breaking_forward matches the literal O(T^3) product in double", "[ops][stick_breaking]") {
  Rng rng(150);
  // One query block; two with a partial one; rows longer than one descent chunk (256 keys).
  const index_t S = GENERATE(1, 5, 70, 300);
  const index_t B = 2, heads = 2, d = 8;
  const auto qkv = random_vec(std::size_t(B * S * 3 * d), rng, -2.5, 2.5);
  std::vector<double> out;
  forward(out, qkv, B, S, heads, d);
  CHECK(rel_error(out, naive_sb(qkv, B, S, heads, d)) < 1e-12);
}

TEST_CASE("stick_breaking_backward matches finite differences (double)", "[ops][stick_breaking]") {
  Rng rng(151);
  SECTION("every input, one and two query blocks") {
    const index_t S = GENERATE(1, 5, 69);
    const index_t B = 2, heads = 2, d = 6;
    auto qkv = random_vec(std::size_t(B * S * 3 * d), rng, -1.5, 1.5);
    const auto proj = random_vec(std::size_t(B * S * d), rng);
    std::vector<double> out;
    auto loss = [&] {
      forward(out, qkv, B, S, heads, d);
      return dot(proj, out);
    };
    const auto dqkv = backward(proj, qkv, B, S, heads, d);
    CHECK(rel_error(dqkv, numeric_grad(qkv, loss)) < fd_tol);
  }
  SECTION("large |z| over rows longer than a descent chunk (the spent-stick cutoff), sampled inputs") {
    const index_t B = 1, S = 300, heads = 1, d = 4;
    // |z| ~ 12 (up to 72): a row's first 256-key chunk spends the stick, so rows past 256 keys stop at the cutoff.
    auto qkv = random_vec(std::size_t(B * S * 3 * d), rng, -6, 6);
    for (index_t r = 0; r < S; ++r)
      for (index_t c = 2 * d; c < 3 * d; ++c) qkv[std::size_t(r * 3 * d + c)] /= 6;  // v in [-1, 1]
    const auto proj = random_vec(std::size_t(B * S * d), rng);
    std::vector<double> out;
    auto loss = [&] {
      forward(out, qkv, B, S, heads, d);
      return dot(proj, out);
    };
    const auto dqkv = backward(proj, qkv, B, S, heads, d);
    std::vector<std::size_t> idx;
    for (int n = 0; n < 300; ++n) idx.push_back(std::size_t(rng.integer(0, int(qkv.size()) - 1)));
    for (std::size_t i = qkv.size() - 3 * d; i < qkv.size(); ++i) idx.push_back(i);  // the last token
    std::vector<double> want = numeric_grad_at(qkv, idx, loss), got;
    for (const std::size_t i : idx) got.push_back(dqkv[i]);
    CHECK(rel_error(got, want) < fd_tol);
  }
}

TEST_CASE("stick_breaking: causal - changing a later token never changes an earlier output",
          "[ops][stick_breaking]") {
  Rng rng(152);
  const index_t B = 1, S = 150, heads = 2, d = 8;  // three query blocks
  auto qkv = random_vec(std::size_t(B * S * 3 * d), rng, -2, 2);
  std::vector<double> before, after;
  forward(before, qkv, B, S, heads, d);
  for (index_t t : {149, 128, 127, 64, 63, 3, 0}) {
    for (index_t c = 0; c < 3 * d; ++c) qkv[std::size_t(t * 3 * d + c)] += 3.0 * rng.uniform();  // q, k, v of t
    forward(after, qkv, B, S, heads, d);
    for (index_t i = 0; i < t * d; ++i) REQUIRE(after[std::size_t(i)] == before[std::size_t(i)]);  // bit-identical
    bool row_t_changed = false;
    for (index_t c = 0; c < d; ++c) row_t_changed |= after[std::size_t(t * d + c)] != before[std::size_t(t * d + c)];
    CHECK(row_t_changed);
    before = after;
  }
  SECTION("and the gradient of an earlier output never reaches a later token") {
    std::vector<double> dout(std::size_t(S * d), 0.0);
    for (index_t c = 0; c < d; ++c) dout[std::size_t(5 * d + c)] = 1.0;  // d(sum of row 5)
    const auto dqkv = backward(dout, qkv, B, S, heads, d);
    for (index_t i = 6 * 3 * d; i < S * 3 * d; ++i) REQUIRE(dqkv[std::size_t(i)] == 0.0);
    bool reaches_earlier = false;
    for (index_t i = 0; i < 6 * 3 * d; ++i) reaches_earlier |= dqkv[std::size_t(i)] != 0.0;
    CHECK(reaches_earlier);
  }
  SECTION("sequences of a batch do not see each other") {
    const index_t B2 = 3;
    auto qkv2 = random_vec(std::size_t(B2 * S * 3 * d), rng, -2, 2);
    std::vector<double> all, one;
    forward(all, qkv2, B2, S, heads, d);
    for (index_t b = 0; b < B2; ++b) {
      const std::vector<double> seq(qkv2.begin() + b * S * 3 * d, qkv2.begin() + (b + 1) * S * 3 * d);
      forward(one, seq, 1, S, heads, d);
      for (index_t i = 0; i < S * d; ++i) REQUIRE(one[std::size_t(i)] == all[std::size_t(b * S * d + i)]);
    }
  }
}

TEST_CASE("stick_breaking: the weights sum to 1 - prod(1 - beta) <= 1 (v = ones)", "[ops][stick_breaking]") {
  Rng rng(153);
  const index_t B = 2, S = 300, heads = 2, d = 8, hd = d / heads;
  auto run = [&]<class T>(T, double lo, double hi, double tol) {
    auto qkv = random_vec<T>(std::size_t(B * S * 3 * d), rng, lo, hi);
    for (index_t r = 0; r < B * S; ++r)
      for (index_t c = 2 * d; c < 3 * d; ++c) qkv[std::size_t(r * 3 * d + c)] = T(1);
    std::vector<T> out;
    forward(out, qkv, B, S, heads, d);
    double worst = 0;
    for (index_t b = 0; b < B; ++b)
      for (index_t h = 0; h < heads; ++h)
        for (index_t t = 0; t < S; ++t) {
          double sp = 0;  // Σ_{i<=t} softplus(z_i): 1 − Π(1 − β_i) = 1 − exp(−sp)
          for (index_t i = 0; i <= t; ++i) {
            double z = 0;
            for (index_t c = 0; c < hd; ++c)
              z += double(qkv[std::size_t((b * S + t) * 3 * d + h * hd + c)]) *
                   double(qkv[std::size_t((b * S + i) * 3 * d + d + h * hd + c)]);
            z /= std::sqrt(double(hd));
            sp += std::max(z, 0.0) + std::log1p(std::exp(-std::abs(z)));
          }
          const double mass = -std::expm1(-sp);
          for (index_t c = 0; c < hd; ++c) {
            const T o = out[std::size_t((b * S + t) * d + h * hd + c)];
            REQUIRE(o <= T(1) + 4 * std::numeric_limits<T>::epsilon());  // Σ p <= 1, up to rounding
            REQUIRE(o >= T(0));
            worst = std::max(worst, std::abs(double(o) - mass));
          }
        }
    CHECK(worst < tol);
  };
  run(double{}, -1.0, 1.0, 1e-13);  // mild scores: part of the stick stays unspent
  run(double{}, -4.0, 4.0, 1e-13);
  run(float{}, -4.0, 4.0, 1e-6);
  run(float{}, -0.3, 0.0, 1e-6);  // scores near 0 (β ≈ 1/2): ~150 keys before the stick is spent
}

TEST_CASE("stick_breaking at seq 4096 with |z| ~ 50: finite, and equal to a long double reference",
          "[ops][stick_breaking]") {
  Rng rng(154);
  const index_t B = 1, S = 4096, heads = 2, d = 8, hd = d / heads;
  // Head 0: q, k in [-12, 12] (|z| ~ 50, up to 288): the stick is spent within a few keys. Head 1: z ≈
  // k_0 in [-9, -3] (β tiny): the stick is never spent, every row sums thousands of softplus terms.
  std::vector<float> qkv(std::size_t(B * S * 3 * d));
  for (index_t r = 0; r < S; ++r) {
    float* row = qkv.data() + r * 3 * d;
    for (index_t c = 0; c < hd; ++c) {
      row[c] = float(rng.uniform(-12, 12));
      row[d + c] = float(rng.uniform(-12, 12));
      row[hd + c] = c == 0 ? 2.0f : float(rng.uniform(-0.1, 0.1));
      row[d + hd + c] = c == 0 ? float(rng.uniform(-9, -3)) : float(rng.uniform(-0.1, 0.1));
    }
    for (index_t c = 0; c < d; ++c) row[2 * d + c] = float(rng.uniform(-1, 1));
  }
  const std::vector<double> qkv64(qkv.begin(), qkv.end());
  std::vector<float> out32;
  std::vector<double> out64;
  forward(out32, qkv, B, S, heads, d);
  forward(out64, qkv64, B, S, heads, d);
  CHECK(all_finite(out32));
  CHECK(all_finite(out64));

  // Rows with the literal product in long double (O(t²) each).
  std::vector<double> want, got64, got32;
  for (const index_t t : {index_t(0), index_t(1), index_t(2), index_t(300), index_t(2049), S - 1})
    for (index_t h = 0; h < heads; ++h) {
      const auto o = naive_row<long double>(qkv64, S, d, heads, 0, h, t);
      for (index_t c = 0; c < hd; ++c) {
        want.push_back(double(o[std::size_t(c)]));
        got64.push_back(out64[std::size_t(t * d + h * hd + c)]);
        got32.push_back(out32[std::size_t(t * d + h * hd + c)]);
      }
    }
  CHECK(rel_error(got64, want) < 1e-12);
  CHECK(rel_error(got32, want) < 1e-6);
  CHECK(rel_error(out32, out64) < 1e-5);

  const auto dout64 = random_vec(std::size_t(B * S * d), rng);
  const std::vector<float> dout32(dout64.begin(), dout64.end());
  const auto g64 = backward(dout64, qkv64, B, S, heads, d);
  const auto g32 = backward(dout32, qkv, B, S, heads, d);
  CHECK(all_finite(g64));
  CHECK(all_finite(g32));
  CHECK(rel_error(g32, g64) < 1e-5);
}

TEST_CASE("stick_breaking: float agrees with double (forward and backward)", "[ops][stick_breaking]") {
  Rng rng(155);
  const index_t B = 2, S = 70, heads = 4, d = 64;
  const auto qkv = random_vec<float>(std::size_t(B * S * 3 * d), rng, -2, 2);
  const auto dout = random_vec<float>(std::size_t(B * S * d), rng);
  const std::vector<double> qkv64(qkv.begin(), qkv.end()), dout64(dout.begin(), dout.end());
  std::vector<float> out;
  std::vector<double> out64;
  forward(out, qkv, B, S, heads, d);
  forward(out64, qkv64, B, S, heads, d);
  CHECK(rel_error(out, out64) < float_tol);
  CHECK(rel_error(backward(dout, qkv, B, S, heads, d), backward(dout64, qkv64, B, S, heads, d)) < float_tol);
}

#if defined(__SSE2__)
#include <xmmintrin.h>
#endif

// Near initialisation z ~ 0 and every key costs log 2 of the stick, so a row of 256 keys reaches
// weights of 2^-256: float's denormal range is crossed on every long row, and gradients of 1e-5 push the
// backward's products further in. The ops run these under FlushDenormals (cpu/denormals.hpp); it must not
// leak into the caller's thread, nor make the bits depend on how many threads ran.
TEST_CASE("stick_breaking in the denormal range: caller's MXCSR kept, same bits on 1 and 2 threads, float ~ double",
          "[ops][stick_breaking]") {
  Rng rng(157);
  const index_t B = 2, S = 256, heads = 2, kv = 1, d = 64, W = qkv_width(heads, d, kv);
  auto qkv = random_vec<float>(std::size_t(B * S * W), rng, -0.3f, 0.3f);
  auto dout = random_vec<float>(std::size_t(B * S * d), rng);
  for (auto& g : dout) g *= 1e-5f;
  {  // the premise: the last query's weight on key 0 (head 0, sequence 0), in double, is below float's normals
    const index_t hd = d / heads, t = S - 1;
    double p0 = 1;
    for (index_t i = 0; i <= t; ++i) {
      double z = 0;
      for (index_t c = 0; c < hd; ++c) z += double(qkv[std::size_t(t * W + c)]) * double(qkv[std::size_t(i * W + d + c)]);
      const double beta = 1 / (1 + std::exp(-z / std::sqrt(double(hd))));
      p0 *= i == 0 ? beta : 1 - beta;
    }
    CHECK(p0 > 0);
    CHECK(p0 < double(std::numeric_limits<float>::min()));
  }
#if defined(__SSE2__)
  const unsigned csr = _mm_getcsr();
#endif
  const int saved_threads = omp_get_max_threads();
  std::vector<float> out1, out2;
  omp_set_num_threads(1);
  forward(out1, qkv, B, S, heads, d, kv);
  const auto d1 = backward(dout, qkv, B, S, heads, d, kv, 0.0f);
  omp_set_num_threads(2);
  forward(out2, qkv, B, S, heads, d, kv);
  const auto d2 = backward(dout, qkv, B, S, heads, d, kv, 0.0f);
  omp_set_num_threads(saved_threads);
#if defined(__SSE2__)
  CHECK(_mm_getcsr() == csr);
#endif
  CHECK(out1 == out2);
  CHECK(d1 == d2);
  const std::vector<double> qkv64(qkv.begin(), qkv.end()), dout64(dout.begin(), dout.end());
  std::vector<double> out64;
  forward(out64, qkv64, B, S, heads, d, kv);
  CHECK(rel_error(out2, out64) < float_tol);
  CHECK(rel_error(d2, backward(dout64, qkv64, B, S, heads, d, kv, 0.0)) < float_tol);
}

TEST_CASE("stick_breaking_decode + kv_write: token by token through the cache equals the forward (float, double)",
          "[ops][stick_breaking][decode]") {
  // B sequences of S tokens in an interleaved order (sequence b's token t at step t, slots in reverse order),
  // each row attending through the cache to its own sequence's earlier tokens; rows beyond 256 keys included;
  // 5 rows of 4 heads: two lane groups of (row, head) pairs on the CPU, the second partly filled.
  const index_t B = 5, S = 270, heads = 4, d = 32, max_len = 280;
  Rng rng(156);
  const auto qkv = random_vec<double>(std::size_t(B * S * 3 * d), rng, -1.5, 1.5);
  auto run = [&]<class T>(T) {
    const std::vector<T> qkvT(qkv.begin(), qkv.end());
    std::vector<T> want;
    forward(want, qkvT, B, S, heads, d);
    cpu::Backend<T> be;
    std::vector<T> kc(std::size_t(B * max_len * d), T(7)), vc(kc.size(), T(7));  // stale values must not leak in
    std::vector<T> rows(std::size_t(B * 3 * d)), out(std::size_t(B * d));
    double worst = 0, scale = 0;
    for (index_t t = 0; t < S; ++t) {
      std::vector<index_t> slot, pos;
      for (index_t b = B - 1; b >= 0; --b) {
        const index_t r = ssize(slot);
        for (index_t c = 0; c < 3 * d; ++c)
          rows[std::size_t(r * 3 * d + c)] = qkvT[std::size_t((b * S + t) * 3 * d + c)];
        slot.push_back(b);
        pos.push_back(t);
      }
      const MatrixView<const T> q{rows.data(), B, 3 * d};
      be.kv_write(MatrixView<T>{kc.data(), B * max_len, d}, MatrixView<T>{vc.data(), B * max_len, d}, q, slot, pos,
                  max_len);
      be.stick_breaking_decode(MatrixView<T>{out.data(), B, d}, q, MatrixView<const T>{kc.data(), B * max_len, d},
                               MatrixView<const T>{vc.data(), B * max_len, d}, slot, pos, max_len, heads, heads);
      for (index_t r = 0; r < B; ++r)
        for (index_t c = 0; c < d; ++c) {
          const double w = want[std::size_t((slot[std::size_t(r)] * S + t) * d + c)];
          worst = std::max(worst, std::abs(double(out[std::size_t(r * d + c)]) - w));
          scale = std::max(scale, std::abs(w));
        }
    }
    return worst / scale;
  };
  CHECK(run(double{}) < 1e-13);
  CHECK(run(float{}) < 2e-6);
}

TEST_CASE("stick_breaking: bad shapes are one-line errors", "[ops][stick_breaking]") {
  const index_t B = 2, S = 3, d = 8;
  std::vector<double> qkv(std::size_t(B * S * 3 * d)), out(std::size_t(B * S * d)), dqkv(qkv.size()), dout(out.size());
  auto one_line = [](auto&& call, const std::string& want) {
    try {
      call();
      FAIL("no error; expected: " << want);
    } catch (const mom::Error& e) {
      const std::string msg = e.what();
      INFO(msg);
      CHECK(msg.find(want) != std::string::npos);
      CHECK(msg.find('\n') == std::string::npos);
    }
  };
  cpu::Backend<double> be;
  one_line([&] { be.stick_breaking_forward(mat(out, B * S, d), cmat(qkv, B * S, 3 * d), B, S, 3, 3); },
           "stick_breaking_forward: d = 8 (qkv [6x24]) is not divisible by heads = 3");
  one_line([&] { be.stick_breaking_forward(mat(out, B * S, d), cmat(qkv, B * S, 3 * d), B, S + 1, 2, 2); },
           "stick_breaking_forward: qkv [6x24] must have batch*seq = 2*4 rows");
  one_line([&] { be.stick_breaking_forward(mat(out, B * S, d - 1), cmat(qkv, B * S, 3 * d), B, S, 2, 2); },
           "stick_breaking_forward: out [6x7] must be [6x8] for qkv [6x24]");
  one_line([&] { be.stick_breaking_forward(mat(out, B * S, d), cmat(qkv, B * S, 3 * d - 1), B, S, 2, 2); },
           "stick_breaking_forward: qkv [6x23] must have 3*d columns [q | k | v]");
  one_line([&] { be.stick_breaking_forward(mat(out, B * S, d), cmat(qkv, B * S, 3 * d), B, S, 0, 0); },
           "stick_breaking_forward: batch 2, seq 3, heads 0 must be positive");
  one_line([&] {
    be.stick_breaking_backward(mat(dqkv, B * S, 3 * d - 3), cmat(dout, B * S, d), cmat(out, B * S, d),
                               cmat(qkv, B * S, 3 * d), B, S, 2, 2);
  }, "stick_breaking_backward: dqkv [6x21] must match qkv [6x24]");
  one_line([&] {
    be.stick_breaking_backward(mat(dqkv, B * S, 3 * d), cmat(dout, B * S - 1, d), cmat(out, B * S, d),
                               cmat(qkv, B * S, 3 * d), B, S, 2, 2);
  }, "stick_breaking_backward: dout [5x8] must match out [6x8]");
  // Decode: a slot outside the cache, a position past max_len, shapes that disagree.
  const index_t max_len = 4;
  std::vector<double> kc(std::size_t(2 * max_len * d)), vc(kc.size());
  const std::vector<index_t> slot{0, 2}, pos{0, 1}, far{0, 4};
  const MatrixView<const double> q2{qkv.data(), 2, 3 * d}, k2{kc.data(), 2 * max_len, d}, v2{vc.data(), 2 * max_len, d};
  one_line([&] { be.stick_breaking_decode(mat(out, 2, d), q2, k2, v2, slot, pos, max_len, 2, 2); },
           "stick_breaking_decode: row 1 (slot 2, position 1) is outside the cache of 2 x 4");
  one_line([&] { be.stick_breaking_decode(mat(out, 2, d), q2, k2, v2, pos, far, max_len, 2, 2); },
           "stick_breaking_decode: row 1 (slot 1, position 4) is outside the cache of 2 x 4");
  one_line([&] {
    be.stick_breaking_decode(mat(out, 2, d), q2, k2, v2, slot, std::span<const index_t>(pos).first(1), max_len, 2, 2);
  },
           "stick_breaking_decode: 2 slots and 1 positions for 2 rows");
  one_line([&] { be.stick_breaking_decode(mat(out, 2, d), q2, k2, v2, pos, pos, max_len, 3, 3); },
           "stick_breaking_decode: 3 heads, qkv [2x24], out [2x8], caches [8x8] and [8x8] disagree");
  one_line([&] { be.stick_breaking_decode(mat(out, 2, d), q2, k2, v2, pos, pos, 3, 2, 2); },
           "stick_breaking_decode: cache of 8 rows is not slots x max_len 3");
  // Grouped key/value heads: kv_heads must divide heads; the layout's width follows from both.
  one_line([&] { be.stick_breaking_forward(mat(out, B * S, d), cmat(qkv, B * S, 3 * d), B, S, 4, 3); },
           "stick_breaking_forward: kv_heads = 3 does not divide heads = 4");
  one_line([&] { be.stick_breaking_forward(mat(out, B * S, d), cmat(qkv, B * S, 3 * d), B, S, 4, 0); },
           "stick_breaking_forward: kv_heads = 0 does not divide heads = 4");
  one_line([&] { be.stick_breaking_forward(mat(out, B * S, d), cmat(qkv, B * S, 3 * d), B, S, 4, 1); },
           "stick_breaking_forward: out [6x8] must be [6x16] for qkv [6x24] (4 query heads of 4)");
  one_line([&] { be.stick_breaking_forward(mat(out, B * S, d), cmat(qkv, B * S, 3 * d - 1), B, S, 2, 1); },
           "stick_breaking_forward: qkv [6x23] must have (heads + 2*kv_heads)*head_dim = 4*head_dim columns");
  one_line([&] { be.stick_breaking_decode(mat(out, 2, d), q2, k2, v2, pos, pos, max_len, 2, 1); },
           "stick_breaking_decode: 2 heads (1 key/value), qkv [2x24], out [2x8], caches [8x8] and [8x8] disagree");
  // kv_heads is the op's own argument: -1 is not "= heads" (the shared checks' default for softmax attention).
  one_line([&] { be.stick_breaking_forward(mat(out, B * S, d), cmat(qkv, B * S, 3 * d), B, S, 2, -1); },
           "stick_breaking_forward: kv_heads = -1 does not divide heads = 2");
  one_line([&] {
    be.stick_breaking_backward(mat(dqkv, B * S, 3 * d), cmat(dout, B * S, d), cmat(out, B * S, d),
                               cmat(qkv, B * S, 3 * d), B, S, 4, 3);
  }, "stick_breaking_backward: kv_heads = 3 does not divide heads = 4");
  one_line([&] { be.stick_breaking_decode(mat(out, 2, d), q2, k2, v2, pos, pos, max_len, 2, 0); },
           "stick_breaking_decode: kv_heads = 0 does not divide heads = 2");
  one_line([&] { be.stick_breaking_decode(mat(out, 2, d), q2, k2, v2, pos, pos, max_len, 2, -1); },
           "stick_breaking_decode: kv_heads = -1 does not divide heads = 2");
}

TEST_CASE("stick_breaking with grouped and shared key/value heads matches the literal product and finite differences",
          "[ops][stick_breaking]") {
  Rng rng(160);
  const auto [heads, kv] = GENERATE(std::pair<index_t, index_t>{4, 4}, std::pair<index_t, index_t>{4, 2},
                                    std::pair<index_t, index_t>{4, 1}, std::pair<index_t, index_t>{2, 1});
  const index_t S = GENERATE(1, 7, 69), B = 2, hd = 3, d = heads * hd, W = qkv_width(heads, d, kv);
  INFO("heads " << heads << ", kv_heads " << kv << ", seq " << S);
  auto qkv = random_vec(std::size_t(B * S * W), rng, -1.5, 1.5);
  std::vector<double> out;
  forward(out, qkv, B, S, heads, d, kv);
  CHECK(rel_error(out, naive_sb(qkv, B, S, heads, d, kv)) < 1e-12);
  const auto proj = random_vec(std::size_t(B * S * d), rng);
  auto loss = [&] {
    forward(out, qkv, B, S, heads, d, kv);
    return dot(proj, out);
  };
  const auto dqkv = backward(proj, qkv, B, S, heads, d, kv);
  if (S < 69) {
    CHECK(rel_error(dqkv, numeric_grad(qkv, loss)) < fd_tol);
  } else {  // past a 64-key block: 400 sampled inputs and the last token's row (every input costs two forwards)
    std::vector<std::size_t> idx;
    for (int n = 0; n < 400; ++n) idx.push_back(std::size_t(rng.integer(0, int(qkv.size()) - 1)));
    for (std::size_t i = qkv.size() - std::size_t(W); i < qkv.size(); ++i) idx.push_back(i);
    std::vector<double> got;
    for (const std::size_t i : idx) got.push_back(dqkv[i]);
    CHECK(rel_error(got, numeric_grad_at(qkv, idx, loss)) < fd_tol);
  }
}

TEST_CASE("stick_breaking_decode with shared key/value heads equals the forward's rows", "[ops][stick_breaking][decode]") {
  const index_t B = 2, S = 9, heads = 4, hd = 4, d = heads * hd, max_len = 12;
  for (const index_t kv : {index_t(1), index_t(2)}) {
    const index_t W = qkv_width(heads, d, kv), dkv = kv * hd;
    Rng rng(161);
    const auto qkv = random_vec<double>(std::size_t(B * S * W), rng, -1.5, 1.5);
    std::vector<double> want;
    forward(want, qkv, B, S, heads, d, kv);
    cpu::Backend<double> be;
    std::vector<double> kc(std::size_t(B * max_len * dkv), 7.0), vc(kc.size(), 7.0), out(std::size_t(B * d));
    double worst = 0;
    for (index_t t = 0; t < S; ++t) {
      const std::vector<index_t> slot{0, 1}, pos{t, t};
      std::vector<double> rows;
      for (index_t b = 0; b < B; ++b)
        rows.insert(rows.end(), qkv.begin() + (b * S + t) * W, qkv.begin() + (b * S + t + 1) * W);
      const MatrixView<const double> q{rows.data(), B, W};
      // kv_write reads [x | k | v] of equal widths: the last d_kv query columns and the key/value columns.
      be.kv_write(MatrixView<double>{kc.data(), B * max_len, dkv}, MatrixView<double>{vc.data(), B * max_len, dkv},
                  q.col_block(d - dkv, 3 * dkv), slot, pos, max_len);
      be.stick_breaking_decode(MatrixView<double>{out.data(), B, d}, q, MatrixView<const double>{kc.data(), B * max_len, dkv},
                               MatrixView<const double>{vc.data(), B * max_len, dkv}, slot, pos, max_len, heads, kv);
      for (index_t b = 0; b < B; ++b)
        for (index_t c = 0; c < d; ++c)
          worst = std::max(worst, std::abs(out[std::size_t(b * d + c)] - want[std::size_t((b * S + t) * d + c)]));
    }
    CHECK(worst < 1e-13);
  }
}

// Rotary position embedding (cpu/rope.hpp; RoFormer, arXiv 2104.09864): the op against a naive double
// rotation, backward as the transpose (finite differences in double) and the inverse, scores that depend on
// relative positions only (eq. (16)), explicit positions equal to the implicit row mod seq, the grouped form,
// and the checked errors.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include <mom/backend/cpu.hpp>

#include "ops/grad_check.hpp"

using namespace mom;
using namespace mom::test;

namespace {
// Naive rotate_half RoPE in double of columns [0, cols) of x [rows × ld], row r at position pos(r).
template <class T, class P>
std::vector<double> naive_rope(const std::vector<T>& x, index_t rows, index_t ld, index_t cols, index_t hd, double base,
                               P&& pos) {
  std::vector<double> out(x.begin(), x.end());
  const index_t h = hd / 2;
  for (index_t r = 0; r < rows; ++r)
    for (index_t c0 = 0; c0 < cols; c0 += hd)
      for (index_t i = 0; i < h; ++i) {
        const double theta = std::pow(base, -2.0 * double(i) / double(hd));
        const double a = double(pos(r)) * theta;
        const double x1 = double(x[r * ld + c0 + i]), x2 = double(x[r * ld + c0 + i + h]);
        out[r * ld + c0 + i] = x1 * std::cos(a) - x2 * std::sin(a);
        out[r * ld + c0 + i + h] = x2 * std::cos(a) + x1 * std::sin(a);
      }
  return out;
}
const std::span<const index_t> no_pos{};

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const mom::Error& e) {
    return e.what();
  }
  return "(no error)";
}
}  // namespace

TEST_CASE("rope: forward matches a naive double rotation (q|k block of a qkv matrix, head dims 2 to 80)",
          "[ops][rope]") {
  Rng rng(71);
  const index_t hd = GENERATE(2, 8, 80);  // 80: 40 pairs, more than one pass of 32 cos / sin on the stack
  const index_t heads = 3, d = heads * hd, B = 2, S = 37, n = B * S;
  auto qkv = random_vec(n * 3 * d, rng);
  const auto v_before = qkv;
  cpu::rope_forward<double>(MatrixView<double>{qkv.data(), n, 2 * d, 3 * d}, no_pos, S, hd, 10000.0);
  const auto want = naive_rope(v_before, n, 3 * d, 2 * d, hd, 10000.0, [&](index_t r) { return r % S; });
  CHECK(rel_error(qkv, want) < 1e-14);  // includes the v block, which must be untouched
  for (index_t r = 0; r < n; ++r)
    for (index_t c = 2 * d; c < 3 * d; ++c) REQUIRE(qkv[r * 3 * d + c] == v_before[r * 3 * d + c]);
  // position 0 is the identity
  for (index_t c = 0; c < 2 * d; ++c) REQUIRE(qkv[c] == v_before[c]);

  SECTION("float, another base") {
    auto xf = random_vec<float>(n * 2 * d, rng, -2, 2);
    const auto before = xf;
    cpu::rope_forward<float>(mat(xf, n, 2 * d), no_pos, S, hd, 500.f);
    CHECK(rel_error(xf, naive_rope(before, n, 2 * d, 2 * d, hd, 500.0, [&](index_t r) { return r % S; })) < float_tol);
  }
}

TEST_CASE("rope: backward is the transpose of forward (finite differences) and undoes it", "[ops][rope]") {
  Rng rng(72);
  const index_t hd = 6, heads = 2, d = hd * heads, S = 5, n = 3 * S;
  auto x = random_vec(n * d, rng);
  const auto proj = random_vec(n * d, rng);
  std::vector<double> y(x.size());
  auto loss = [&] {
    y = x;
    cpu::rope_forward<double>(mat(y, n, d), no_pos, S, hd, 10000.0);
    return dot(proj, y);
  };
  auto dx = proj;  // dL/dy, rotated back in place into dL/dx
  cpu::rope_backward<double>(mat(dx, n, d), no_pos, S, hd, 10000.0);
  CHECK(rel_error(dx, numeric_grad(x, loss)) < fd_tol);

  auto z = x;
  cpu::rope_forward<double>(mat(z, n, d), no_pos, S, hd, 10000.0);
  CHECK(rel_error(z, x) > 1e-3);
  cpu::rope_backward<double>(mat(z, n, d), no_pos, S, hd, 10000.0);
  CHECK(rel_error(z, x) < 1e-14);
}

TEST_CASE("rope: the score of a rotated query and key depends only on t - s (eq. (16))", "[ops][rope]") {
  Rng rng(73);
  const index_t hd = 16, heads = 4, d = hd * heads, big = 4096;
  const auto q = random_vec(d, rng), k = random_vec(d, rng);
  // Rotate the same q and k as rows at explicit positions; head h's score q_h · k_h.
  auto scores = [&](index_t t, index_t s) {
    std::vector<double> qk = q;
    qk.insert(qk.end(), k.begin(), k.end());
    const std::vector<index_t> pos{t, s};
    cpu::rope_forward<double>(mat(qk, 2, d), pos, big, hd, 10000.0);
    std::vector<double> out(std::size_t(heads), 0.0);
    for (index_t h = 0; h < heads; ++h)
      for (index_t c = 0; c < hd; ++c) out[std::size_t(h)] += qk[std::size_t(h * hd + c)] * qk[std::size_t(d + h * hd + c)];
    return out;
  };
  for (const auto& [t, s] : {std::pair<index_t, index_t>{5, 2}, {17, 17}, {40, 3}, {3, 40}, {250, 1}})
    for (const index_t delta : {index_t(1), index_t(7), index_t(100), index_t(600)}) {
      INFO("t " << t << " s " << s << " delta " << delta);
      const auto a = scores(t, s), b = scores(t + delta, s + delta);
      for (std::size_t h = 0; h < a.size(); ++h) CHECK(std::abs(a[h] - b[h]) < 1e-12);
    }
  // and it does depend on t - s
  CHECK(std::abs(scores(5, 2)[0] - scores(6, 2)[0]) > 1e-6);
}

TEST_CASE("rope: explicit positions (decode) equal the implicit row mod seq, grouped rows at idx mod seq",
          "[ops][rope]") {
  Rng rng(74);
  const index_t hd = 8, d = 4 * hd, S = 11, B = 3, n = B * S;
  const auto x = random_vec(n * 2 * d, rng);
  auto implicit = x;
  cpu::rope_forward<double>(mat(implicit, n, 2 * d), no_pos, S, hd, 10000.0);
  std::vector<index_t> pos(static_cast<std::size_t>(n));
  for (index_t r = 0; r < n; ++r) pos[std::size_t(r)] = r % S;
  auto explicit_pos = x;
  cpu::rope_forward<double>(mat(explicit_pos, n, 2 * d), pos, S, hd, 10000.0);
  CHECK(explicit_pos == implicit);  // bit for bit: the same angles
  // A decode step: one row per sequence, row r = token step_pos[r] of sequence r, which must come out as that
  // token's row of the (batch, seq) call.
  const std::vector<index_t> step_pos{4, 0, 10};
  std::vector<double> step(3 * 2 * d), want(3 * 2 * d);
  for (index_t r = 0; r < 3; ++r) {
    const index_t token = r * S + step_pos[std::size_t(r)];
    std::copy_n(x.begin() + token * 2 * d, 2 * d, step.begin() + r * 2 * d);
    std::copy_n(implicit.begin() + token * 2 * d, 2 * d, want.begin() + r * 2 * d);
  }
  cpu::rope_forward<double>(mat(step, 3, 2 * d), step_pos, S, hd, 10000.0);
  CHECK(step == want);

  SECTION("grouped rows: idx[r] mod seq, rows outside the groups untouched, backward inverts") {
    // 7 packed rows, groups {1..3}, {3..3} (empty), {3..6}: rows 0 and 6 are outside.
    const index_t rows = 7;
    const std::vector<token_t> idx{-5, 0, 14, 3, 32, 21, -1};  // rows 0, 6: stale values, never read
    const std::vector<token_t> offsets{1, 3, 3, 6};
    const RowGroups g{offsets.data(), 3};
    auto y = random_vec(rows * 2 * d, rng);
    const auto before = y;
    cpu::rope_forward<double>(mat(y, rows, 2 * d), idx, S, hd, 10000.0, g);
    const auto want_g = naive_rope(before, rows, 2 * d, 2 * d, hd, 10000.0,
                                   [&](index_t r) { return r >= 1 && r < 6 ? index_t(idx[std::size_t(r)]) % S : 0; });
    CHECK(rel_error(y, want_g) < 1e-14);
    for (const index_t r : {index_t(0), index_t(6)})
      for (index_t c = 0; c < 2 * d; ++c) REQUIRE(y[r * 2 * d + c] == before[r * 2 * d + c]);
    cpu::rope_backward<double>(mat(y, rows, 2 * d), idx, S, hd, 10000.0, g);
    CHECK(rel_error(y, before) < 1e-14);
  }
}

TEST_CASE("rope: shape and position errors are one-line mom::Errors", "[ops][rope][errors]") {
  std::vector<double> x(6 * 12, 0.5);
  CHECK(error_of([&] { cpu::rope_forward<double>(mat(x, 6, 12), no_pos, 3, 5, 10000.0); }) ==
        "rope_forward: head_dim = 5 must be even and > 0");
  CHECK(error_of([&] { cpu::rope_forward<double>(mat(x, 6, 12), no_pos, 3, 8, 10000.0); }) ==
        "rope_forward: x [6x12] is not a whole number of heads of head_dim = 8");
  CHECK(error_of([&] { cpu::rope_backward<double>(mat(x, 6, 12), no_pos, 0, 4, 10000.0); }) ==
        "rope_backward: seq = 0 must be > 0");
  const std::vector<index_t> short_pos{0, 1};
  CHECK(error_of([&] { cpu::rope_forward<double>(mat(x, 6, 12), short_pos, 8, 4, 10000.0); }) ==
        "rope_forward: 2 positions for x [6x12]");
  const std::vector<index_t> pos{0, 1, 2, 3, 9, 5};
  CHECK(error_of([&] { cpu::rope_forward<double>(mat(x, 6, 12), pos, 8, 4, 10000.0); }) ==
        "rope_forward: pos[4] = 9 is outside [0, seq = 8)");
  const std::vector<token_t> idx{0, 1, -2, 3, 4, 5}, offsets{0, 6};
  CHECK(error_of([&] {
          cpu::rope_forward<double>(mat(x, 6, 12), idx, 8, 4, 10000.0, RowGroups{offsets.data(), 1});
        }) == "rope_forward: idx[2] = -2 is negative");
  const std::vector<token_t> bad_offsets{0, 7};
  CHECK(error_of([&] {
          cpu::rope_backward<double>(mat(x, 6, 12), idx, 8, 4, 10000.0, RowGroups{bad_offsets.data(), 1});
        }) == "rope_backward: group offsets must be non-decreasing in [0, 6]; offsets[1] = 7");
  CHECK(error_of([&] { cpu::rope_forward<double>(mat(x, 6, 12), no_pos, 8, 4, 0.0); }) ==
        "rope_forward: base = 0 must be > 0");
  for (const double v : x) REQUIRE(v == 0.5);  // nothing written by a rejected call
}

// Token dispatch (gather / weighted scatter-add), per-row top-k and row softmax:
// finite-difference gradients (double), float vs naive loops, duplicates and ties.
#include <catch2/catch.hpp>

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include <mom/backend/cpu.hpp>
#include <mom/routing/dispatch.hpp>

#include "ops/grad_check.hpp"

using namespace mom;
using namespace mom::test;

TEST_CASE("gather_rows: gradient (scatter_add_rows, no weights) matches finite differences", "[ops][dispatch]") {
  Rng rng(40);
  const index_t T = 6, n = 5, d = 3;
  auto in = random_vec(T * d, rng);
  const std::vector<token_t> idx{4, 0, 4, 2, 5};
  const auto proj = random_vec(n * d, rng);
  std::vector<double> out(n * d);
  auto loss = [&] {
    cpu::gather_rows<double>(mat(out, n, d), cmat(in, T, d), idx);
    return dot(proj, out);
  };
  std::vector<double> din(T * d, 0.0);
  cpu::scatter_add_rows<double>(mat(din, T, d), cmat(proj, n, d), idx, {});
  CHECK(rel_error(din, numeric_grad(in, loss)) < fd_tol);
}

TEST_CASE("scatter_add_rows: gradients match finite differences (double)", "[ops][dispatch]") {
  Rng rng(41);
  const index_t T = 5, n = 6, d = 4;
  auto in = random_vec(n * d, rng), w = random_vec(n, rng), base = random_vec(T * d, rng);
  const std::vector<token_t> idx{3, 1, 3, 0, 3, 4};
  const auto proj = random_vec(T * d, rng);
  std::vector<double> out(T * d);
  auto loss = [&] {
    out = base;
    cpu::scatter_add_rows<double>(mat(out, T, d), cmat(in, n, d), idx, w);
    return dot(proj, out);
  };
  std::vector<double> din(n * d, 0.0), dw(n, 0.0);
  cpu::scatter_add_rows_backward<double>(mat(din, n, d), dw, cmat(proj, T, d), cmat(in, n, d), idx, w);
  CHECK(rel_error(din, numeric_grad(in, loss)) < fd_tol);
  CHECK(rel_error(dw, numeric_grad(w, loss)) < fd_tol);
}

TEST_CASE("gather / scatter_add: float vs naive loops, duplicate indices accumulate (parallel size)",
          "[ops][dispatch]") {
  Rng rng(42);
  const index_t T = 128, n = 300, d = 260;
  auto in = random_vec<float>(n * d, rng), w = random_vec<float>(n, rng), table = random_vec<float>(T * d, rng);
  std::vector<token_t> idx(n);
  for (auto& i : idx) i = rng.integer(0, int(T) - 1);  // 300 rows into 128: many duplicates
  idx[0] = idx[1] = idx[2] = 7;

  std::vector<float> gathered(n * d);
  cpu::gather_rows<float>(mat(gathered, n, d), cmat(table, T, d), idx);
  for (index_t i = 0; i < n; ++i)
    for (index_t c = 0; c < d; ++c) REQUIRE(gathered[i * d + c] == table[idx[i] * d + c]);

  std::vector<float> out = table;
  cpu::scatter_add_rows<float>(mat(out, T, d), cmat(in, n, d), idx, w);
  std::vector<double> want(table.begin(), table.end());
  for (index_t i = 0; i < n; ++i)
    for (index_t c = 0; c < d; ++c) want[idx[i] * d + c] += double(w[i]) * in[i * d + c];
  CHECK(rel_error(out, want) < float_tol);
  // Row 7 holds at least the three forced contributions.
  CHECK(out[7 * d] == Approx(want[7 * d]).epsilon(1e-5));
}

TEST_CASE("gather_rows and copy of narrow rows (a selection's weights, a column block of its logits): element by "
          "element", "[ops][dispatch]") {
  Rng rng(8);
  cpu::Backend<float> be;
  const index_t T = 97, n = 5000, wide = 16;
  const auto table = random_vec<float>(T * wide, rng);
  std::vector<token_t> idx(n);
  for (auto& i : idx) i = rng.integer(0, int(T) - 1);
  for (const index_t d : {1, 3, 8, 9}) {  // 9: the memcpy path
    INFO(d << " columns");
    std::vector<float> out(std::size_t(n * d), -1.0f);
    be.gather_rows(mat(out, n, d), MatrixView<const float>{table.data() + 2, T, d, wide}, idx);
    for (index_t i = 0; i < n; ++i)
      for (index_t c = 0; c < d; ++c) REQUIRE(out[std::size_t(i * d + c)] == table[std::size_t(idx[i] * wide + 2 + c)]);
    std::vector<float> block(std::size_t(T * wide), 7.0f);  // into columns [3, 3 + d) of a wider matrix
    be.copy(MatrixView<float>{block.data() + 3, T, d, wide}, MatrixView<const float>{table.data() + 1, T, d, wide});
    for (index_t r = 0; r < T; ++r)
      for (index_t c = 0; c < wide; ++c)
        REQUIRE(block[std::size_t(r * wide + c)] == (c >= 3 && c < 3 + d ? table[std::size_t(r * wide + 1 + c - 3)] : 7.0f));
  }
}

// Large calls list each output row's entries (a counting sort) and give threads whole rows; the additions
// into a row must still be the entries' order, so the result is the literal in-order loop's, bit for bit, on
// 1 and 2 threads (float sums are order-dependent: a row's entries taken in another order differ in the last bits).
TEST_CASE("scatter_add_rows: the entries' order into each row, bit for bit, on 1 and 2 threads, and Store::overwrite", "[ops][dispatch]") {
  Rng rng(43);
  const index_t T = 512, n = 2048, d = 96;  // above the parallel size; ~4 entries per row, some rows none
  const auto in = random_vec<float>(n * d, rng), w = random_vec<float>(n, rng), table = random_vec<float>(T * d, rng);
  std::vector<token_t> idx(n);
  for (auto& i : idx) i = rng.integer(0, int(T) - 2);  // row T - 1 gets no entry
  std::vector<float> want = table, plain = table, want_fresh(std::size_t(T * d), 0.0f), small_fresh = want_fresh;
  for (index_t i = 0; i < n; ++i)
    for (index_t c = 0; c < d; ++c) {
      want[idx[i] * d + c] += w[i] * in[i * d + c], plain[idx[i] * d + c] += in[i * d + c];
      want_fresh[idx[i] * d + c] += w[i] * in[i * d + c];
      if (i < 8) small_fresh[idx[i] * d + c] += w[i] * in[i * d + c];
    }
  const int saved_threads = omp_get_max_threads();
  for (const int threads : {1, 2}) {
    omp_set_num_threads(threads);
    std::vector<float> out = table;
    cpu::scatter_add_rows<float>(mat(out, T, d), cmat(in, n, d), idx, w);
    CHECK(out == want);
    out = table;
    cpu::scatter_add_rows<float>(mat(out, T, d), cmat(in, n, d), idx, std::span<const float>{});
    CHECK(out == plain);
    // Store::overwrite: the same sums onto zeros, whatever out held (NaN here), and row T - 1 zero. Below the
    // parallel size too (the first 8 entries, 768 values), into a column block of a wider matrix.
    out.assign(std::size_t(T * d), std::nanf(""));
    cpu::scatter_add_rows<float>(mat(out, T, d), cmat(in, n, d), idx, w, Store::overwrite);
    CHECK(out == want_fresh);
    std::vector<float> wide(std::size_t(T * 2 * d), std::nanf(""));
    const MatrixView<float> block{wide.data() + d, T, d, 2 * d};
    cpu::scatter_add_rows<float>(block, cmat(in, 8, d), std::span<const token_t>(idx).first(8),
                                 std::span<const float>(w).first(8), Store::overwrite);
    for (index_t r = 0; r < T; ++r)
      for (index_t c = 0; c < d; ++c) {
        REQUIRE(std::isnan(wide[std::size_t(r * 2 * d + c)]));  // outside the block: untouched
        REQUIRE(block(r, c) == small_fresh[std::size_t(r * d + c)]);
      }
  }
  omp_set_num_threads(saved_threads);
}

TEST_CASE("scatter_add_rows: exact values with duplicate indices and weights", "[ops][dispatch]") {
  std::vector<double> out{1, 1, 2, 2, 3, 3};        // T = 3 rows, d = 2
  const std::vector<double> in{1, 2, 10, 20, 100, 200};  // n = 3
  cpu::scatter_add_rows<double>(mat(out, 3, 2), cmat(in, 3, 2), std::vector<token_t>{2, 0, 2}, std::vector<double>{0.5, 2, -1});
  CHECK(out == std::vector<double>{21, 41, 2, 2, 3 + 0.5 - 100, 3 + 1 - 200});
}

TEST_CASE("topk_rows: gradient matches finite differences (double)", "[ops][topk]") {
  Rng rng(43);
  const index_t n = 4, N = 9, k = 3;
  auto x = random_vec(n * N, rng);
  const auto proj = random_vec(n * k, rng);
  std::vector<double> vals(n * k);
  std::vector<token_t> ind(n * k);
  auto loss = [&] {
    cpu::topk_rows<double>(mat(vals, n, k), mat(ind, n, k), cmat(x, n, N));
    return dot(proj, vals);
  };
  loss();
  std::vector<double> dx(n * N, 0.0);
  cpu::topk_rows_backward<double>(mat(dx, n, N), cmat(proj, n, k), cmat(ind, n, k));
  CHECK(rel_error(dx, numeric_grad(x, loss)) < fd_tol);
}

// The naive top-k of one row: k times the largest entry not yet taken, scanning from index 0 (strict > keeps the
// first of equal values): its column indices.
template <class T>
static std::vector<token_t> naive_topk(const T* row, index_t N, index_t k) {
  std::vector<bool> taken(std::size_t(N), false);
  std::vector<token_t> picks;
  for (index_t j = 0; j < k; ++j) {
    index_t best = -1;
    for (index_t c = 0; c < N; ++c)
      if (!taken[std::size_t(c)] && (best < 0 || row[c] > row[best])) best = c;
    taken[std::size_t(best)] = true;
    picks.push_back(token_t(best));
  }
  return picks;
}
// topk_rows' (vals, ind) of one row must be the naive top-k.
static void check_naive_topk(const float* row, index_t N, index_t k, const float* vals, const token_t* ind) {
  const std::vector<token_t> want = naive_topk(row, N, k);
  for (index_t j = 0; j < k; ++j) {
    REQUIRE(ind[j] == want[std::size_t(j)]);
    REQUIRE(vals[j] == row[want[std::size_t(j)]]);
  }
}

TEST_CASE("topk_rows: float vs naive selection, small and large k, ties go to the lower index", "[ops][topk]") {
  Rng rng(44);
  const index_t n = 50, N = 64;
  std::vector<float> x(n * N);
  for (auto& v : x) v = float(rng.integer(0, 9));  // many ties
  for (index_t k : {1, 2, 5, 16, 17, 40, 64}) {
    std::vector<float> vals(n * k);
    std::vector<token_t> ind(n * k);
    cpu::topk_rows<float>(mat(vals, n, k), mat(ind, n, k), cmat(x, n, N));
    for (index_t r = 0; r < n; ++r) check_naive_topk(x.data() + r * N, N, k, vals.data() + r * k, ind.data() + r * k);
  }
  // The routers' widths (SwitchHead's N_A = 4, σ-MoE's 43) and a wide row, ±0 as equal, and a row holding a NaN
  // (whatever is kept: k distinct columns in range).
  for (index_t N2 : {4, 43, 100}) {
    for (index_t k : {1, 2, 4}) {
      std::vector<float> y(n * N2), vals(n * k);
      std::vector<token_t> ind(n * k);
      for (auto& v : y) v = float(rng.integer(-3, 3)) * 0.5f;
      y[0] = -0.0f;
      y[1] = 0.0f;
      y[std::size_t(N2 + 1)] = std::nanf("");  // row 1
      cpu::topk_rows<float>(mat(vals, n, k), mat(ind, n, k), cmat(y, n, N2));
      for (index_t r = 0; r < n; ++r) {
        INFO("N = " << N2 << ", k = " << k << ", row " << r);
        if (r == 1) {  // the NaN row: whatever is kept, k distinct columns in range
          std::vector<token_t> got(ind.begin() + r * k, ind.begin() + (r + 1) * k);
          std::sort(got.begin(), got.end());
          CHECK(std::adjacent_find(got.begin(), got.end()) == got.end());
          CHECK(got.front() >= 0);
          CHECK(got.back() < N2);
          continue;
        }
        check_naive_topk(y.data() + r * N2, N2, k, vals.data() + r * k, ind.data() + r * k);
      }
    }
  }
  std::vector<float> tie{1, 3, 2, 3, 3}, v(3);
  std::vector<token_t> i(3);
  cpu::topk_rows<float>(mat(v, 1, 3), mat(i, 1, 3), cmat(tie, 1, 5));
  CHECK(i == std::vector<token_t>{1, 3, 4});
  CHECK(v == std::vector<float>{3, 3, 3});
}

// k <= 8 runs blocks of 16 rows, one row a vector lane, without branches (cpu/topk.hpp); a row holding a NaN
// goes to the insertion instead. Strided views, rows past the last whole block, ±inf, ±0 and many ties.
template <class T>
static void check_blocked_topk(Rng& rng) {
  const index_t n = 37;
  const T inf = std::numeric_limits<T>::infinity();
  for (index_t N : {2, 9, 16, 43, 70}) {
    const index_t ldx = N + 3;
    std::vector<T> x(std::size_t(n * ldx), T(99));  // the 3 columns past N must never be picked
    for (index_t r = 0; r < n; ++r)
      for (index_t c = 0; c < N; ++c) {
        const int u = rng.integer(-4, 4);
        x[std::size_t(r * ldx + c)] = u == 4 ? inf : u == -4 ? -inf : u == 0 && c % 2 ? T(-0.0) : T(u) * T(0.5);
      }
    for (index_t c = 0; c < N; ++c) x[std::size_t(5 * ldx + c)] = -inf;  // a row of -inf only
    x[std::size_t(11 * ldx + N / 2)] = std::numeric_limits<T>::quiet_NaN();  // a NaN row
    for (index_t k = 1; k <= std::min<index_t>(N, 8); ++k) {
      INFO("N = " << N << ", k = " << k);
      const index_t ldv = k + 2;
      std::vector<T> vals(std::size_t(n * ldv));
      std::vector<token_t> ind(std::size_t(n * ldv));
      cpu::topk_rows<T>({vals.data(), n, k, ldv}, {ind.data(), n, k, ldv}, {x.data(), n, N, ldx});
      for (index_t r = 0; r < n; ++r) {
        INFO("row " << r);
        const T* row = x.data() + r * ldx;
        std::vector<T> want_v(static_cast<std::size_t>(k));
        std::vector<token_t> want_i(static_cast<std::size_t>(k));
        if (r == 11) {
          cpu::detail::topk_insert(row, N, k, want_v.data(), want_i.data());
        } else {
          want_i = naive_topk(row, N, k);
          for (index_t j = 0; j < k; ++j) want_v[std::size_t(j)] = row[want_i[std::size_t(j)]];
        }
        for (index_t j = 0; j < k; ++j) {
          CHECK(ind[std::size_t(r * ldv + j)] == want_i[std::size_t(j)]);
          const T got = vals[std::size_t(r * ldv + j)], want = want_v[std::size_t(j)];
          CHECK((std::isnan(want) ? std::isnan(got) : got == want && std::signbit(got) == std::signbit(want)));
        }
      }
    }
  }
}
TEST_CASE("topk_rows: k <= 8 in blocks of rows equals the naive selection (float, double)", "[ops][topk]") {
  Rng rng(46);
  check_blocked_topk<float>(rng);
  check_blocked_topk<double>(rng);
}

TEST_CASE("softmax_rows: gradient matches finite differences (double), with a scale", "[ops][softmax]") {
  Rng rng(45);
  const index_t n = 3, N = 6;
  const double scale = 1.7;
  auto x = random_vec(n * N, rng, -2, 2);
  const auto proj = random_vec(n * N, rng);
  std::vector<double> y(n * N);
  auto loss = [&] {
    cpu::softmax_rows<double>(mat(y, n, N), cmat(x, n, N), scale);
    return dot(proj, y);
  };
  loss();
  std::vector<double> dx(n * N, 0.0);
  cpu::softmax_rows_backward<double>(mat(dx, n, N), cmat(proj, n, N), cmat(y, n, N), scale);
  CHECK(rel_error(dx, numeric_grad(x, loss)) < fd_tol);
}

TEST_CASE("softmax_rows: float vs naive loops (parallel size), large logits stay finite", "[ops][softmax]") {
  Rng rng(46);
  const index_t n = 200, N = 300;
  auto x = random_vec<float>(n * N, rng, -5, 5);
  x[0] = 1000.f;  // would overflow exp without the max subtraction
  std::vector<float> y(n * N);
  cpu::softmax_rows<float>(mat(y, n, N), cmat(x, n, N), 0.5f);
  std::vector<double> want(n * N);
  for (index_t r = 0; r < n; ++r) {
    double m = -1e300, s = 0;
    for (index_t c = 0; c < N; ++c) m = std::max(m, 0.5 * x[r * N + c]);
    for (index_t c = 0; c < N; ++c) s += std::exp(0.5 * x[r * N + c] - m);
    for (index_t c = 0; c < N; ++c) want[r * N + c] = std::exp(0.5 * x[r * N + c] - m) / s;
  }
  CHECK(rel_error(y, want) < float_tol);
  CHECK(y[0] == Approx(1.0).epsilon(1e-6));
}

// ---- the weights applied after a routed product (weight_rows_backward, dispatch::weigh_after_products) ----

namespace {
// The CPU backend without the optional weight_rows_backward: combine_linear_backward's other path.
struct WeighsInPacking : cpu::Backend<double> {
  void weight_rows_backward(MatrixView<double>, std::span<double>, MatrixView<const double>, MatrixView<const double>,
                            std::span<const token_t>, std::span<const double>, RowGroups, bool) const = delete;
};
static_assert(dispatch::WeighsAfterProducts<cpu::Backend<double>, double>);
static_assert(dispatch::WeighsAfterProducts<cpu::Backend<float>, float>);
static_assert(dispatch::ReadsScaledRows<WeighsInPacking, double> && !dispatch::WeighsAfterProducts<WeighsInPacking, double>);

// 9 routed rows of 6 tokens: rows 0..1 in group 0, 2..6 in group 1, rows 7..8 in no group (a SKIP class).
const std::vector<token_t> wr_offsets{0, 2, 7};
const RowGroups wr_groups{wr_offsets.data(), 2};
const std::vector<token_t> wr_token{5, 1, 0, 1, 3, 3, 4, 2, 2};
constexpr index_t wr_rows = 9, wr_tokens = 6;
}  // namespace

TEST_CASE("weight_rows_backward: the groups' rows against loops, a through an index or its own rows, ReLU, in place",
          "[ops][dispatch]") {
  Rng rng(47);
  const index_t c = 5, ta = 7;
  const auto u = random_vec(std::size_t(wr_rows * c), rng), w = random_vec(std::size_t(wr_rows), rng);
  const auto table = random_vec(std::size_t(ta * c), rng), own = random_vec(std::size_t(wr_rows * c), rng);
  const std::vector<token_t> idx{6, 0, 3, 3, 1, 5, 2, 4, 0};
  cpu::Backend<double> be;
  for (const bool gathered : {false, true})
    for (const bool relu : {false, true})
      for (const bool in_place : {false, true}) {
        INFO("a gathered " << gathered << ", relu " << relu << ", in place " << in_place);
        const auto a = gathered ? cmat(table, ta, c) : cmat(own, wr_rows, c);
        std::vector<double> d(std::size_t(wr_rows * c), -9.0), dwp(std::size_t(wr_rows), -9.0), uu = u;
        be.weight_rows_backward(in_place ? mat(uu, wr_rows, c) : mat(d, wr_rows, c), dwp, cmat(uu, wr_rows, c), a,
                                gathered ? std::span<const token_t>(idx) : std::span<const token_t>{}, w, wr_groups, relu);
        const auto& out = in_place ? uu : d;
        for (index_t r = 0; r < wr_rows; ++r) {
          const double* ar = a.row(gathered ? idx[std::size_t(r)] : r);
          double dot_r = 0;
          for (index_t j = 0; j < c; ++j) dot_r += u[std::size_t(r * c + j)] * ar[j];
          const bool in_group = r < 7;
          CHECK(dwp[std::size_t(r)] == Approx(in_group ? dot_r : -9.0).epsilon(1e-14));
          for (index_t j = 0; j < c; ++j) {
            const double want = !in_group ? (in_place ? u[std::size_t(r * c + j)] : -9.0)
                                          : (relu && !(ar[j] > 0) ? 0.0 : w[std::size_t(r)] * u[std::size_t(r * c + j)]);
            CHECK(out[std::size_t(r * c + j)] == Approx(want).epsilon(1e-14));
          }
        }
      }
  std::vector<double> d(std::size_t(wr_rows * c));
  std::vector<token_t> bad = idx;
  bad[4] = token_t(ta);
  CHECK_THROWS_WITH(be.weight_rows_backward(mat(d, wr_rows, c), {}, cmat(u, wr_rows, c), cmat(table, ta, c), bad, w,
                                            wr_groups, false),
                    Catch::Contains("weight_rows_backward: idx[4] = 7 is out of range [0, 7)"));
  CHECK_THROWS_WITH(be.weight_rows_backward(mat(d, wr_rows, c), {}, cmat(u, wr_rows, c), cmat(table, ta, c - 1), {}, w,
                                            wr_groups, false),
                    Catch::Contains("weight_rows_backward: a [7x4] and 0 row indices for u [9x5]"));
  std::vector<double> short_dwp(3);  // checked over all rows before the groups' part is cut
  CHECK_THROWS_WITH(be.weight_rows_backward(mat(d, wr_rows, c), short_dwp, cmat(u, wr_rows, c), cmat(own, wr_rows, c), {},
                                            w, wr_groups, false),
                    Catch::Contains("weight_rows_backward: 3 dwp entries for u [9x5]"));
  CHECK_THROWS_WITH(be.weight_rows_backward(mat(d, wr_rows, c), {}, cmat(u, wr_rows, c), cmat(own, wr_rows, c), {},
                                            std::span<const double>(w).first(4), wr_groups, false),
                    Catch::Contains("weight_rows_backward: 4 weights for u [9x5]"));
}

// combine_linear_backward with the weights applied after the product (x narrower than y) against its scaled-rows path
// (the weights in the packing: WeighsInPacking), and the ReLU form against that path followed by relu_backward: the
// same gradients to rounding (not the same bits: the weight multiplies a sum instead of each term, and dL/d(weight)
// sums over x's columns instead of y's). x wider than y keeps the scaled-rows path, bit for bit.
TEST_CASE("weigh_after_products: the gradients of combine_linear_backward's other path, with and without ReLU",
          "[ops][dispatch]") {
  Rng rng(48);
  const index_t wide = 7;
  for (const index_t in : {index_t(3), index_t(11)})
    for (const bool gathered : {false, true}) {
      INFO("x " << in << " wide (y " << wide << "), gathered " << gathered);
      const auto table = random_vec(std::size_t(wr_tokens * in), rng), own = random_vec(std::size_t(wr_rows * in), rng);
      const auto xr = gathered ? cmat(table, wr_tokens, in) : cmat(own, wr_rows, in);
      const std::span<const token_t> x_idx = gathered ? std::span<const token_t>(wr_token) : std::span<const token_t>{};
      const auto w = random_vec(std::size_t(2 * wide * in), rng), wt = random_vec(std::size_t(wr_rows), rng);
      const auto dout = random_vec(std::size_t(wr_tokens * wide), rng), y = random_vec(std::size_t(wr_rows * wide), rng);
      const dispatch::RoutedRows<double> rr{wr_token, {}, wt, wr_groups};
      const auto wg = uniform_groups<const double>(w.data(), 2, wide * in);
      // y as the forward made it (combine_backward's dL/d(weight) reads y): y[r] = x[r] W_gᵀ on the groups' rows.
      std::vector<double> yv = y;
      cpu::Backend<double> be;
      if (gathered) be.grouped_linear_forward(mat(yv, wr_rows, wide), xr, x_idx, wg, PerGroup<const double>{}, wr_groups);
      else be.grouped_linear_forward(mat(yv, wr_rows, wide), xr, wg, PerGroup<const double>{}, wr_groups);
      auto run = [&](auto& b, std::vector<double>& dx, std::vector<double>& dw, std::vector<double>& dwp) {
        std::vector<double> dy(std::size_t(wr_rows * wide));
        dx.assign(std::size_t(wr_rows * in), -5.0), dw.assign(w.size(), 0.25), dwp.assign(std::size_t(wr_rows), -5.0);
        dispatch::combine_linear_backward(b, rr, cmat(yv, wr_rows, wide), cmat(dout, wr_tokens, wide), mat(dy, wr_rows, wide),
                                          std::span<double>(dwp), mat(dx, wr_rows, in),
                                          uniform_groups(dw.data(), 2, wide * in), xr, x_idx, wg, Store::overwrite);
      };
      WeighsInPacking ref_be;
      std::vector<double> dx_ref, dw_ref, dwp_ref, dx, dw, dwp;
      run(ref_be, dx_ref, dw_ref, dwp_ref);
      run(be, dx, dw, dwp);
      if (in < wide) {
        CHECK(rel_error(dx, dx_ref) < 1e-14);
        CHECK(rel_error(dw, dw_ref) < 1e-14);
        CHECK(rel_error(dwp, dwp_ref) < 1e-14);
        CHECK(dwp[7] == 0.0);  // a row in no group: zero, as combine_backward leaves it
      } else {
        CHECK(dx == dx_ref);
        CHECK(dw == dw_ref);
        CHECK(dwp == dwp_ref);
      }
      // The ReLU form: x = ReLU(h), dh written instead of dx (x's own rows only: the expert MLP's W₂).
      if (gathered) continue;
      std::vector<double> h = own;
      for (std::size_t i = 0; i < h.size(); i += 3) h[i] = -h[i] - 0.5;  // some negative
      std::vector<double> act(h.size());
      be.relu_forward(std::span<double>(act), std::span<const double>(h));
      std::vector<double> yr(std::size_t(wr_rows * wide));
      be.grouped_linear_forward(mat(yr, wr_rows, wide), cmat(act, wr_rows, in), wg, PerGroup<const double>{}, wr_groups);
      std::vector<double> dact(std::size_t(wr_rows * in)), dh_ref(dact.size(), -5.0), dw2_ref(w.size(), 0.25),
          dwp2_ref(std::size_t(wr_rows), 0.0), dy(std::size_t(wr_rows * wide), 0.0);
      dispatch::combine_linear_backward(ref_be, rr, cmat(yr, wr_rows, wide), cmat(dout, wr_tokens, wide),
                                        mat(dy, wr_rows, wide), std::span<double>(dwp2_ref), mat(dact, wr_rows, in),
                                        uniform_groups(dw2_ref.data(), 2, wide * in), cmat(act, wr_rows, in),
                                        std::span<const token_t>{}, wg, Store::overwrite);
      ref_be.relu_backward(std::span<double>(dh_ref).first(std::size_t(7 * in)), std::span<const double>(h).first(std::size_t(7 * in)),
                           std::span<const double>(dact).first(std::size_t(7 * in)), Store::overwrite);
      std::vector<double> u(dact.size()), dh(dact.size(), -5.0), dw2(w.size(), 0.25), dwp2(std::size_t(wr_rows), -5.0);
      dispatch::weigh_after_products(be, rr, cmat(dout, wr_tokens, wide), std::span<double>(dwp2), mat(u, wr_rows, in),
                                     mat(dh, wr_rows, in), uniform_groups(dw2.data(), 2, wide * in), cmat(act, wr_rows, in),
                                     std::span<const token_t>{}, wg, true);
      CHECK(rel_error(dh, dh_ref) < 1e-14);
      CHECK(rel_error(dw2, dw2_ref) < 1e-14);
      CHECK(rel_error(dwp2, dwp2_ref) < 1e-14);
      for (std::size_t i = 0; i < std::size_t(7 * in); ++i)
        if (!(h[i] > 0)) CHECK(dh[i] == 0.0);
    }
}

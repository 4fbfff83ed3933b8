// The grouped ops (core/groups.hpp, backend/cpu/grouped.hpp): gradients by central differences in
// double, each group with its own parameters, rows outside the groups untouched, bad offsets
// rejected. The CUDA kernels are compared with these in tests/cuda/cuda_grouped_*_test.cpp.
#include <catch2/catch.hpp>

#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <mom/backend/cpu.hpp>

#include "ops/grad_check.hpp"

using namespace mom;
using test::Rng;

namespace {

using Be = cpu::Backend<double>;
// 11 packed rows: row 0 before the groups, group 0 = rows 1..3, group 1 empty, group 2 = rows 4..8,
// rows 9..10 after them (a SKIP class).
const std::vector<token_t> offsets{1, 4, 4, 9};
constexpr index_t R = 11;
constexpr int G = 3;
const RowGroups groups{offsets.data(), G};
bool grouped(index_t r) { return r >= 1 && r < 9; }

// Group g's tensor of `size` elements at g·(size + 3) (gaps, so the table is really used).
template <class T>
PerGroup<T> per_group(T* base, index_t size) {
  return PerGroup<T>(base, G, [&](int g) { return g * (size + 3); });
}

// Σ c ⊙ y over the grouped rows (the loss whose gradient dy = c on those rows).
double weighted_sum(const std::vector<double>& y, const std::vector<double>& c, index_t cols) {
  double s = 0;
  for (index_t r = 0; r < R; ++r)
    if (grouped(r))
      for (index_t j = 0; j < cols; ++j) s += y[std::size_t(r * cols + j)] * c[std::size_t(r * cols + j)];
  return s;
}

}  // namespace

TEST_CASE("grouped_linear: gradients match finite differences, each group uses its own weights", "[ops][grouped]") {
  Rng rng(91);
  const index_t in = 5, out = 4, stride = out * in + 3, bstride = out + 3;
  auto x = test::random_vec(std::size_t(R * in), rng), w = test::random_vec(std::size_t(G * stride), rng);
  auto b = test::random_vec(std::size_t(G * bstride), rng), c = test::random_vec(std::size_t(R * out), rng);
  Be be;
  const double sentinel = -7.25;
  auto forward = [&] {
    std::vector<double> y(std::size_t(R * out), sentinel);
    be.grouped_linear_forward(test::mat(y, R, out), test::cmat(x, R, in), per_group<const double>(w.data(), out * in),
                              per_group<const double>(b.data(), out), groups);
    return y;
  };
  const auto y = forward();
  for (index_t r : {0, 9, 10})
    for (index_t j = 0; j < out; ++j) CHECK(y[std::size_t(r * out + j)] == sentinel);
  // Row 5 (group 2) against a hand product with group 2's weights.
  for (index_t j = 0; j < out; ++j) {
    double want = b[std::size_t(2 * bstride + j)];
    for (index_t k = 0; k < in; ++k) want += w[std::size_t(2 * stride + j * in + k)] * x[std::size_t(5 * in + k)];
    CHECK(y[std::size_t(5 * out + j)] == Approx(want).epsilon(1e-14));
  }
  std::vector<double> dx(x.size(), 0.5), dw(w.size(), 0.25), db(b.size(), 0.125);
  be.grouped_linear_backward(test::mat(dx, R, in), per_group(dw.data(), out * in), per_group(db.data(), out),
                             test::cmat(c, R, out), test::cmat(x, R, in), per_group<const double>(w.data(), out * in),
                             groups);
  auto loss = [&] { return weighted_sum(forward(), c, out); };
  auto shifted = [](std::vector<double> g, double by) {
    for (auto& v : g) v -= by;  // backward accumulates onto the initial values
    return g;
  };
  auto num_x = test::numeric_grad(x, loss), num_w = test::numeric_grad(w, loss), num_b = test::numeric_grad(b, loss);
  CHECK(test::rel_error(shifted(dx, 0.5), num_x) < test::fd_tol);
  CHECK(test::rel_error(shifted(dw, 0.25), num_w) < test::fd_tol);
  CHECK(test::rel_error(shifted(db, 0.125), num_b) < test::fd_tol);
  // The empty group's weights and the rows outside the groups get nothing.
  for (index_t i = 0; i < out * in; ++i) CHECK(dw[std::size_t(stride + i)] == 0.25);
  for (index_t k = 0; k < in; ++k) CHECK(dx[std::size_t(9 * in + k)] == 0.5);
}

TEST_CASE("grouped_layernorm: gradients match finite differences, gamma/beta per group", "[ops][grouped]") {
  Rng rng(92);
  const index_t d = 6;
  auto x = test::random_vec(std::size_t(R * d), rng, -2, 2), gamma = test::random_vec(std::size_t(G * (d + 3)), rng);
  auto beta = test::random_vec(std::size_t(G * (d + 3)), rng), c = test::random_vec(std::size_t(R * d), rng);
  Be be;
  std::vector<double> mean(R), rstd(R);
  auto forward = [&] {
    std::vector<double> y(std::size_t(R * d), 0.0);
    be.grouped_layernorm_forward(test::mat(y, R, d), mean, rstd, test::cmat(x, R, d),
                                 per_group<const double>(gamma.data(), d), per_group<const double>(beta.data(), d),
                                 groups);
    return y;
  };
  forward();
  std::vector<double> dx(x.size(), 0.0), dgamma(gamma.size(), 0.0), dbeta(beta.size(), 0.0);
  be.grouped_layernorm_backward(test::mat(dx, R, d), per_group(dgamma.data(), d), per_group(dbeta.data(), d),
                                test::cmat(c, R, d), test::cmat(x, R, d), mean, rstd,
                                per_group<const double>(gamma.data(), d), groups);
  auto loss = [&] { return weighted_sum(forward(), c, d); };
  CHECK(test::rel_error(dx, test::numeric_grad(x, loss)) < test::fd_tol);
  CHECK(test::rel_error(dgamma, test::numeric_grad(gamma, loss)) < test::fd_tol);
  CHECK(test::rel_error(dbeta, test::numeric_grad(beta, loss)) < test::fd_tol);
}

TEST_CASE("attention_grouped: gradients match finite differences, keys per group or the group's own rows",
          "[ops][grouped]") {
  Rng rng(93);
  const index_t d = 4, heads = 2, seq = 6, n = 12;  // 2 sequences of 6 tokens
  // Query tokens per packed row (ascending inside each group); row 0 and rows 9..10 are outside.
  const std::vector<token_t> q_tok{0, 1, 3, 7, 0, 2, 5, 6, 11, 4, 8};
  for (const bool own_keys : {false, true}) {
    INFO((own_keys ? "each group's own rows as keys" : "every token's keys, per group"));
    const index_t kv_rows = own_keys ? R : n, ld = 2 * d;
    auto q = test::random_vec(std::size_t(R * d), rng);
    auto kv = test::random_vec(std::size_t(own_keys ? R * ld : G * (kv_rows * ld + 3)), rng);
    auto c = test::random_vec(std::size_t(R * d), rng);
    auto kv_of = [&](double* p) {
      return own_keys ? PerGroup<double>(p, G, [](int) { return 0; }) : per_group(p, kv_rows * ld);
    };
    Be be;
    std::vector<double> lse(std::size_t(R * heads));
    const std::span<const token_t> k_tok = own_keys ? std::span<const token_t>(q_tok) : std::span<const token_t>{};
    auto forward = [&] {
      std::vector<double> out(std::size_t(R * d), 0.0);
      const PerGroup<const double> k = kv_of(kv.data());
      be.attention_grouped_forward(test::mat(out, R, d), lse, test::cmat(q, R, d), k, k.plus(d), kv_rows, ld, q_tok,
                                   k_tok, groups, seq, heads);
      return out;
    };
    const auto out = forward();
    std::vector<double> dq(q.size(), 0.0), dkv(kv.size(), 0.0);
    const PerGroup<double> dk = kv_of(dkv.data());
    const PerGroup<const double> k = kv_of(kv.data());
    be.attention_grouped_backward(test::mat(dq, R, d), dk, dk.plus(d), test::cmat(c, R, d), test::cmat(out, R, d), lse,
                                  test::cmat(q, R, d), k, k.plus(d), kv_rows, ld, q_tok, k_tok, groups, seq, heads);
    auto loss = [&] { return weighted_sum(forward(), c, d); };
    CHECK(test::rel_error(dq, test::numeric_grad(q, loss)) < test::fd_tol);
    CHECK(test::rel_error(dkv, test::numeric_grad(kv, loss)) < test::fd_tol);
  }
}

TEST_CASE("grouped ops: row ops stay inside the groups, bad offsets are rejected", "[ops][grouped]") {
  Be be;
  const index_t d = 3;
  std::vector<double> a(std::size_t(R * d), 1.0), b(std::size_t(R * d), 2.0), out(std::size_t(R * d), -1.0);
  be.add_forward(test::mat(out, R, d), test::cmat(a, R, d), test::cmat(b, R, d), groups);
  be.axpy(test::mat(out, R, d), 0.5, test::cmat(b, R, d), groups);
  for (index_t r = 0; r < R; ++r) CHECK(out[std::size_t(r * d)] == (grouped(r) ? 4.0 : -1.0));
  const std::vector<token_t> bad{0, 5, 3, 9};  // decreasing
  CHECK_THROWS_WITH(be.zero_rows(test::mat(out, R, d), RowGroups{bad.data(), 3}),
                    Catch::Contains("zero_rows: group offsets must be non-decreasing in [0, 11]; offsets[2] = 3"));
  const std::vector<token_t> past{0, 12};
  CHECK_THROWS_WITH(be.gelu_forward(test::mat(out, R, d), test::cmat(a, R, d), RowGroups{past.data(), 1}),
                    Catch::Contains("offsets[1] = 12"));
}

// Many groups spread over the threads (backend/cpu/grouped.hpp, for_each_group_spread): each thread runs whole
// groups on its own, and every group's result is the same bits as when the groups run one after another with
// every thread on each product. Weight gradients that several groups share (same_for_groups) keep the sequential
// order.
TEST_CASE("grouped_linear: groups spread over the threads give the sequential results bit for bit", "[ops][grouped]") {
  using F = cpu::Backend<float>;
  const int saved_threads = omp_get_max_threads();
  omp_set_num_threads(2);
  Rng rng(17);
  constexpr int E = 24;
  const index_t in = 96, out = 64;
  std::vector<token_t> off{0};
  for (int e = 0; e < E; ++e) off.push_back(off.back() + token_t(90 + 7 * (e % 5)));  // 90..118 rows each
  const index_t rows = off.back();
  const RowGroups g{off.data(), E};
  std::array<int, max_row_groups> order{};
  const int m = cpu::detail::groups_by_size(g, order);
  REQUIRE(m == E);
  CHECK(off[std::size_t(order[0]) + 1] - off[std::size_t(order[0])] == 118);  // largest first
  CHECK(cpu::detail::spreads_evenly(g, order, m, 2));
  CHECK_FALSE(cpu::detail::spreads_evenly(g, order, m, 1));
  const std::vector<token_t> lopsided{0, 2000, 2010, 2020, 2030, 2040};  // one group holds 98% of the rows
  const int ml = cpu::detail::groups_by_size(RowGroups{lopsided.data(), 5}, order);
  CHECK_FALSE(cpu::detail::spreads_evenly(RowGroups{lopsided.data(), 5}, order, ml, 2));

  auto to_float = [](const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); };
  const auto x = to_float(test::random_vec(std::size_t(rows * in), rng));
  const auto w = to_float(test::random_vec(std::size_t(E * out * in), rng));
  const auto dy = to_float(test::random_vec(std::size_t(rows * out), rng));
  const auto wg = uniform_groups<const float>(w.data(), E, out * in);
  F be;
  const MatrixView<const float> X{x.data(), rows, in}, DY{dy.data(), rows, out};

  // Forward: grouped against one plain linear per group.
  std::vector<float> y(std::size_t(rows * out)), y_ref(y.size());
  be.grouped_linear_forward(MatrixView<float>{y.data(), rows, out}, X, wg, PerGroup<const float>{}, g);
  for (int e = 0; e < E; ++e) {
    const index_t o = off[std::size_t(e)], n = off[std::size_t(e) + 1] - o;
    be.linear_forward(MatrixView<float>{y_ref.data(), rows, out}.row_block(o, n), X.row_block(o, n), {wg[e], out, in},
                      std::span<const float>{});
  }
  CHECK(y == y_ref);

  // Backward, own weight gradients (spread) and one shared gradient (sequential), each against plain calls.
  for (const bool shared : {false, true}) {
    CAPTURE(shared);
    std::vector<float> dx(std::size_t(rows * in), 0.5f), dx_ref(dx), dw(std::size_t(E * out * in), 0.25f), dw_ref(dw);
    const auto dwg = shared ? same_for_groups(dw.data(), E) : uniform_groups(dw.data(), E, out * in);
    be.grouped_linear_backward(MatrixView<float>{dx.data(), rows, in}, dwg, PerGroup<float>{}, DY, X, wg, g);
    for (int e = 0; e < E; ++e) {
      const index_t o = off[std::size_t(e)], n = off[std::size_t(e) + 1] - o;
      be.linear_backward(MatrixView<float>{dx_ref.data(), rows, in}.row_block(o, n),
                         {dw_ref.data() + (shared ? 0 : e * out * in), out, in}, std::span<float>{}, DY.row_block(o, n),
                         X.row_block(o, n), {wg[e], out, in});
    }
    CHECK(dx == dx_ref);
    CHECK(dw == dw_ref);
  }
  omp_set_num_threads(saved_threads);
}

// Store::overwrite (core/tensor.hpp): the backward ops write their gradient instead of adding it, so a fresh buffer
// needs no zeroing pass. Written over NaN, the result equals the accumulating op's on a zeroed buffer, bit for bit;
// grouped ops leave the rows outside the groups as they were.
TEST_CASE("backward ops with Store::overwrite equal accumulation into zeros, rows outside the groups untouched",
          "[ops][grouped]") {
  Rng rng(23);
  Be be;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const index_t n = 37;
  const auto x = test::random_vec(std::size_t(n), rng), dout = test::random_vec(std::size_t(n), rng);
  for (const bool gelu : {false, true}) {
    CAPTURE(gelu);
    std::vector<double> acc(std::size_t(n), 0.0), over(std::size_t(n), nan);
    const auto run = [&](std::vector<double>& dx, Store st) {
      if (gelu) be.gelu_backward(std::span<double>(dx), std::span<const double>(x), std::span<const double>(dout), st);
      else be.relu_backward(std::span<double>(dx), std::span<const double>(x), std::span<const double>(dout), st);
    };
    run(acc, Store::add);
    run(over, Store::overwrite);
    CHECK(over == acc);
  }

  // Weighted scatter backward, plain (every row) and grouped (the rows of `groups`).
  const index_t d = 3, Tn = 5;
  const auto table = test::random_vec(std::size_t(Tn * d), rng), in = test::random_vec(std::size_t(R * d), rng);
  const auto w = test::random_vec(std::size_t(R), rng);
  std::vector<token_t> idx(static_cast<std::size_t>(R));
  for (auto& i : idx) i = token_t(rng.integer(0, int(Tn) - 1));
  for (const bool grouped_op : {false, true}) {
    CAPTURE(grouped_op);
    std::vector<double> din_acc(std::size_t(R * d), 0.0), dw_acc(std::size_t(R), 0.0);
    std::vector<double> din(std::size_t(R * d), nan), dwts(std::size_t(R), nan);
    const auto run = [&](std::vector<double>& a, std::vector<double>& b, Store st) {
      if (grouped_op)
        be.scatter_add_rows_backward(test::mat(a, R, d), std::span<double>(b), test::cmat(table, Tn, d), test::cmat(in, R, d),
                                     idx, std::span<const double>(w), groups, st);
      else
        be.scatter_add_rows_backward(test::mat(a, R, d), std::span<double>(b), test::cmat(table, Tn, d), test::cmat(in, R, d),
                                     idx, std::span<const double>(w), st);
    };
    run(din_acc, dw_acc, Store::add);
    run(din, dwts, Store::overwrite);
    for (index_t r = 0; r < R; ++r) {
      const bool written = !grouped_op || grouped(r);
      CHECK(std::isnan(dwts[std::size_t(r)]) == !written);
      if (written) CHECK(dwts[std::size_t(r)] == dw_acc[std::size_t(r)]);
      for (index_t c = 0; c < d; ++c) {
        const double v = din[std::size_t(r * d + c)];
        if (written) CHECK(v == din_acc[std::size_t(r * d + c)]);
        else CHECK(std::isnan(v));
      }
    }
  }

  // Grouped linear backward: dx overwritten on the groups' rows, dW and db still accumulate.
  const index_t fin = 4, fout = 3;
  const auto xx = test::random_vec(std::size_t(R * fin), rng), dy = test::random_vec(std::size_t(R * fout), rng);
  const auto ww = test::random_vec(std::size_t(G * (fout * fin + 3)), rng);
  std::vector<double> dx_acc(std::size_t(R * fin), 0.0), dx(std::size_t(R * fin), nan);
  std::vector<double> dw1(std::size_t(G * (fout * fin + 3)), 0.5), dw2(dw1);
  be.grouped_linear_backward(test::mat(dx_acc, R, fin), per_group(dw1.data(), fout * fin), PerGroup<double>{},
                             test::cmat(dy, R, fout), test::cmat(xx, R, fin), per_group<const double>(ww.data(), fout * fin),
                             groups);
  be.grouped_linear_backward(test::mat(dx, R, fin), per_group(dw2.data(), fout * fin), PerGroup<double>{},
                             test::cmat(dy, R, fout), test::cmat(xx, R, fin), per_group<const double>(ww.data(), fout * fin),
                             groups, Store::overwrite);
  CHECK(dw2 == dw1);
  for (index_t r = 0; r < R; ++r)
    for (index_t c = 0; c < fin; ++c) {
      const double v = dx[std::size_t(r * fin + c)];
      if (grouped(r)) CHECK(v == dx_acc[std::size_t(r * fin + c)]);
      else CHECK(std::isnan(v));
    }

  // Grouped GELU backward and grouped LayerNorm backward (dx; dgamma and dbeta still accumulate).
  const auto check_rows = [&](const std::vector<double>& over, const std::vector<double>& acc, index_t cols) {
    for (index_t r = 0; r < R; ++r)
      for (index_t c = 0; c < cols; ++c) {
        const double v = over[std::size_t(r * cols + c)];
        if (grouped(r)) CHECK(v == acc[std::size_t(r * cols + c)]);
        else CHECK(std::isnan(v));
      }
  };
  {
    std::vector<double> acc(std::size_t(R * fin), 0.0), over(std::size_t(R * fin), nan);
    be.gelu_backward(test::mat(acc, R, fin), test::cmat(xx, R, fin), test::cmat(xx, R, fin), groups);
    be.gelu_backward(test::mat(over, R, fin), test::cmat(xx, R, fin), test::cmat(xx, R, fin), groups, Store::overwrite);
    check_rows(over, acc, fin);
  }
  {
    std::vector<double> mean(R), rstd(R), ln(std::size_t{R * fin});
    be.grouped_layernorm_forward(test::mat(ln, R, fin), std::span<double>(mean), std::span<double>(rstd),
                                 test::cmat(xx, R, fin), per_group<const double>(ww.data(), fin),
                                 per_group<const double>(ww.data() + 1, fin), groups);
    std::vector<double> acc(std::size_t(R * fin), 0.0), over(std::size_t(R * fin), nan);
    std::vector<double> dg1(std::size_t(G * (fout * fin + 3)), 0.25), dg2(dg1);
    for (const bool overwrite : {false, true})
      be.grouped_layernorm_backward(test::mat(overwrite ? over : acc, R, fin), per_group((overwrite ? dg2 : dg1).data(), fin),
                                    PerGroup<double>{}, test::cmat(ln, R, fin), test::cmat(xx, R, fin),
                                    std::span<const double>(mean), std::span<const double>(rstd),
                                    per_group<const double>(ww.data(), fin), groups,
                                    overwrite ? Store::overwrite : Store::add);
    CHECK(dg2 == dg1);
    check_rows(over, acc, fin);
  }
}

// The gathered grouped linear (grouped_linear_forward / _backward with a row list): packed row r reads x's row idx[r]
// inside the GEMM's packing. It equals the gather followed by the plain grouped op, bit for bit, in double (Eigen)
// and in float (mom's GEMM, groups spread over the threads); an index out of range is one clear error.
TEST_CASE("grouped_linear over gathered rows equals gather + grouped_linear, bit for bit", "[ops][grouped]") {
  Rng rng(29);
  const index_t in = 6, out = 5, Tn = 7;
  auto table = test::random_vec(std::size_t(Tn * in), rng), w = test::random_vec(std::size_t(G * (out * in + 3)), rng);
  auto b = test::random_vec(std::size_t(G * (out + 3)), rng), dy = test::random_vec(std::size_t(R * out), rng);
  std::vector<token_t> idx(static_cast<std::size_t>(R), -1);  // -1 outside the groups: never read
  for (index_t r = 1; r < 9; ++r) idx[std::size_t(r)] = token_t(rng.integer(0, int(Tn) - 1));
  Be be;
  std::vector<double> xg(std::size_t(R * in), 0.0);
  for (index_t r = 1; r < 9; ++r)
    std::copy_n(table.data() + idx[std::size_t(r)] * in, in, xg.data() + r * in);
  const auto wg = per_group<const double>(w.data(), out * in);
  const auto bg = per_group<const double>(b.data(), out);
  std::vector<double> y_ref(std::size_t(R * out), -7.25), y(y_ref);
  be.grouped_linear_forward(test::mat(y_ref, R, out), test::cmat(xg, R, in), wg, bg, groups);
  be.grouped_linear_forward(test::mat(y, R, out), test::cmat(table, Tn, in), idx, wg, bg, groups);
  CHECK(y == y_ref);
  std::vector<double> dx_ref(std::size_t(R * in), 0.25), dx(dx_ref), dw_ref(w.size(), 0.5), dw(dw_ref),
      db_ref(b.size(), 0.75), db(db_ref);
  be.grouped_linear_backward(test::mat(dx_ref, R, in), per_group(dw_ref.data(), out * in), per_group(db_ref.data(), out),
                             test::cmat(dy, R, out), test::cmat(xg, R, in), wg, groups);
  be.grouped_linear_backward(test::mat(dx, R, in), per_group(dw.data(), out * in), per_group(db.data(), out),
                             test::cmat(dy, R, out), test::cmat(table, Tn, in), idx, wg, groups);
  CHECK(dx == dx_ref);
  CHECK(dw == dw_ref);
  CHECK(db == db_ref);
  idx[4] = token_t(Tn);
  CHECK_THROWS_WITH(be.grouped_linear_forward(test::mat(y, R, out), test::cmat(table, Tn, in), idx, wg, bg, groups),
                    Catch::Contains("grouped_linear_forward: idx[4] = 7 is out of range [0, 7) for x [7x6]"));
  CHECK_THROWS_WITH(be.grouped_linear_forward(test::mat(y, R, out), test::cmat(table, Tn, in),
                                              std::span<const token_t>(idx).first(5), wg, bg, groups),
                    Catch::Contains("grouped_linear_forward: 5 row indices for y [11x5]"));

  // Float: mom's GEMM with the row list in its packing, 24 groups spread over 2 threads.
  using F = cpu::Backend<float>;
  const int saved_threads = omp_get_max_threads();
  omp_set_num_threads(2);
  constexpr int E = 24;
  const index_t fin = 96, fout = 64, n = 512;
  std::vector<token_t> off{0};
  for (int e = 0; e < E; ++e) off.push_back(off.back() + token_t(90 + 7 * (e % 5)));
  const index_t rows = off.back();
  const RowGroups fg{off.data(), E};
  std::vector<token_t> fidx(static_cast<std::size_t>(rows));
  for (auto& i : fidx) i = token_t(rng.integer(0, int(n) - 1));
  auto to_float = [](const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); };
  const auto fx = to_float(test::random_vec(std::size_t(n * fin), rng));
  const auto fw = to_float(test::random_vec(std::size_t(E * fout * fin), rng));
  const auto fdy = to_float(test::random_vec(std::size_t(rows * fout), rng));
  std::vector<float> fxg(std::size_t(rows * fin));
  for (index_t r = 0; r < rows; ++r) std::copy_n(fx.data() + fidx[std::size_t(r)] * fin, fin, fxg.data() + r * fin);
  F fbe;
  const auto fwg = uniform_groups<const float>(fw.data(), E, fout * fin);
  std::vector<float> fy_ref(std::size_t(rows * fout)), fy(fy_ref.size());
  fbe.grouped_linear_forward(MatrixView<float>{fy_ref.data(), rows, fout}, MatrixView<const float>{fxg.data(), rows, fin},
                             fwg, PerGroup<const float>{}, fg);
  fbe.grouped_linear_forward(MatrixView<float>{fy.data(), rows, fout}, MatrixView<const float>{fx.data(), n, fin}, fidx,
                             fwg, PerGroup<const float>{}, fg);
  CHECK(fy == fy_ref);
  std::vector<float> fdx_ref(std::size_t(rows * fin)), fdx(fdx_ref.size()), fdw_ref(fw.size(), 0.5f), fdw(fdw_ref);
  fbe.grouped_linear_backward(MatrixView<float>{fdx_ref.data(), rows, fin}, uniform_groups(fdw_ref.data(), E, fout * fin),
                              PerGroup<float>{}, MatrixView<const float>{fdy.data(), rows, fout},
                              MatrixView<const float>{fxg.data(), rows, fin}, fwg, fg, Store::overwrite);
  fbe.grouped_linear_backward(MatrixView<float>{fdx.data(), rows, fin}, uniform_groups(fdw.data(), E, fout * fin),
                              PerGroup<float>{}, MatrixView<const float>{fdy.data(), rows, fout},
                              MatrixView<const float>{fx.data(), n, fin}, fidx, fwg, fg, Store::overwrite);
  CHECK(fdx == fdx_ref);
  CHECK(fdw == fdw_ref);

  // Groups of at most 8 rows: their products take the GEMM's few-rows path (gemv), rows read through the list too.
  const std::vector<token_t> small_off{0, 1, 4, 12, 12, 17};
  const RowGroups sg{small_off.data(), 5};
  const index_t srows = small_off.back();
  std::vector<float> sy_ref(std::size_t(srows * fout)), sy(sy_ref.size());
  fbe.grouped_linear_forward(MatrixView<float>{sy_ref.data(), srows, fout}, MatrixView<const float>{fxg.data(), srows, fin},
                             fwg, PerGroup<const float>{}, sg);
  fbe.grouped_linear_forward(MatrixView<float>{sy.data(), srows, fout}, MatrixView<const float>{fx.data(), n, fin},
                             std::span<const token_t>(fidx).first(std::size_t(srows)), fwg, PerGroup<const float>{}, sg);
  CHECK(sy == sy_ref);
  omp_set_num_threads(saved_threads);
}

// Epilogue::relu on the gathered grouped linear (σ-MoE's W₁: the product stores ReLU of itself): the bits of the
// product followed by relu_forward, on every path of the GEMM: blocked tiles with groups spread over 2 threads, one
// group's product on both threads, K past one k block (the ReLU after the last), few rows (gemv), few columns (A read
// in place), and double (Eigen); rows outside the groups untouched, a NaN kept as relu_forward keeps it.
template <class T>
static void check_relu_epilogue(Rng& rng, index_t in, index_t out, const std::vector<token_t>& off, index_t n) {
  const int E = int(off.size()) - 1;
  const index_t rows = off.back() + 2;  // two rows past the groups
  const RowGroups g{off.data(), E};
  std::vector<token_t> idx(static_cast<std::size_t>(rows), 0);
  for (index_t r = 0; r < off.back(); ++r) idx[std::size_t(r)] = token_t(rng.integer(0, int(n) - 1));
  const auto xd = test::random_vec(std::size_t(n * in), rng), wd = test::random_vec(std::size_t(E * out * in), rng);
  std::vector<T> x(xd.begin(), xd.end()), w(wd.begin(), wd.end());
  x[std::size_t(idx[1] * in + 2)] = std::numeric_limits<T>::quiet_NaN();  // packed row 1's outputs: NaN
  cpu::Backend<T> be;
  const auto wg = uniform_groups<const T>(w.data(), E, out * in);
  std::vector<T> h(std::size_t(rows * out), T(-3)), ref(h.size(), T(-3)), got(h.size(), T(-3));
  be.grouped_linear_forward(MatrixView<T>{h.data(), rows, out}, MatrixView<const T>{x.data(), n, in}, idx, wg,
                            PerGroup<const T>{}, g);
  be.relu_forward(std::span<T>(ref).first(std::size_t(off.back() * out)),
                  std::span<const T>(h).first(std::size_t(off.back() * out)));
  be.grouped_linear_forward(MatrixView<T>{got.data(), rows, out}, MatrixView<const T>{x.data(), n, in}, idx, wg,
                            PerGroup<const T>{}, g, Epilogue::relu);
  INFO("in " << in << ", out " << out << ", " << E << " groups, " << off.back() << " rows");
  CHECK(std::memcmp(got.data(), ref.data(), got.size() * sizeof(T)) == 0);  // NaN included, rows past the groups
  CHECK(std::isnan(got[std::size_t(1 * out)]));
  CHECK(std::count_if(got.begin(), got.begin() + off.back() * out, [](T v) { return v == T(0); }) > 0);
}
TEST_CASE("grouped_linear_forward with Epilogue::relu equals the product then relu_forward, bit for bit", "[ops][grouped]") {
  Rng rng(31);
  const int saved_threads = omp_get_max_threads();
  omp_set_num_threads(2);
  std::vector<token_t> spread{0};
  for (int e = 0; e < 24; ++e) spread.push_back(spread.back() + token_t(60 + 7 * (e % 5)));
  const std::string best = cpu::gemm_kernel();
  int kernels = 0;
  for (const char* kernel : {"avx512", "avx2", "eigen"}) {  // every kernel this CPU has
    if (!cpu::set_gemm_kernel(kernel)) continue;
    INFO("kernel " << kernel);
    ++kernels;
    check_relu_epilogue<float>(rng, 96, 128, spread, 300);           // blocked, groups over threads
    check_relu_epilogue<float>(rng, 256, 128, {0, 700}, 400);        // one group on both threads
    check_relu_epilogue<float>(rng, 1000, 80, {0, 50, 90}, 200);     // K past one k block
    check_relu_epilogue<float>(rng, 64, 96, {0, 3, 8, 8, 13}, 100);  // groups of at most 8 rows
    check_relu_epilogue<float>(rng, 128, 40, {0, 100, 230}, 300);    // few columns
  }
  REQUIRE(cpu::set_gemm_kernel(best.c_str()));
  CHECK(kernels >= 2);
  check_relu_epilogue<double>(rng, 48, 24, {0, 20, 20, 57}, 90);  // Eigen
  omp_set_num_threads(saved_threads);
}

// The gathered grouped LayerNorm (grouped_layernorm_forward / _backward with a row list: a routed FFN's LayerNorm reads
// its token rows in place of a gathered copy, modules/ffn.hpp): equal to the gather followed by the plain grouped op,
// bit for bit where the rows sit at the same alignment (d a multiple of 16 floats in 64-byte aligned buffers, as in
// every model here), in double and in float on 2 threads (rows past the threads' threshold), with dx added to and written;
// rows outside the groups untouched; an index out of range is one clear error.
TEST_CASE("grouped_layernorm over gathered rows equals gather + grouped_layernorm, bit for bit", "[ops][grouped]") {
  auto run = [](auto zero, index_t d, index_t Tn, const std::vector<token_t>& off, std::uint64_t seed) {
    using T = decltype(zero);
    const int gcount = int(off.size()) - 1;
    const RowGroups gr{off.data(), gcount};
    const index_t rows = off.back() + 2;  // two rows after the groups: never read or written
    Rng rng(seed);
    auto to_t = [](const std::vector<double>& v) { return std::vector<T>(v.begin(), v.end()); };
    // The table and the gathered copy 64-byte aligned, as the models' buffers: Eigen's vectorised row sums start at
    // an aligned address, so rows at different alignments may sum in a different order (rounding-level).
    using Aligned = std::vector<T, Eigen::aligned_allocator<T>>;
    const auto tv = test::random_vec(std::size_t(Tn * d), rng, -2, 2);
    const Aligned table(tv.begin(), tv.end());
    const auto gamma = to_t(test::random_vec(std::size_t(gcount * (d + 3)), rng));
    const auto beta = to_t(test::random_vec(std::size_t(gcount * (d + 3)), rng));
    const auto dout = to_t(test::random_vec(std::size_t(rows * d), rng));
    auto pg = [&](auto* base) { return PerGroup<std::remove_pointer_t<decltype(base)>>(base, gcount, [&](int g) { return g * (d + 3); }); };
    std::vector<token_t> idx(std::size_t(rows), -1);  // -1 outside the groups: never read
    for (index_t r = off.front(); r < off.back(); ++r) idx[std::size_t(r)] = token_t(rng.integer(0, int(Tn) - 1));
    Aligned xg(std::size_t(rows * d), T(0));
    for (index_t r = off.front(); r < off.back(); ++r)
      std::copy_n(table.data() + idx[std::size_t(r)] * d, d, xg.data() + r * d);
    cpu::Backend<T> be;
    std::vector<T> y_ref(std::size_t(rows * d), T(-7.25)), y(y_ref), mean_ref(std::size_t(rows), T(3)), mean(mean_ref),
        rstd_ref(mean_ref), rstd(mean_ref);
    be.grouped_layernorm_forward(MatrixView<T>{y_ref.data(), rows, d}, std::span<T>(mean_ref), std::span<T>(rstd_ref),
                                 MatrixView<const T>{xg.data(), rows, d}, pg(gamma.data()), pg(beta.data()), gr);
    be.grouped_layernorm_forward(MatrixView<T>{y.data(), rows, d}, std::span<T>(mean), std::span<T>(rstd),
                                 MatrixView<const T>{table.data(), Tn, d}, idx, pg(gamma.data()), pg(beta.data()), gr);
    CHECK(y == y_ref);
    CHECK(mean == mean_ref);
    CHECK(rstd == rstd_ref);
    CHECK(y.back() == T(-7.25));
    for (const Store st : {Store::add, Store::overwrite}) {
      INFO((st == Store::add ? "dx added to" : "dx written"));
      std::vector<T> dx_ref(std::size_t(rows * d), T(0.25)), dx(dx_ref), dg_ref(gamma.size(), T(0.5)), dg(dg_ref),
          db_ref(beta.size(), T(0.75)), db(db_ref);
      be.grouped_layernorm_backward(MatrixView<T>{dx_ref.data(), rows, d}, pg(dg_ref.data()), pg(db_ref.data()),
                                    MatrixView<const T>{dout.data(), rows, d}, MatrixView<const T>{xg.data(), rows, d},
                                    std::span<const T>(mean_ref), std::span<const T>(rstd_ref), pg(gamma.data()), gr, st);
      be.grouped_layernorm_backward(MatrixView<T>{dx.data(), rows, d}, pg(dg.data()), pg(db.data()),
                                    MatrixView<const T>{dout.data(), rows, d}, MatrixView<const T>{table.data(), Tn, d},
                                    idx, std::span<const T>(mean), std::span<const T>(rstd), pg(gamma.data()), gr, st);
      CHECK(dx == dx_ref);
      CHECK(dg == dg_ref);
      CHECK(db == db_ref);
      CHECK(dx.back() == T(0.25));
    }
    return idx;
  };
  const int saved_threads = omp_get_max_threads();
  omp_set_num_threads(2);
  auto idx = run(0.0, 6, 7, offsets, 31);  // the file's 11 rows: an empty group, rows before and after the groups
  run(0.0f, 256, 300, {0, 150, 150, 420}, 32);  // 420 rows of 256 columns: both threads
  omp_set_num_threads(saved_threads);

  Be be;
  const index_t d = 6, Tn = 7;
  std::vector<double> table(std::size_t(Tn * d), 1.0), gamma(std::size_t(G * (d + 3)), 1.0), y(std::size_t(R * d)),
      mean(R), rstd(R);
  const auto pg = per_group<const double>(gamma.data(), d);
  idx[4] = token_t(Tn);
  CHECK_THROWS_WITH(be.grouped_layernorm_forward(test::mat(y, R, d), mean, rstd, test::cmat(table, Tn, d), idx, pg, pg,
                                                 groups),
                    Catch::Contains("grouped_layernorm_forward: idx[4] = 7 is out of range [0, 7) for x [7x6]"));
  CHECK_THROWS_WITH(be.grouped_layernorm_backward(test::mat(y, R, d), PerGroup<double>{}, PerGroup<double>{},
                                                  test::cmat(y, R, d), test::cmat(table, Tn, d),
                                                  std::span<const token_t>(idx).first(5), mean, rstd, pg, groups),
                    Catch::Contains("grouped_layernorm_backward: 5 row indices for dout [11x6]"));
}

// dy as scaled rows of a table (ScaledRows: dy[r] = scale[r] · table[index[r]], the routed experts' dL/dy read inside
// W₂'s products): equal, bit for bit, to writing dy out and calling the stored form, in float (mom's GEMM: the
// scale in both packings, a group above one k block of the weight-gradient product, groups of 1 and 3 rows at the
// tile edges, on 1 and 2 threads) and in double (Eigen), with x's own rows and with x gathered, with and without
// scales; an index outside the table is one clear error.
template <class T>
void check_scaled_rows_backward(Rng& rng, int threads) {
  const int saved_threads = omp_get_max_threads();
  omp_set_num_threads(threads);
  constexpr int E = 6;
  const index_t fin = 40, fout = 64, n = 300;
  const std::vector<token_t> off{0, 1, 4, 100, 900, 990, 1000};  // group 3: 800 rows (> one k block of 768)
  const index_t rows = off.back();
  const RowGroups g{off.data(), E};
  std::vector<token_t> idx(static_cast<std::size_t>(rows)), xidx(static_cast<std::size_t>(rows));
  for (auto& i : idx) i = token_t(rng.integer(0, int(n) - 1));
  for (auto& i : xidx) i = token_t(rng.integer(0, int(n) - 1));
  auto cast = [](const std::vector<double>& v) { return std::vector<T>(v.begin(), v.end()); };
  const auto table = cast(test::random_vec(std::size_t(n * fout), rng)), scale = cast(test::random_vec(std::size_t(rows), rng));
  const auto x = cast(test::random_vec(std::size_t(n * fin), rng)), w = cast(test::random_vec(std::size_t(E * fout * fin), rng));
  const auto wg = uniform_groups<const T>(w.data(), E, fout * fin);
  cpu::Backend<T> be;
  for (const bool scaled : {true, false}) {
    std::vector<T> dy(std::size_t(rows * fout));
    for (index_t r = 0; r < rows; ++r)
      for (index_t c = 0; c < fout; ++c)
        dy[std::size_t(r * fout + c)] = scaled ? table[std::size_t(idx[r] * fout + c)] * scale[std::size_t(r)]
                                               : table[std::size_t(idx[r] * fout + c)];
    const ScaledRows<T> sr{{table.data(), n, fout}, idx, scaled ? std::span<const T>(scale) : std::span<const T>{}};
    for (const bool gathered : {false, true}) {
      INFO("scaled " << scaled << ", x gathered " << gathered << ", threads " << threads);
      const MatrixView<const T> xv{x.data(), gathered ? n : rows, fin};
      std::vector<T> xs;
      if (!gathered) {  // x's own rows: a [rows × fin] matrix
        xs = cast(test::random_vec(std::size_t(rows * fin), rng));
      }
      const MatrixView<const T> xm = gathered ? xv : MatrixView<const T>{xs.data(), rows, fin};
      const std::span<const token_t> xi = gathered ? std::span<const token_t>(xidx) : std::span<const token_t>{};
      std::vector<T> dx_ref(std::size_t(rows * fin), T(-3)), dx(dx_ref), dw_ref(w.size(), T(0.5)), dw(dw_ref);
      if (gathered)
        be.grouped_linear_backward(MatrixView<T>{dx_ref.data(), rows, fin}, uniform_groups(dw_ref.data(), E, fout * fin),
                                   PerGroup<T>{}, MatrixView<const T>{dy.data(), rows, fout}, xm, xi, wg, g, Store::overwrite);
      else
        be.grouped_linear_backward(MatrixView<T>{dx_ref.data(), rows, fin}, uniform_groups(dw_ref.data(), E, fout * fin),
                                   PerGroup<T>{}, MatrixView<const T>{dy.data(), rows, fout}, xm, wg, g, Store::overwrite);
      be.grouped_linear_backward(MatrixView<T>{dx.data(), rows, fin}, uniform_groups(dw.data(), E, fout * fin), sr, xm, xi,
                                 wg, g, Store::overwrite);
      CHECK(dx == dx_ref);
      CHECK(dw == dw_ref);
    }
  }
  std::vector<token_t> bad = idx;
  bad[5] = token_t(n);
  std::vector<T> dx(std::size_t(rows * fin));
  CHECK_THROWS_WITH(be.grouped_linear_backward(MatrixView<T>{dx.data(), rows, fin}, PerGroup<T>{},
                                               ScaledRows<T>{{table.data(), n, fout}, bad, {}},
                                               MatrixView<const T>{x.data(), n, fin}, xidx, wg, g, Store::overwrite),
                    Catch::Contains("grouped_linear_backward: idx[5] = 300 is out of range [0, 300)"));
  CHECK_THROWS_WITH(be.grouped_linear_backward(MatrixView<T>{dx.data(), rows, fin}, PerGroup<T>{},
                                               ScaledRows<T>{{table.data(), n, fout}, idx, std::span<const T>(scale).first(9)},
                                               MatrixView<const T>{x.data(), n, fin}, xidx, wg, g, Store::overwrite),
                    Catch::Contains("grouped_linear_backward: 9 scales for 1000 rows of dy"));
  omp_set_num_threads(saved_threads);
}
TEST_CASE("grouped_linear_backward reads dy as scaled rows of a table, bit for bit as the stored dy", "[ops][grouped]") {
  Rng rng(31);
  for (const int threads : {1, 2}) check_scaled_rows_backward<float>(rng, threads);
  check_scaled_rows_backward<double>(rng, 2);
}

#pragma once
// Grouped ops on the CPU (core/groups.hpp): the row groups' offsets are host memory here, so each
// op reads them and runs the plain op on every group's row block, with that group's parameters.
// The CUDA backend reads the same offsets inside its kernels instead (no host-device sync); the
// cross-backend tests compare the two. Forward ops write their rows, backward ops accumulate, and
// rows outside [offsets[0], offsets[count]) are untouched, as the plain ops' contracts say.
#include <omp.h>

#include <algorithm>
#include <array>
#include <span>

#include "mom/backend/cpu/activation.hpp"
#include "mom/backend/cpu/dispatch.hpp"
#include "mom/backend/cpu/layernorm.hpp"
#include "mom/backend/cpu/linear.hpp"
#include "mom/backend/cpu/routing.hpp"
#include "mom/backend/shape_checks.hpp"
#include "mom/core/groups.hpp"

namespace mom::cpu {

namespace detail {
// Validates the offsets against the packed matrices' row count and calls f(g, first_row, rows)
// for every non-empty group.
template <class F>
void for_each_group(const char* op, RowGroups g, index_t rows, F&& f) {
  checks::row_groups_shape(op, g);
  for (int i = 0; i <= g.count; ++i)
    MOM_CHECK(g.offsets[i] >= 0 && g.offsets[i] <= rows && (i == 0 || g.offsets[i] >= g.offsets[i - 1]), op,
              ": group offsets must be non-decreasing in [0, ", rows, "]; offsets[", i, "] = ", g.offsets[i]);
  for (int i = 0; i < g.count; ++i) {
    const index_t o = g.offsets[i], n = g.offsets[i + 1] - o;
    if (n > 0) f(i, o, n);
  }
}
// Groups over threads. A routed layer has many small groups (moeut8: ~40 experts of ~400 rows): one
// GEMM per group with every thread on it pays a fork, a cooperative B packing and a barrier per call,
// and each thread gets a sliver of an already small product (161 GFLOP/s on this shape where the dense
// GEMM runs 264). for_each_group_spread instead gives each thread whole groups, largest first (a
// dynamic schedule over the groups sorted by size: greedy LPT), and every op inside runs on its
// thread alone (cpu::gemm inside a parallel region is gemm_serial): 227 GFLOP/s on that shape. It does
// so only when the greedy spread keeps every thread within 15% of an even share of the rows and the
// groups' outputs are disjoint (`disjoint`: the caller's guarantee, e.g. distinct weight gradients);
// otherwise the groups run one after another, each op using every thread, as for_each_group does.
// Either way a group's result is the same bits: the GEMM's arithmetic (its k order, its tiles) does
// not depend on the thread count.
inline constexpr double spread_max_imbalance = 1.15;
inline constexpr double spread_min_macs = 96.0 * 96.0 * 96.0;  // below it the GEMM runs on one thread anyway

// The non-empty groups of g, largest first, into order; returns their count.
inline int groups_by_size(RowGroups g, std::array<int, max_row_groups>& order) {
  int m = 0;
  for (int i = 0; i < g.count; ++i)
    if (g.offsets[i + 1] > g.offsets[i]) order[std::size_t(m++)] = i;
  const auto size = [&](int i) { return g.offsets[i + 1] - g.offsets[i]; };
  std::stable_sort(order.begin(), order.begin() + m, [&](int a, int b) { return size(a) > size(b); });
  return m;
}
// Whether they spread over nt threads within spread_max_imbalance: greedy LPT (each group to the least loaded
// thread), at least 2 groups per thread.
inline bool spreads_evenly(RowGroups g, const std::array<int, max_row_groups>& order, int m, int nt) {
  if (nt < 2 || m < 2 * nt) return false;
  constexpr int max_threads = 256;
  std::array<index_t, max_threads> load{};
  nt = std::min(nt, max_threads);
  index_t total = 0;
  for (int j = 0; j < m; ++j) {
    const int i = order[std::size_t(j)];
    const index_t n = g.offsets[i + 1] - g.offsets[i];
    *std::min_element(load.begin(), load.begin() + nt) += n;
    total += n;
  }
  const index_t most = *std::max_element(load.begin(), load.begin() + nt);
  return double(most) * nt <= spread_max_imbalance * double(total);
}
// f(g, first_row, rows) for every non-empty group, spread over the threads as above when that pays;
// macs_per_row: the multiply-adds of one row's work (to leave small problems alone).
template <class F>
void for_each_group_spread(const char* op, RowGroups g, index_t rows, double macs_per_row, bool disjoint, F&& f) {
  for_each_group(op, g, rows, [](int, index_t, index_t) {});  // validates the offsets
  const int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
  std::array<int, max_row_groups> order;
  const int m = groups_by_size(g, order);
  const double macs = macs_per_row * double(g.offsets[g.count] - g.offsets[0]);
  if (!disjoint || macs < spread_min_macs * nt || !spreads_evenly(g, order, m, nt)) {
    for_each_group(op, g, rows, f);
    return;
  }
#pragma omp parallel for schedule(dynamic, 1)
  for (int j = 0; j < m; ++j) {
    const int i = order[std::size_t(j)];
    f(i, index_t(g.offsets[i]), index_t(g.offsets[i + 1] - g.offsets[i]));
  }
}
// Whether the per-group tensors of p (each `size` elements) are pairwise disjoint over the groups of g
// (an expert's own weight gradient: yes; one tensor every group reads, same_for_groups: no).
template <class T>
bool per_group_disjoint(const PerGroup<T>& p, int count, index_t size) {
  if (p.empty()) return true;
  std::array<index_t, max_row_groups> at;
  std::copy_n(p.at.begin(), count, at.begin());
  std::sort(at.begin(), at.begin() + count);
  for (int i = 1; i < count; ++i)
    if (at[std::size_t(i)] - at[std::size_t(i - 1)] < size) return false;
  return true;
}

// The union of the groups' rows, [offsets[0], offsets[count]) (validated as for_each_group does), for
// the ops whose work does not depend on the group (gather, scatter into one matrix): one call of the plain
// op over all the rows instead of one per group.
struct RowRange {
  index_t first = 0, rows = 0;
};
inline RowRange group_rows(const char* op, RowGroups g, index_t rows) {
  for_each_group(op, g, rows, [](int, index_t, index_t) {});
  return {g.offsets[0], g.offsets[g.count] - g.offsets[0]};
}
template <class T>
MatrixView<T> rows_of(MatrixView<T> m, index_t o, index_t n) {
  return m.empty() ? m : m.row_block(o, n);
}
template <class T>
std::span<T> part(std::span<T> s, index_t o, index_t n) {
  return s.empty() ? s : s.subspan(std::size_t(o), std::size_t(n));
}
template <class T>
MatrixView<T> group_matrix(const PerGroup<T>& p, int g, index_t rows, index_t cols, index_t ld) {
  return p.empty() ? MatrixView<T>{} : MatrixView<T>{p[g], rows, cols, ld};
}
template <class T>
std::span<T> group_vector(const PerGroup<T>& p, int g, index_t n) {
  return p.empty() ? std::span<T>{} : std::span<T>{p[g], std::size_t(n)};
}
}  // namespace detail

namespace detail {
// A grouped linear's packed operand (x, dy: core/groups.hpp's ScaledRows): what group rows [o, o + n) read — those
// rows of the table, or (read through the index) the whole table with that part of the index and scales.
template <class T>
ScaledRows<T> group_part(ScaledRows<T> m, index_t o, index_t n) {
  if (m.index.empty()) return {m.table.row_block(o, n), {}, {}};
  return {m.table, part(m.index, o, n), part(m.scale, o, n)};
}
// The index entries of the grouped rows (the others, e.g. SKIP rows, are never read) within the table's rows,
// and one scale per row.
template <class T>
void check_rows(const char* op, const char* what, ScaledRows<T> m, RowGroups g) {
  MOM_CHECK(m.scale.empty() || ssize(m.scale) == m.rows(), op, ": ", m.scale.size(), " scales for ", m.rows(),
            " rows of ", what);
  if (m.index.empty()) return;
  const auto [lo, n] = group_rows(op, g, m.rows());
  check_row_indices(op, m.index.subspan(std::size_t(lo), std::size_t(n)), m.table.rows, mom::shape(m.table), lo, what);
}
template <class T>
void grouped_linear_forward(const char* op, MatrixView<T> y, ScaledRows<T> x, PerGroup<const T> w,
                            PerGroup<const T> b, RowGroups g, Epilogue ep = Epilogue::none) {
  checks::grouped_linear_shapes<T>(op, y, x.shape(), !w.empty());
  check_rows(op, "x", x, g);
  const index_t k = x.table.cols;
  for_each_group_spread(op, g, x.rows(), double(y.cols) * double(k), true, [&](int i, index_t o, index_t n) {
    const ScaledRows<T> xg = group_part(x, o, n);
    linear_forward<T>(y.row_block(o, n), xg.table, xg.index, {w[i], y.cols, k}, group_vector(b, i, y.cols), ep);
  });
}
// dy and x each stored or read through an index (dy's rows scaled): one body for every public form below.
template <class T>
void grouped_linear_backward(const char* op, MatrixView<T> dx, PerGroup<T> dw, PerGroup<T> db, ScaledRows<T> dy,
                             ScaledRows<T> x, PerGroup<const T> w, RowGroups g, Store dx_store) {
  checks::grouped_linear_shapes<T>(op, dy.shape(), x.shape(), !w.empty());
  const index_t k = x.table.cols, out = dy.table.cols;
  MOM_CHECK(dx.empty() || (dx.rows == x.rows() && dx.cols == k), op, ": dx ", shape(dx), " must match x ",
            shape(x.shape()));
  check_rows(op, "x", x, g);
  check_rows(op, "dy", dy, g);
  const bool disjoint = per_group_disjoint(dw, g.count, out * k) && per_group_disjoint(db, g.count, out);
  const double macs = double(dx.empty() ? 1 : 2) * double(out) * double(k);
  for_each_group_spread(op, g, x.rows(), macs, disjoint, [&](int i, index_t o, index_t n) {
    linear_backward<T>(rows_of(dx, o, n), group_matrix(dw, i, out, k, k), group_vector(db, i, out), group_part(dy, o, n),
                       group_part(x, o, n), {w[i], out, k}, dx_store);
  });
}
}  // namespace detail

// y[r] = W_g x[r] + b_g for the rows r of group g; W_g [y.cols × x.cols] at w[g], b_g at b[g].
template <class T>
void grouped_linear_forward(MatrixView<T> y, MatrixView<const T> x, PerGroup<const T> w, PerGroup<const T> b,
                            RowGroups g) {
  detail::grouped_linear_forward<T>("grouped_linear_forward", y, {x, {}, {}}, w, b, g);
}
// The same over gathered rows: y[r] = W_g x[idx[r]] + b_g (x the table, idx [y.rows]), the gather read inside the
// GEMM's packing instead of copied first (routing/expert_mlp.hpp). ep = Epilogue::relu: y[r] = max(that, 0), stored
// so by the product (the bits of relu_forward after it, without its pass over y: σ-MoE's W₁).
template <class T>
void grouped_linear_forward(MatrixView<T> y, MatrixView<const T> x, std::span<const token_t> idx, PerGroup<const T> w,
                            PerGroup<const T> b, RowGroups g, Epilogue ep = Epilogue::none) {
  MOM_CHECK(ssize(idx) == y.rows, "grouped_linear_forward: ", idx.size(), " row indices for y ", shape(y));
  detail::grouped_linear_forward<T>("grouped_linear_forward", y, {x, idx, {}}, w, b, g, ep);
}
// dx[r] += W_gᵀ dy[r], dW_g += Σ_r dy[r] x[r]ᵀ, db_g += Σ_r dy[r]; dx, dw, db may each be empty.
// dx_store = Store::overwrite: dx[r] = W_gᵀ dy[r] on the groups' rows (the others untouched).
template <class T>
void grouped_linear_backward(MatrixView<T> dx, PerGroup<T> dw, PerGroup<T> db, MatrixView<const T> dy,
                             MatrixView<const T> x, PerGroup<const T> w, RowGroups g, Store dx_store = Store::add) {
  detail::grouped_linear_backward<T>("grouped_linear_backward", dx, dw, db, {dy, {}, {}}, {x, {}, {}}, w, g, dx_store);
}
// Backward of the gathered forward: dW_g += Σ_r dy[r] x[idx[r]]ᵀ, db_g as above, and dx [dy.rows × x.cols] the
// gathered rows' gradient, packed (dx[r] for x[idx[r]]; routing/dispatch.hpp's gather_backward adds it to x's).
template <class T>
void grouped_linear_backward(MatrixView<T> dx, PerGroup<T> dw, PerGroup<T> db, MatrixView<const T> dy,
                             MatrixView<const T> x, std::span<const token_t> idx, PerGroup<const T> w, RowGroups g,
                             Store dx_store = Store::add) {
  MOM_CHECK(ssize(idx) == dy.rows, "grouped_linear_backward: ", idx.size(), " row indices for dy ", shape(dy));
  detail::grouped_linear_backward<T>("grouped_linear_backward", dx, dw, db, {dy, {}, {}}, {x, idx, {}}, w, g, dx_store);
}
// The same with dy not stored (core/groups.hpp's ScaledRows: dy[r] = scale[r] · table[index[r]], a routed
// layer's weight times its token's output gradient), read inside the products' packing: the same bits as
// writing dy out and calling the forms above, without its write and two reads. x's rows through idx when idx is
// given (empty: x's own rows). No bias gradient (the routed experts have none).
template <class T>
void grouped_linear_backward(MatrixView<T> dx, PerGroup<T> dw, ScaledRows<T> dy, MatrixView<const T> x,
                             std::span<const token_t> idx, PerGroup<const T> w, RowGroups g, Store dx_store = Store::add) {
  detail::grouped_linear_backward<T>("grouped_linear_backward", dx, dw, {}, dy, {x, idx, {}}, w, g, dx_store);
}

// Over gathered rows: packed row r normalises x[idx[r]] (idx [out.rows]: a routed layer's token rows, read in place,
// so the gathered copy is never written; the same bits as gathering x first where the rows sit at the same
// alignment: detail::norm_row, layernorm.hpp). Empty idx: x's own rows (the plain form below).
template <class T>
void grouped_layernorm_forward(MatrixView<T> out, std::span<T> mean, std::span<T> rstd, MatrixView<const T> x,
                               std::span<const token_t> idx, PerGroup<const T> gamma, PerGroup<const T> beta,
                               RowGroups g, T eps) {
  const bool gathered = !idx.empty();
  if (gathered) checks::gathered_norm_shapes<T>("grouped_layernorm_forward", "out", out, x, idx);
  detail::for_each_group("grouped_layernorm_forward", g, gathered ? out.rows : x.rows, [&](int i, index_t o, index_t n) {
    const auto xi = gathered ? detail::part(idx, o, n) : idx;
    detail::check_row_indices("grouped_layernorm_forward", xi, x.rows, shape(x), o, "x");
    const MatrixView<const T> xs = gathered ? x : x.row_block(o, n), xshape = gathered ? out.row_block(o, n) : xs;
    const auto mu = detail::part(mean, o, n), rs = detail::part(rstd, o, n);
    const auto gam = detail::group_vector(gamma, i, x.cols), bet = detail::group_vector(beta, i, x.cols);
    checks::layernorm_forward_shapes<T>(out.row_block(o, n), mu, rs, xshape, gam, bet);
    detail::layernorm_forward<T>(out.row_block(o, n), mu, rs, xs, xi, gam, bet, eps);
  });
}
template <class T>
void grouped_layernorm_forward(MatrixView<T> out, std::span<T> mean, std::span<T> rstd, MatrixView<const T> x,
                               PerGroup<const T> gamma, PerGroup<const T> beta, RowGroups g, T eps) {
  grouped_layernorm_forward<T>(out, mean, rstd, x, std::span<const token_t>{}, gamma, beta, g, eps);
}
// Backward of the gathered form: x's rows through idx [dout.rows]; dx [dout.rows × x.cols] is the packed rows'
// gradient (routing/dispatch.hpp's gather_backward adds it to x's rows). Empty idx: x's own rows.
template <class T>
void grouped_layernorm_backward(MatrixView<T> dx, PerGroup<T> dgamma, PerGroup<T> dbeta, MatrixView<const T> dout,
                                MatrixView<const T> x, std::span<const token_t> idx, std::span<const T> mean,
                                std::span<const T> rstd, PerGroup<const T> gamma, RowGroups g,
                                Store dx_store = Store::add) {
  const bool gathered = !idx.empty();
  if (gathered) checks::gathered_norm_shapes<T>("grouped_layernorm_backward", "dout", dout, x, idx);
  detail::for_each_group("grouped_layernorm_backward", g, gathered ? dout.rows : x.rows, [&](int i, index_t o, index_t n) {
    const auto xi = gathered ? detail::part(idx, o, n) : idx;
    detail::check_row_indices("grouped_layernorm_backward", xi, x.rows, shape(x), o, "x");
    const MatrixView<const T> xs = gathered ? x : x.row_block(o, n), xshape = gathered ? dout.row_block(o, n) : xs;
    const auto dxg = detail::rows_of(dx, o, n);
    const auto dg = detail::group_vector(dgamma, i, x.cols), db = detail::group_vector(dbeta, i, x.cols);
    const auto mu = detail::part(mean, o, n), rs = detail::part(rstd, o, n);
    const auto gam = detail::group_vector(gamma, i, x.cols);
    checks::layernorm_backward_shapes<T>(dxg, dg, db, dout.row_block(o, n), xshape, mu, rs, gam);
    detail::layernorm_backward<T>(dxg, dg, db, dout.row_block(o, n), xs, xi, mu, rs, gam, dx_store);
  });
}
template <class T>
void grouped_layernorm_backward(MatrixView<T> dx, PerGroup<T> dgamma, PerGroup<T> dbeta, MatrixView<const T> dout,
                                MatrixView<const T> x, std::span<const T> mean, std::span<const T> rstd,
                                PerGroup<const T> gamma, RowGroups g, Store dx_store = Store::add) {
  grouped_layernorm_backward<T>(dx, dgamma, dbeta, dout, x, std::span<const token_t>{}, mean, rstd, gamma, g, dx_store);
}

// The plain row ops restricted to the rows [offsets[0], offsets[count]).
template <class T>
void gelu_forward(MatrixView<T> out, MatrixView<const T> x, RowGroups g) {
  checks::same_shape<T>("gelu_forward", out, x);
  detail::for_each_group("gelu_forward", g, x.rows, [&](int, index_t o, index_t n) {
    gelu_forward<T>(out.row_block(o, n).flat(), x.row_block(o, n).flat());
  });
}
template <class T>
void gelu_backward(MatrixView<T> dx, MatrixView<const T> x, MatrixView<const T> dout, RowGroups g,
                   Store st = Store::add) {
  checks::same_shape<T>("gelu_backward", dx, x);
  checks::same_shape<T>("gelu_backward", dout, x);
  detail::for_each_group("gelu_backward", g, x.rows, [&](int, index_t o, index_t n) {
    gelu_backward<T>(dx.row_block(o, n).flat(), x.row_block(o, n).flat(), dout.row_block(o, n).flat(), st);
  });
}
template <class T>
void add_forward(MatrixView<T> out, MatrixView<const T> a, MatrixView<const T> b, RowGroups g) {
  checks::same_shape<T>("add_forward", out, a);
  checks::same_shape<T>("add_forward", out, b);
  detail::for_each_group("add_forward", g, out.rows, [&](int, index_t o, index_t n) {
    add_forward<T>(out.row_block(o, n).flat(), a.row_block(o, n).flat(), b.row_block(o, n).flat());
  });
}
template <class T>
void axpy(MatrixView<T> y, T alpha, MatrixView<const T> x, RowGroups g) {
  checks::same_shape<T>("axpy", y, x);
  detail::for_each_group("axpy", g, y.rows, [&](int, index_t o, index_t n) {
    axpy<T>(y.row_block(o, n).flat(), alpha, x.row_block(o, n).flat());
  });
}
template <class T>
void zero_rows(MatrixView<T> m, RowGroups g) {
  detail::for_each_group("zero_rows", g, m.rows, [&](int, index_t o, index_t n) {
    for (index_t r = o; r < o + n; ++r) std::fill_n(m.row(r), m.cols, T(0));
  });
}
template <class T>
void gather_rows(MatrixView<T> out, MatrixView<const T> in, std::span<const token_t> idx, RowGroups g) {
  checks::gather_rows_shapes<T>(out, in, idx);
  const auto [o, n] = detail::group_rows("gather_rows", g, out.rows);
  if (n > 0) gather_rows<T>(out.row_block(o, n), in, idx.subspan(std::size_t(o), std::size_t(n)));
}
// out[r] = in_g[idx[r]] for the rows r of group g: each group gathers from its own [rows × out.cols]
// matrix in[g] (e.g. module g's LayerNorm of every token).
template <class T>
void gather_rows(MatrixView<T> out, PerGroup<const T> in, index_t in_rows, std::span<const token_t> idx, RowGroups g) {
  MOM_CHECK(ssize(idx) == out.rows, "gather_rows: ", idx.size(), " indices for out ", shape(out));
  detail::for_each_group("gather_rows", g, out.rows, [&](int i, index_t o, index_t n) {
    gather_rows<T>(out.row_block(o, n), {in[i], in_rows, out.cols}, idx.subspan(std::size_t(o), std::size_t(n)));
  });
}
// out[idx[r]] += w[r] · in[r] for the groups' rows r (Store::overwrite: out = that sum, rows no grouped entry
// names zero).
template <class T>
void scatter_add_rows(MatrixView<T> out, MatrixView<const T> in, std::span<const token_t> idx,
                      std::span<const T> weights, RowGroups g, Store st = Store::add) {
  checks::scatter_add_rows_shapes<T>(out, in, idx, weights);
  const auto [o, n] = detail::group_rows("scatter_add_rows", g, in.rows);
  scatter_add_rows<T>(out, in.row_block(o, n), idx.subspan(std::size_t(o), std::size_t(n)), detail::part(weights, o, n), st);
}
// out_g[idx[r]] += in[r] for the rows r of group g (the backward of the per-group gather).
template <class T>
void scatter_add_rows(PerGroup<T> out, index_t out_rows, MatrixView<const T> in, std::span<const token_t> idx,
                      RowGroups g) {
  MOM_CHECK(ssize(idx) == in.rows, "scatter_add_rows: ", idx.size(), " indices for in ", shape(in));
  detail::for_each_group("scatter_add_rows", g, in.rows, [&](int i, index_t o, index_t n) {
    scatter_add_rows<T>({out[i], out_rows, in.cols}, in.row_block(o, n), idx.subspan(std::size_t(o), std::size_t(n)),
                        {});
  });
}
template <class T>
void scatter_add_rows_backward(MatrixView<T> din, std::span<T> dweights, MatrixView<const T> dout,
                               MatrixView<const T> in, std::span<const token_t> idx, std::span<const T> weights,
                               RowGroups g, Store st = Store::add) {
  checks::scatter_add_rows_backward_shapes<T>(din, dweights, dout, in, idx, weights);
  const auto [o, n] = detail::group_rows("scatter_add_rows_backward", g, in.rows);
  if (n > 0)
    scatter_add_rows_backward<T>(detail::rows_of(din, o, n), detail::part(dweights, o, n), dout, in.row_block(o, n),
                                 idx.subspan(std::size_t(o), std::size_t(n)), detail::part(weights, o, n), st);
}
// weight_rows_backward over the groups' rows (the others untouched); a's rows through idx, or the groups' own.
template <class T>
void weight_rows_backward(MatrixView<T> d, std::span<T> dwp, MatrixView<const T> u, MatrixView<const T> a,
                          std::span<const token_t> idx, std::span<const T> w, RowGroups g, bool relu) {
  checks::weight_rows_backward_shapes<T>(d, dwp, u, a, idx, w);  // all rows, before the groups' part is cut
  const auto [o, n] = detail::group_rows("weight_rows_backward", g, u.rows);
  if (n > 0)
    weight_rows_backward<T>(d.row_block(o, n), detail::part(dwp, o, n), u.row_block(o, n),
                            idx.empty() ? a.row_block(o, n) : a, detail::part(idx, o, n), detail::part(w, o, n), relu);
}

// Causal attention of every group's queries over that group's keys (core/groups.hpp's attention):
// query row r of group g (token q_tok[r]) attends, with k_tok empty, to the rows t < kv_rows of
// k[g] / v[g] (token t), or, with k_tok given, to the rows j of group g's own row range of k[g] /
// v[g] (token k_tok[j]); in both cases to the keys of its sequence at or before its token. Key
// rows are kv_ld apart. dq, dk, dv accumulate (dk[g] / dv[g] laid out as k[g] / v[g]).
template <class T>
void attention_grouped_forward(MatrixView<T> out, std::span<T> lse, MatrixView<const T> q, PerGroup<const T> k,
                               PerGroup<const T> v, index_t kv_rows, index_t kv_ld, std::span<const token_t> q_tok,
                               std::span<const token_t> k_tok, RowGroups g, index_t seq, index_t heads) {
  checks::attention_packed_forward_out_shapes<T>(out, lse, q, heads);
  const index_t d = q.cols;
  detail::for_each_group("attention_grouped_forward", g, q.rows, [&](int i, index_t o, index_t n) {
    const index_t ko = k_tok.empty() ? 0 : o, kn = k_tok.empty() ? kv_rows : n;
    attention_packed_forward<T>(out.row_block(o, n), lse.subspan(std::size_t(o * heads), std::size_t(n * heads)),
                                q.row_block(o, n), {k[i] + ko * kv_ld, kn, d, kv_ld}, {v[i] + ko * kv_ld, kn, d, kv_ld},
                                q_tok.subspan(std::size_t(o), std::size_t(n)),
                                k_tok.empty() ? k_tok : k_tok.subspan(std::size_t(o), std::size_t(n)), seq, heads);
  });
}
template <class T>
void attention_grouped_backward(MatrixView<T> dq, PerGroup<T> dk, PerGroup<T> dv, MatrixView<const T> dout,
                                MatrixView<const T> out, std::span<const T> lse, MatrixView<const T> q,
                                PerGroup<const T> k, PerGroup<const T> v, index_t kv_rows, index_t kv_ld,
                                std::span<const token_t> q_tok, std::span<const token_t> k_tok, RowGroups g,
                                index_t seq, index_t heads) {
  const index_t d = q.cols;
  detail::for_each_group("attention_grouped_backward", g, q.rows, [&](int i, index_t o, index_t n) {
    const index_t ko = k_tok.empty() ? 0 : o, kn = k_tok.empty() ? kv_rows : n;
    attention_packed_backward<T>(
        dq.row_block(o, n), {dk[i] + ko * kv_ld, kn, d, kv_ld}, {dv[i] + ko * kv_ld, kn, d, kv_ld}, dout.row_block(o, n),
        out.row_block(o, n), lse.subspan(std::size_t(o * heads), std::size_t(n * heads)), q.row_block(o, n),
        {k[i] + ko * kv_ld, kn, d, kv_ld}, {v[i] + ko * kv_ld, kn, d, kv_ld}, q_tok.subspan(std::size_t(o), std::size_t(n)),
        k_tok.empty() ? k_tok : k_tok.subspan(std::size_t(o), std::size_t(n)), seq, heads);
  });
}

}  // namespace mom::cpu

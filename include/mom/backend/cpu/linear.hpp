#pragma once
// Linear layer y = x·wᵀ + b (PyTorch weight layout w[out × in]) and its backward.
// Both matrix products go through cpu::gemm; the bias is folded in as gemm's C input.
#include <algorithm>
#include <span>

#include "mom/backend/cpu/gemm.hpp"
#include "mom/backend/shape_checks.hpp"
#include "mom/core/check.hpp"
#include "mom/core/groups.hpp"
#include "mom/core/tensor.hpp"

namespace mom::cpu {

namespace detail {
// acc[c] += sum over rows r of m(r, c): the bias gradient. Parallel over column blocks, so
// each thread streams contiguous row segments and no two threads touch the same acc[c].
template <class T>
void add_column_sums(std::span<T> acc, MatrixView<const T> m) {
  constexpr index_t block = 256;
  const index_t nblocks = (m.cols + block - 1) / block;
#pragma omp parallel for schedule(static) if (m.rows * m.cols > (1 << 16) && nblocks > 1)
  for (index_t bi = 0; bi < nblocks; ++bi) {
    const index_t c0 = bi * block, c1 = std::min(m.cols, c0 + block);
    T* a = acc.data();
    for (index_t r = 0; r < m.rows; ++r) {
      const T* row = m.row(r);
#pragma omp simd
      for (index_t c = c0; c < c1; ++c) a[c] += row[c];
    }
  }
}
}  // namespace detail

// y[n×out] = x[n×in] · w[out×in]ᵀ + b[out]   (b may be empty: no bias). Writes y. With `rows` given, x is a
// table and y = x[rows]·wᵀ + b (n = rows.size(): the gather read inside the GEMM's packing, no copy).
// ep = Epilogue::relu: y = max(that, 0) as the product stores it (the bits of relu_forward after it).
template <class T>
void linear_forward(MatrixView<T> y, MatrixView<const T> x, std::span<const token_t> rows, MatrixView<const T> w,
                    std::span<const T> b, Epilogue ep = Epilogue::none) {
  checks::linear_forward_shapes<T>(y, rows.empty() ? x : MatrixView<const T>{x.data, ssize(rows), x.cols, x.ld}, w, b);
  if (!b.empty()) {
    // Broadcast the bias into y, then y += x·wᵀ (one extra pass over y, no temporary).
#pragma omp parallel for schedule(static) if (y.rows * y.cols > (1 << 16))
    for (index_t r = 0; r < y.rows; ++r) std::copy(b.begin(), b.end(), y.row(r));
  }
  gemm_gathered<T>(y, x, Trans::N, rows, w, Trans::T, {}, T(1), b.empty() ? T(0) : T(1), ep);
}
template <class T>
void linear_forward(MatrixView<T> y, MatrixView<const T> x, MatrixView<const T> w, std::span<const T> b) {
  linear_forward<T>(y, x, {}, w, b);
}

// Backward of linear_forward. Accumulates: dx += dy·w, dw += dyᵀ·x, db += Σ_rows dy (dx_store =
// Store::overwrite: dx = dy·w). dx and db may be empty (not wanted); dw may be empty too (frozen weight).
// dy and x are packed rows of tables (core/groups.hpp's ScaledRows): with x's row list (the gathered forward),
// dw += dyᵀ·x[rows] and dx [n × in] is the gathered rows' gradient, packed; with dy's, its rows (each times its
// scale) are read inside both products' packing, the same bits as writing them out first (a routed expert's
// dL/dy = weight · dout[token]). A bias gradient needs dy stored (the routed experts have no biases).
template <class T>
void linear_backward(MatrixView<T> dx, MatrixView<T> dw, std::span<T> db, ScaledRows<T> dy, ScaledRows<T> x,
                     MatrixView<const T> w, Store dx_store = Store::add) {
  checks::linear_backward_shapes<T>(dx, dw, db, dy.shape(), x.shape(), w);
  MOM_CHECK(x.scale.empty(), "linear_backward: x's rows carry no scale");
  MOM_CHECK(db.empty() || dy.index.empty(), "linear_backward: a bias gradient needs dy stored, not read through rows");
  if (!dx.empty())
    gemm_gathered<T>(dx, dy.table, Trans::N, dy.index, dy.scale, w, Trans::N, {}, T(1),
                     dx_store == Store::add ? T(1) : T(0));
  if (!dw.empty()) gemm_gathered<T>(dw, dy.table, Trans::T, dy.index, dy.scale, x.table, Trans::N, x.index, T(1), T(1));
  if (!db.empty()) detail::add_column_sums<T>(db, dy.table);
}
template <class T>
void linear_backward(MatrixView<T> dx, MatrixView<T> dw, std::span<T> db, MatrixView<const T> dy, MatrixView<const T> x,
                     std::span<const token_t> rows, MatrixView<const T> w, Store dx_store = Store::add) {
  linear_backward<T>(dx, dw, db, ScaledRows<T>{dy, {}, {}}, ScaledRows<T>{x, rows, {}}, w, dx_store);
}
template <class T>
void linear_backward(MatrixView<T> dx, MatrixView<T> dw, std::span<T> db, MatrixView<const T> dy, MatrixView<const T> x,
                     MatrixView<const T> w, Store dx_store = Store::add) {
  linear_backward<T>(dx, dw, db, ScaledRows<T>{dy, {}, {}}, ScaledRows<T>{x, {}, {}}, w, dx_store);
}

}  // namespace mom::cpu

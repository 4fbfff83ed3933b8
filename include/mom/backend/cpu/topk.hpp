#pragma once
// Per-row top-k (router selection) and row softmax (router probabilities).
#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>
#include <span>
#include <vector>

#include "mom/backend/cpu/eigen_map.hpp"
#include "mom/backend/shape_checks.hpp"
#include "mom/backend/topk_insert.hpp"
#include "mom/core/check.hpp"
#include "mom/core/tensor.hpp"

namespace mom::cpu {

namespace detail {
// Insertion into a sorted list of k: O(N k), an earlier index winning a tie (backend/topk_insert.hpp: one body
// with the CUDA kernels').
using backend_common::topk_insert;
// The same for a k fixed at compile time over a block of up to 16 rows at once, one row a vector lane (after
// each row's first K entries are inserted as above): every later entry moves each lane's list by selects on the K
// comparisons x > val[i], with no branches (the insertion's data-dependent branches mispredict about once per
// insertion, ~10 times a row for a top-4 of 43). On a sorted list those comparisons are monotone, so the selects
// make the insertion's list: the same picks and values. A NaN breaks the order, so the rows holding one are left
// to the insertion (the returned mask of lanes).
inline constexpr int topk_block_rows = 16;
template <int K, class T>
unsigned topk_select_block(const T* x, index_t ld, index_t rows, index_t N, T* val, index_t val_ld, token_t* ind,
                           index_t ind_ld) {
  constexpr int B = topk_block_rows;
  alignas(64) T v[K][B];
  alignas(64) token_t id[K][B];
  // off: each lane's row offset in x, 32-bit so that the loads below vectorise as gathers (the caller keeps
  // 16 · ld in range); lanes past the block repeat row 0 and are not stored.
  alignas(64) int nan[B], off[B];
  for (int l = 0; l < B; ++l) {
    const index_t r = l < rows ? l : 0;
    off[l] = int(r * ld);
    T tv[K];
    token_t ti[K];
    topk_insert(x + r * ld, K, K, tv, ti);
    nan[l] = 0;
    for (int i = 0; i < K; ++i) v[i][l] = tv[i], id[i][l] = ti[i], nan[l] |= tv[i] != tv[i];
  }
  for (index_t j = K; j < N; ++j) {
#pragma omp simd
    for (int l = 0; l < B; ++l) {
      const T e = x[off[l] + j];
      nan[l] |= e != e;
      bool c[K];
      for (int i = 0; i < K; ++i) c[i] = e > v[i][l];
      for (int i = K - 1; i > 0; --i) {
        v[i][l] = c[i - 1] ? v[i - 1][l] : c[i] ? e : v[i][l];
        id[i][l] = c[i - 1] ? id[i - 1][l] : c[i] ? token_t(j) : id[i][l];
      }
      v[0][l] = c[0] ? e : v[0][l];
      id[0][l] = c[0] ? token_t(j) : id[0][l];
    }
  }
  unsigned with_nan = 0;
  for (index_t l = 0; l < rows; ++l) {
    if (nan[l]) {
      with_nan |= 1u << l;
      continue;
    }
    for (int i = 0; i < K; ++i) val[l * val_ld + i] = v[i][l], ind[l * ind_ld + i] = id[i][l];
  }
  return with_nan;
}
// The block for k in 1..8; returns the rows it left to the insertion.
template <class T>
unsigned topk_select_block(const T* x, index_t ld, index_t rows, index_t N, index_t k, T* val, index_t val_ld,
                           token_t* ind, index_t ind_ld) {
  switch (k) {
    case 1: return topk_select_block<1>(x, ld, rows, N, val, val_ld, ind, ind_ld);
    case 2: return topk_select_block<2>(x, ld, rows, N, val, val_ld, ind, ind_ld);
    case 3: return topk_select_block<3>(x, ld, rows, N, val, val_ld, ind, ind_ld);
    case 4: return topk_select_block<4>(x, ld, rows, N, val, val_ld, ind, ind_ld);
    case 5: return topk_select_block<5>(x, ld, rows, N, val, val_ld, ind, ind_ld);
    case 6: return topk_select_block<6>(x, ld, rows, N, val, val_ld, ind, ind_ld);
    case 7: return topk_select_block<7>(x, ld, rows, N, val, val_ld, ind, ind_ld);
    case 8: return topk_select_block<8>(x, ld, rows, N, val, val_ld, ind, ind_ld);
    default: return (1u << rows) - 1;  // every row (rows < 32)
  }
}
}  // namespace detail

// values[i] / indices[i]: the k largest entries of row i of x, in descending order; equal values
// keep ascending index order (ties go to the lower index, so selection is deterministic).
template <class T>
void topk_rows(MatrixView<T> values, MatrixView<token_t> indices, MatrixView<const T> x) {
  checks::topk_rows_shapes<T>(values, indices, x);
  const index_t k = values.cols, N = x.cols;
  constexpr index_t B = detail::topk_block_rows;
  // A router's few picks of at most 256 classes: blocks of rows, branch-free (above); NaN rows by insertion.
  if (k <= 8 && N > k && N <= 256 && x.ld < (index_t(1) << 26)) {
    const index_t blocks = (x.rows + B - 1) / B;
#pragma omp parallel for schedule(static) if (x.rows * N > (1 << 13))
    for (index_t b = 0; b < blocks; ++b) {
      const index_t r0 = b * B, rows = std::min(B, x.rows - r0);
      const unsigned with_nan = detail::topk_select_block(x.row(r0), x.ld, rows, N, k, values.row(r0), values.ld,
                                                          indices.row(r0), indices.ld);
      for (index_t l = 0; l < rows; ++l)
        if (with_nan >> l & 1u) detail::topk_insert(x.row(r0 + l), N, k, values.row(r0 + l), indices.row(r0 + l));
    }
    return;
  }
#pragma omp parallel for schedule(static) if (x.rows * N > (1 << 13))  // a top-2 of 4 over 4096 rows: 2 threads
  for (index_t r = 0; r < x.rows; ++r) {
    const T* row = x.row(r);
    T* val = values.row(r);
    token_t* ind = indices.row(r);
    if (k <= 16) {
      detail::topk_insert(row, N, k, val, ind);  // branch-light for small k
    } else {
      thread_local std::vector<token_t> order;  // grows once to the widest row seen
      order.resize(static_cast<std::size_t>(N));
      std::iota(order.begin(), order.end(), token_t(0));
      std::partial_sort(order.begin(), order.begin() + k, order.end(), [row](token_t a, token_t b) {
        return row[a] > row[b] || (row[a] == row[b] && a < b);
      });
      for (index_t j = 0; j < k; ++j) {
        ind[j] = order[j];
        val[j] = row[order[j]];
      }
    }
  }
}

// dx[i, indices[i, j]] += dvalues[i, j]. Indices within a row are distinct (as topk_rows makes them).
template <class T>
void topk_rows_backward(MatrixView<T> dx, MatrixView<const T> dvalues, MatrixView<const token_t> indices) {
  checks::topk_rows_backward_shapes<T>(dx, dvalues, indices);
  for (index_t r = 0; r < indices.rows; ++r)
    for (index_t j = 0; j < indices.cols; ++j)
      MOM_CHECK(indices(r, j) >= 0 && indices(r, j) < dx.cols, "topk_rows_backward: indices(", r, ",", j, ") = ",
                indices(r, j), " is out of range for dx ", shape(dx));
  for (index_t r = 0; r < dx.rows; ++r)
    for (index_t j = 0; j < indices.cols; ++j) dx(r, indices(r, j)) += dvalues(r, j);
}

// y = softmax(scale · x) per row (max-subtracted). Writes y (may alias x).
template <class T>
void softmax_rows(MatrixView<T> y, MatrixView<const T> x, T scale = T(1)) {
  checks::softmax_rows_shapes<T>(y, x);
  const index_t N = x.cols;
#pragma omp parallel for schedule(static) if (x.rows * N > (1 << 15))
  for (index_t r = 0; r < x.rows; ++r) {
    const auto xr = map_vec(std::span<const T>(x.row(r), static_cast<std::size_t>(N))).array();
    auto yr = map_vec(std::span<T>(y.row(r), static_cast<std::size_t>(N))).array();
    const T m = scale >= T(0) ? xr.maxCoeff() * scale : xr.minCoeff() * scale;
    yr = (xr * scale - m).exp();
    yr /= yr.sum();
  }
}

// dx += scale · y ∘ (dy - Σ_j dy_j y_j) per row.
template <class T>
void softmax_rows_backward(MatrixView<T> dx, MatrixView<const T> dy, MatrixView<const T> y, T scale = T(1)) {
  checks::softmax_rows_backward_shapes<T>(dx, dy, y);
  const index_t N = y.cols;
#pragma omp parallel for schedule(static) if (y.rows * N > (1 << 15))
  for (index_t r = 0; r < y.rows; ++r) {
    const auto yr = map_vec(std::span<const T>(y.row(r), static_cast<std::size_t>(N))).array();
    const auto gr = map_vec(std::span<const T>(dy.row(r), static_cast<std::size_t>(N))).array();
    const T dot = (yr * gr).sum();
    map_vec(std::span<T>(dx.row(r), static_cast<std::size_t>(N))).array() += scale * yr * (gr - dot);
  }
}

}  // namespace mom::cpu

#pragma once
// Per-row top-k (router selection) and row softmax (router probabilities).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <span>
#include <vector>

#include "mom/backend/cpu/eigen_map.hpp"
#include "mom/backend/shape_checks.hpp"
#include "mom/core/check.hpp"
#include "mom/core/tensor.hpp"

namespace mom::cpu {

// values[i] / indices[i]: the k largest entries of row i of x, in descending order; equal values
// keep ascending index order (ties go to the lower index, so selection is deterministic).
template <class T>
void topk_rows(MatrixView<T> values, MatrixView<token_t> indices, MatrixView<const T> x) {
  checks::topk_rows_shapes<T>(values, indices, x);
  const index_t k = values.cols, N = x.cols;
#pragma omp parallel for schedule(static) if (x.rows * N > (1 << 13))  // a top-2 of 4 over 4096 rows: 2 threads
  for (index_t r = 0; r < x.rows; ++r) {
    const T* row = x.row(r);
    T* val = values.row(r);
    token_t* ind = indices.row(r);
    if (k <= 16) {
      // Insertion into a sorted list of k: O(N k), branch-light for the small k routers use.
      // A candidate goes after every kept entry that is >= it, so an earlier index wins a tie.
      index_t filled = 0;
      for (index_t j = 0; j < N; ++j) {
        const T xj = row[j];
        if (filled == k && !(xj > val[k - 1])) continue;
        index_t pos = filled < k ? filled++ : k - 1;
        while (pos > 0 && xj > val[pos - 1]) {
          val[pos] = val[pos - 1];
          ind[pos] = ind[pos - 1];
          --pos;
        }
        val[pos] = xj;
        ind[pos] = static_cast<token_t>(j);
      }
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

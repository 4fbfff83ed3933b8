#pragma once
// Token dispatch primitives: gather rows by an index list, weighted scatter-add back.
// A router's (module, weight) choices become: gather the chosen tokens' rows, run the module on
// the packed rows, scatter-add w · result into the residual stream.
#include <algorithm>
#include <cstring>
#include <span>

#include "mom/backend/cpu/parallel.hpp"
#include "mom/backend/shape_checks.hpp"
#include "mom/core/check.hpp"
#include "mom/core/tensor.hpp"

namespace mom::cpu {

namespace detail {
// Rows of at most this many values are copied element by element (a memcpy call costs more than the copy):
// gather_rows, and Backend::copy of a strided block.
inline constexpr index_t narrow_row = 8;
struct ScatterScratch;  // scatter_add_rows' row lists (thread_scratch's owner tag)
// Every idx[i] in [0, bound). The message names entry first + i (idx may be a part of a longer list) and the
// table, after its name when one is given ("for x [7x6]").
inline void check_row_indices(const char* op, std::span<const token_t> idx, index_t bound, Shape table,
                              index_t first = 0, const char* name = nullptr) {
  for (index_t i = 0; i < ssize(idx); ++i)
    MOM_CHECK(idx[i] >= 0 && idx[i] < bound, op, ": idx[", first + i, "] = ", idx[i], " is out of range [0, ", bound,
              ") for ", name ? name : "", name ? " " : "", table);
}
}  // namespace detail

// out[i] = in[idx[i]] for i < n. Writes out [n×d]; in is [T×d].
template <class T>
void gather_rows(MatrixView<T> out, MatrixView<const T> in, std::span<const token_t> idx) {
  checks::gather_rows_shapes<T>(out, in, idx);
  detail::check_row_indices("gather_rows", idx, in.rows, shape(in));
  const index_t d = in.cols;
#pragma omp parallel for schedule(static) if (out.rows * d > (1 << 16))
  for (index_t i = 0; i < out.rows; ++i) {
    const T* src = in.row(idx[i]);
    T* dst = out.row(i);
    if (d <= detail::narrow_row)  // a selection's weights into group order (one value a row): no call a row
      for (index_t c = 0; c < d; ++c) dst[c] = src[c];
    else
      std::memcpy(dst, src, static_cast<std::size_t>(d) * sizeof(T));
  }
}

// out[idx[i]] += w[i] · in[i] (w empty: all 1). Accumulates into out [T×d]; in is [n×d]. Store::overwrite:
// out = the sum instead (rows no entry names are zero: out need not be zeroed first, and it is not read).
// Indices may repeat (their contributions add up; a routed layer's token appears once per module it picked),
// and the additions into a row are made in the entries' order, whatever the thread count. Large calls first
// list each output row's entries in order (a counting sort by row, O(n + T) indices in this thread's
// scratch) and then give each thread whole output rows: a row is read and written once while all its entries
// add into it, instead of once per entry (K times for a top-K layer, from anywhere in the last-level cache).
// The backward of gather_rows(out, in, idx) is scatter_add_rows(din, dout, idx, {}).
template <class T>
void scatter_add_rows(MatrixView<T> out, MatrixView<const T> in, std::span<const token_t> idx,
                      std::span<const T> weights, Store st = Store::add) {
  checks::scatter_add_rows_shapes<T>(out, in, idx, weights);
  detail::check_row_indices("scatter_add_rows", idx, out.rows, shape(out));
  const index_t d = in.cols, n = in.rows;
  // Entry i into its row: added, or (the row's first entry under overwrite) stored, = 0 + w·x's value.
  auto add = [&](index_t i, bool first) {
    const T w = weights.empty() ? T(1) : weights[i];
    const T* src = in.row(i);
    T* dst = out.row(idx[i]);
    if (first) {
#pragma omp simd
      for (index_t c = 0; c < d; ++c) dst[c] = w * src[c];
    } else {
#pragma omp simd
      for (index_t c = 0; c < d; ++c) dst[c] += w * src[c];
    }
  };
  const bool overwrite = st == Store::overwrite;
  if (n * d <= (1 << 16)) {
    if (overwrite)
      for (index_t r = 0; r < out.rows; ++r) std::fill_n(out.row(r), d, T(0));
    for (index_t i = 0; i < n; ++i) add(i, false);
    return;
  }
  index_t* end = detail::thread_scratch<index_t, detail::ScatterScratch, 0>(std::size_t(out.rows));
  index_t* order = detail::thread_scratch<index_t, detail::ScatterScratch, 1>(std::size_t(n));
  std::fill(end, end + out.rows, index_t(0));
  for (index_t i = 0; i < n; ++i) ++end[idx[i]];
  for (index_t r = 1; r < out.rows; ++r) end[r] += end[r - 1];  // end[r]: one past row r's last entry
  for (index_t i = n - 1; i >= 0; --i) order[--end[idx[i]]] = i;  // end[r] is now row r's first entry
#pragma omp parallel for schedule(static)
  for (index_t r = 0; r < out.rows; ++r) {
    const index_t start = end[r], stop = r + 1 < out.rows ? end[r + 1] : n;
    if (overwrite && start == stop) std::fill_n(out.row(r), d, T(0));
    for (index_t j = start; j < stop; ++j) add(order[j], overwrite && j == start);
  }
}

// Backward of scatter_add_rows: din[i] += w[i] · dout[idx[i]], dweights[i] += dout[idx[i]] · in[i]
// (Store::overwrite: = instead of +=, both). din and dweights may each be empty (not wanted); weights empty
// means all 1.
template <class T>
void scatter_add_rows_backward(MatrixView<T> din, std::span<T> dweights, MatrixView<const T> dout,
                               MatrixView<const T> in, std::span<const token_t> idx, std::span<const T> weights,
                               Store st = Store::add) {
  checks::scatter_add_rows_backward_shapes<T>(din, dweights, dout, in, idx, weights);
  detail::check_row_indices("scatter_add_rows_backward", idx, dout.rows, shape(dout));
  const index_t d = in.cols;
#pragma omp parallel for schedule(static) if (in.rows * d > (1 << 16))
  for (index_t i = 0; i < in.rows; ++i) {
    const T* g = dout.row(idx[i]);
    if (!din.empty()) {
      const T w = weights.empty() ? T(1) : weights[i];
      T* dst = din.row(i);
      if (st == Store::add) {
#pragma omp simd
        for (index_t c = 0; c < d; ++c) dst[c] += w * g[c];
      } else {
#pragma omp simd
        for (index_t c = 0; c < d; ++c) dst[c] = w * g[c];
      }
    }
    if (!dweights.empty()) {
      const T* src = in.row(i);
      T acc = T(0);
#pragma omp simd reduction(+ : acc)
      for (index_t c = 0; c < d; ++c) acc += g[c] * src[c];
      dweights[i] = (st == Store::add ? dweights[i] : T(0)) + acc;
    }
  }
}

// The backward of weights applied to rows after a linear product (routing/dispatch.hpp's combine_linear_backward
// on a backend that WeighsAfterProducts): y[i] = a[i] Wᵀ was combined as w[i] · y[i], and u[i] = dL/d(w[i] y[i]) · W
// is the product's input gradient before the weight. Over rows i (a's row idx[i] when idx is given, else row i):
//   dwp[i] = u[i] · a[i]          (= dL/d(w[i] y[i]) · y[i] by associativity: dL/d(weight i), written)
//   d[i]   = w[i] · u[i]          (relu: and 0 where a[i] <= 0: ReLU's backward read from its output a = max(h, 0))
// d may alias u; dwp may be empty (not wanted); w empty: all 1.
template <class T>
void weight_rows_backward(MatrixView<T> d, std::span<T> dwp, MatrixView<const T> u, MatrixView<const T> a,
                          std::span<const token_t> idx, std::span<const T> w, bool relu) {
  checks::weight_rows_backward_shapes<T>(d, dwp, u, a, idx, w);
  detail::check_row_indices("weight_rows_backward", idx, a.rows, shape(a));
  const index_t n = u.rows, c = u.cols;
#pragma omp parallel for schedule(static) if (n * c > (1 << 16))
  for (index_t i = 0; i < n; ++i) {
    const T* ui = u.row(i);
    const T* ai = a.row(idx.empty() ? i : idx[std::size_t(i)]);
    T* di = d.row(i);
    T acc = T(0);
#pragma omp simd reduction(+ : acc)
    for (index_t j = 0; j < c; ++j) acc += ui[j] * ai[j];
    if (!dwp.empty()) dwp[std::size_t(i)] = acc;
    const T wi = w.empty() ? T(1) : w[std::size_t(i)];
    if (relu) {
#pragma omp simd
      for (index_t j = 0; j < c; ++j) di[j] = ai[j] > T(0) ? wi * ui[j] : T(0);
    } else {
#pragma omp simd
      for (index_t j = 0; j < c; ++j) di[j] = wi * ui[j];
    }
  }
}

}  // namespace mom::cpu

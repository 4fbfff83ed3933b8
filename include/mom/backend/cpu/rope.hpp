#pragma once
// Rotary position embedding (RoPE; Su et al., RoFormer, arXiv 2104.09864), forward and backward side by
// side, applied in place to the query / key columns of attention (modules/mha.hpp).
//
// x [rows × cols] is a (column block of a) packed matrix: row r is one token, its cols columns are whole
// heads of head_dim = 2h columns (cols = heads·head_dim; the q and k blocks of qkv together are 2·heads
// heads, all rotated alike). The token at position p rotates each head pair by pair, in the GPT-NeoX /
// Llama "rotate_half" layout (pair i = columns i and i + h of the head, i < h):
//   θ_i = base^(−2i/head_dim)                                        (base 10000: eq. (15), 0-based i)
//   x'_i     = x_i · cos(p·θ_i) − x_{i+h} · sin(p·θ_i)
//   x'_{i+h} = x_{i+h} · cos(p·θ_i) + x_i · sin(p·θ_i)                (eq. (34))
// The paper pairs neighbouring columns (2i, 2i+1); rotate_half pairs i with i + h, the same rotation up
// to a fixed permutation of each head's columns (which the learned W_qkv absorbs). With q' = R_t q and
// k' = R_s k the score q'·k' = qᵀ R_{s−t} k depends on the positions only through s − t (eq. (16)).
//
// R_p is orthogonal, so backward is dx = R_pᵀ dx' = R_{−p} dx': rope_backward rotates the incoming
// gradient by −p·θ_i, **in place** (its input is dL/dx', its output dL/dx; unlike the other backward
// ops it does not accumulate into a separate output).
//
// Positions:
//   rope_forward(x, pos, seq, head_dim, base)              every row: p = pos[r] if pos is given (an
//                                                          incremental decode step: one row per sequence,
//                                                          0 <= pos[r] < seq), else p = r mod seq (rows
//                                                          b·seq + t of a (batch, seq) step)
//   rope_forward(x, idx, seq, head_dim, base, groups)      the grouped rows [offsets[0], offsets[count])
//                                                          only (core/groups.hpp), p = idx[r] mod seq
//                                                          (idx: the flat token index b·seq + t of a
//                                                          routed row); other rows are not touched
// The angles are computed on the fly in double for every (row, pair) — one pow, sin and cos per pair,
// shared by all the row's heads — so there is no table and nothing is allocated (at most 32 pairs' cos /
// sin on the stack at a time); float data is rotated with the rounded cos / sin.
#include <algorithm>
#include <cmath>
#include <span>

#include "mom/backend/cpu/grouped.hpp"
#include "mom/backend/shape_checks.hpp"
#include "mom/core/check.hpp"
#include "mom/core/groups.hpp"
#include "mom/core/tensor.hpp"

namespace mom::cpu {

namespace detail {
inline constexpr index_t rope_pairs_per_pass = 32;  // pairs whose cos / sin are on the stack at once

// θ_i = base^(−2i/head_dim) (the same expression in the CUDA kernel and the tests).
inline double rope_inv_freq(double base, index_t i, index_t head_dim) {
  return std::pow(base, -2.0 * double(i) / double(head_dim));
}

// Rotates the cols / head_dim heads of one row by sign·p·θ_i (sign +1: forward, −1: backward).
template <class T>
void rope_row(T* row, index_t cols, index_t head_dim, double p, double base, double sign) {
  const index_t half = head_dim / 2;
  T c[rope_pairs_per_pass], s[rope_pairs_per_pass];
  for (index_t i0 = 0; i0 < half; i0 += rope_pairs_per_pass) {
    const index_t m = std::min(rope_pairs_per_pass, half - i0);
    for (index_t j = 0; j < m; ++j) {
      const double a = p * rope_inv_freq(base, i0 + j, head_dim);
      c[j] = T(std::cos(a));
      s[j] = T(sign * std::sin(a));
    }
    for (index_t h0 = 0; h0 < cols; h0 += head_dim) {
      T* lo = row + h0 + i0;
      T* hi = lo + half;
#pragma omp simd
      for (index_t j = 0; j < m; ++j) {
        const T x1 = lo[j], x2 = hi[j];
        lo[j] = x1 * c[j] - x2 * s[j];
        hi[j] = x2 * c[j] + x1 * s[j];
      }
    }
  }
}

// Rows [lo, hi) of x, row r at position position(r).
template <class T, class P>
void rope_rows(MatrixView<T> x, index_t lo, index_t hi, index_t head_dim, T base, double sign, P&& position) {
#pragma omp parallel for schedule(static) if ((hi - lo) * x.cols > (1 << 15))
  for (index_t r = lo; r < hi; ++r) rope_row(x.row(r), x.cols, head_dim, double(position(r)), double(base), sign);
}

template <class T>
void rope_all_rows(const char* op, MatrixView<T> x, std::span<const index_t> pos, index_t seq, index_t head_dim,
                   T base, double sign) {
  checks::rope_shapes<T>(op, x, pos.empty() ? -1 : ssize(pos), seq, head_dim, base);
  for (index_t r = 0; r < ssize(pos); ++r)
    MOM_CHECK(pos[std::size_t(r)] >= 0 && pos[std::size_t(r)] < seq, op, ": pos[", r, "] = ", pos[std::size_t(r)],
              " is outside [0, seq = ", seq, ")");
  if (pos.empty()) rope_rows(x, 0, x.rows, head_dim, base, sign, [seq](index_t r) { return r % seq; });
  else rope_rows(x, 0, x.rows, head_dim, base, sign, [pos](index_t r) { return pos[std::size_t(r)]; });
}

template <class T>
void rope_grouped_rows(const char* op, MatrixView<T> x, std::span<const token_t> idx, index_t seq, index_t head_dim,
                       T base, RowGroups g, double sign) {
  checks::rope_shapes<T>(op, x, ssize(idx), seq, head_dim, base);
  // Every check before the first write (offsets, then the grouped rows' indices).
  for_each_group(op, g, x.rows, [&](int, index_t o, index_t n) {
    for (index_t r = o; r < o + n; ++r)
      MOM_CHECK(idx[std::size_t(r)] >= 0, op, ": idx[", r, "] = ", idx[std::size_t(r)], " is negative");
  });
  for_each_group(op, g, x.rows, [&](int, index_t o, index_t n) {
    rope_rows(x, o, o + n, head_dim, base, sign, [idx, seq](index_t r) { return index_t(idx[std::size_t(r)]) % seq; });
  });
}
}  // namespace detail

// x ← R_p x for every row (p = pos[r], or r mod seq when pos is empty). Writes x in place.
template <class T>
void rope_forward(MatrixView<T> x, std::span<const index_t> pos, index_t seq, index_t head_dim, T base) {
  detail::rope_all_rows<T>("rope_forward", x, pos, seq, head_dim, base, 1.0);
}
// dx ← R_pᵀ dx = R_{−p} dx for the same rows and positions (in place).
template <class T>
void rope_backward(MatrixView<T> dx, std::span<const index_t> pos, index_t seq, index_t head_dim, T base) {
  detail::rope_all_rows<T>("rope_backward", dx, pos, seq, head_dim, base, -1.0);
}

// x ← R_p x for the grouped rows r (p = idx[r] mod seq); the other rows are not read or written.
template <class T>
void rope_forward(MatrixView<T> x, std::span<const token_t> idx, index_t seq, index_t head_dim, T base, RowGroups g) {
  detail::rope_grouped_rows<T>("rope_forward", x, idx, seq, head_dim, base, g, 1.0);
}
// dx ← R_{−p} dx for the grouped rows (in place).
template <class T>
void rope_backward(MatrixView<T> dx, std::span<const token_t> idx, index_t seq, index_t head_dim, T base,
                   RowGroups g) {
  detail::rope_grouped_rows<T>("rope_backward", dx, idx, seq, head_dim, base, g, -1.0);
}

}  // namespace mom::cpu

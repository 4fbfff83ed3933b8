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
// The angles p·θ_i are computed in double and rounded to T once per (position, pair) into a table of
// cos / sin for positions 0..seq-1 (detail::RopeTable): built by the calling thread when (seq, head_dim,
// base, T) change — the first step of a training run or of a decoder — and reused by every later call,
// so a training step computes no sin / cos and allocates nothing (the table grows once, as the ops'
// per-thread scratch does). The values are those of computing them on the fly.
#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

#include "mom/backend/cpu/grouped.hpp"
#include "mom/backend/shape_checks.hpp"
#include "mom/core/check.hpp"
#include "mom/core/groups.hpp"
#include "mom/core/tensor.hpp"

namespace mom::cpu {

namespace detail {

// θ_i = base^(−2i/head_dim) (the same expression in the CUDA kernel and the tests).
inline double rope_inv_freq(double base, index_t i, index_t head_dim) {
  return std::pow(base, -2.0 * double(i) / double(head_dim));
}

// cos(p·θ_i), sin(p·θ_i) for p < seq, i < head_dim / 2: row p holds the half cosines, then the half sines.
template <class T>
struct RopeTable {
  index_t seq = -1, head_dim = -1;
  double base = 0;
  std::vector<T> cs;
  const T* get(index_t s, index_t hd, double b) {
    if (s != seq || hd != head_dim || b != base) {
      const index_t half = hd / 2;
      cs.resize(std::size_t(s * hd));
      for (index_t p = 0; p < s; ++p)
        for (index_t i = 0; i < half; ++i) {
          const double a = double(p) * rope_inv_freq(b, i, hd);
          cs[std::size_t(p * hd + i)] = T(std::cos(a));
          cs[std::size_t(p * hd + half + i)] = T(std::sin(a));
        }
      seq = s, head_dim = hd, base = b;
    }
    return cs.data();
  }
};
template <class T>
const T* rope_table(index_t seq, index_t head_dim, double base) {
  thread_local RopeTable<T> table;  // the calling thread's; the parallel loops only read it
  return table.get(seq, head_dim, base);
}

// Rotates the cols / head_dim heads of one row by sign·p·θ_i (sign +1: forward, −1: backward); cs: the
// table row of its position.
template <class T>
void rope_row(T* row, index_t cols, index_t head_dim, const T* cs, T sign) {
  const index_t half = head_dim / 2;
  const T* c = cs;
  const T* sn = cs + half;
  for (index_t h0 = 0; h0 < cols; h0 += head_dim) {
    T* lo = row + h0;
    T* hi = lo + half;
#pragma omp simd
    for (index_t j = 0; j < half; ++j) {
      const T x1 = lo[j], x2 = hi[j], s = sign * sn[j];
      lo[j] = x1 * c[j] - x2 * s;
      hi[j] = x2 * c[j] + x1 * s;
    }
  }
}

// Rows [lo, hi) of x, row r at position position(r) < seq.
template <class T, class P>
void rope_rows(MatrixView<T> x, index_t lo, index_t hi, index_t seq, index_t head_dim, T base, double sign,
               P&& position) {
  const T* table = rope_table<T>(seq, head_dim, double(base));
#pragma omp parallel for schedule(static) if ((hi - lo) * x.cols > (1 << 15))
  for (index_t r = lo; r < hi; ++r) rope_row(x.row(r), x.cols, head_dim, table + position(r) * head_dim, T(sign));
}

template <class T>
void rope_all_rows(const char* op, MatrixView<T> x, std::span<const index_t> pos, index_t seq, index_t head_dim,
                   T base, double sign) {
  checks::rope_shapes<T>(op, x, pos.empty() ? -1 : ssize(pos), seq, head_dim, base);
  for (index_t r = 0; r < ssize(pos); ++r)
    MOM_CHECK(pos[std::size_t(r)] >= 0 && pos[std::size_t(r)] < seq, op, ": pos[", r, "] = ", pos[std::size_t(r)],
              " is outside [0, seq = ", seq, ")");
  if (pos.empty()) rope_rows(x, 0, x.rows, seq, head_dim, base, sign, [seq](index_t r) { return r % seq; });
  else rope_rows(x, 0, x.rows, seq, head_dim, base, sign, [pos](index_t r) { return pos[std::size_t(r)]; });
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
    rope_rows(x, o, o + n, seq, head_dim, base, sign, [idx, seq](index_t r) { return index_t(idx[std::size_t(r)]) % seq; });
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

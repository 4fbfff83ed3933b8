#pragma once
// Token + learned positional embedding (GPT-2): out[t] = wte[tokens[t]] + wpe[t mod seq], or wpe[pos[t]] for rows
// at positions of their own (a decode step's); wpe may be empty: token embedding only.
#include <algorithm>
#include <limits>
#include <span>

#include "mom/backend/shape_checks.hpp"
#include "mom/core/check.hpp"
#include "mom/core/tensor.hpp"

namespace mom::cpu {

namespace detail {
template <class T>
void check_token_ids(const char* op, std::span<const token_t> tokens, MatrixView<const T> wte) {
  // One pass over the ids (cheap next to the n×d copy): an id out of range would read outside wte.
  for (index_t t = 0; t < ssize(tokens); ++t)
    MOM_CHECK(tokens[t] >= 0 && tokens[t] < wte.rows, op, ": token id ", tokens[t], " at position ", t,
              " is out of range for wte ", shape(wte));
}
template <class T>
void check_embedding_shapes(const char* op, MatrixView<const T> rows, std::span<const token_t> tokens,
                            MatrixView<const T> wte, MatrixView<const T> wpe, index_t seq) {
  checks::embedding_shapes<T>(op, rows, tokens, wte, wpe, seq);
  check_token_ids<T>(op, tokens, wte);
}
// out[t] = wte[tokens[t]] + wpe[position(t)] (no wpe: wte[tokens[t]]).
template <class T, class Position>
void embed_rows(MatrixView<T> out, std::span<const token_t> tokens, MatrixView<const T> wte, MatrixView<const T> wpe,
                Position position) {
  const index_t d = out.cols;
  const bool positions = !wpe.empty();
#pragma omp parallel for schedule(static) if (out.rows * d > (1 << 16))
  for (index_t t = 0; t < out.rows; ++t) {
    const T* e = wte.row(tokens[t]);
    T* o = out.row(t);
    if (positions) {
      const T* p = wpe.row(position(t));
#pragma omp simd
      for (index_t c = 0; c < d; ++c) o[c] = e[c] + p[c];
    } else {
#pragma omp simd
      for (index_t c = 0; c < d; ++c) o[c] = e[c];
    }
  }
}
}  // namespace detail

// out[B*S × d]: row t = wte[tokens[t]] + wpe[t mod seq]. Writes out. An empty wpe: out[t] = wte[tokens[t]]
// (no learned positions: a RoPE model rotates queries and keys instead, cpu/rope.hpp).
template <class T>
void embedding_forward(MatrixView<T> out, std::span<const token_t> tokens, MatrixView<const T> wte,
                       MatrixView<const T> wpe, index_t seq) {
  detail::check_embedding_shapes<T>("embedding_forward", out, tokens, wte, wpe, seq);
  detail::embed_rows<T>(out, tokens, wte, wpe, [seq](index_t t) { return t % seq; });
}

// Rows at positions of their own (infer/decoder.hpp: a step's rows of several sequences): out[r] =
// wte[tokens[r]] + wpe[pos[r]] (an empty wpe: wte[tokens[r]], and pos is not read).
template <class T>
void embedding_forward(MatrixView<T> out, std::span<const token_t> tokens, MatrixView<const T> wte,
                       MatrixView<const T> wpe, std::span<const index_t> pos) {
  checks::embedding_at_shapes<T>("embedding_forward", out, tokens, wte, wpe, ssize(pos));
  detail::check_token_ids<T>("embedding_forward", tokens, wte);
  if (!wpe.empty())
    for (index_t r = 0; r < ssize(pos); ++r)
      MOM_CHECK(pos[std::size_t(r)] >= 0 && pos[std::size_t(r)] < wpe.rows, "embedding_forward: position ",
                pos[std::size_t(r)], " of row ", r, " is out of range for wpe ", shape(wpe));
  detail::embed_rows<T>(out, tokens, wte, wpe, [pos](index_t r) { return pos[std::size_t(r)]; });
}

// Accumulates dwte[tokens[t]] += dout[t] and dwpe[t mod seq] += dout[t]. Either gradient may be
// empty (not wanted). Repeated token ids hit the same dwte row, so threads split the columns,
// not the rows: no two threads ever write the same element.
template <class T>
void embedding_backward(MatrixView<T> dwte, MatrixView<T> dwpe, MatrixView<const T> dout,
                        std::span<const token_t> tokens, index_t seq) {
  // Shapes are checked against whichever gradients are present (an absent one takes dout's shape).
  const MatrixView<const T> wte = dwte.empty() ? MatrixView<const T>(dout.data, std::numeric_limits<token_t>::max(), dout.cols)
                                               : MatrixView<const T>(dwte);
  const MatrixView<const T> wpe = dwpe.empty() ? MatrixView<const T>(dout.data, seq, dout.cols) : MatrixView<const T>(dwpe);
  detail::check_embedding_shapes<T>("embedding_backward", dout, tokens, wte, wpe, seq);
  const index_t d = dout.cols;
  constexpr index_t block = 128;
  const index_t nblocks = (d + block - 1) / block;
#pragma omp parallel for schedule(static) if (dout.rows * d > (1 << 16) && nblocks > 1)
  for (index_t bi = 0; bi < nblocks; ++bi) {
    const index_t c0 = bi * block, c1 = std::min(d, c0 + block);
    for (index_t t = 0; t < dout.rows; ++t) {
      const T* g = dout.row(t);
      if (!dwte.empty()) {
        T* e = dwte.row(tokens[t]);
#pragma omp simd
        for (index_t c = c0; c < c1; ++c) e[c] += g[c];
      }
      if (!dwpe.empty()) {
        T* p = dwpe.row(t % seq);
#pragma omp simd
        for (index_t c = c0; c < c1; ++c) p[c] += g[c];
      }
    }
  }
}

}  // namespace mom::cpu

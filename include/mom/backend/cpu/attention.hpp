#pragma once
// Causal multi-head self-attention, fused per (sequence, head), flash-attention style:
// forward saves only the row log-sum-exp of the scaled scores; backward recomputes the
// probabilities from q, k and lse.
//
// qkv is [B*S × 3d] with columns [q | k | v]; head h reads columns h*hd .. h*hd+hd-1 of each part
// (hd = d / heads). out is [B*S × d] in the same head-major column order. lse is [B*heads*S],
// element ((b*heads + h)*S + i). Scale 1/sqrt(hd) (Vaswani et al., eq. (1)).
//
// Each (b, h) pair is one task: its q, k, v, out, dout, dqkv blocks are strided views into the big
// matrices (no copies), and pairs write disjoint blocks, so OpenMP runs pairs in parallel. Within a
// pair, query rows go in blocks of kAttentionBlock: block [i0, i1) only needs keys [0, i1), so its
// scores are one dense [rows × i1] cpu::gemm and the causal mask wastes at most half a block per
// row (the triangle never computed is ~all of the upper half). cpu::gemm runs on the calling thread
// inside the parallel region (and uses every thread when there is a single pair). The score blocks
// live in thread_local scratch ([kAttentionBlock × S], two of them in backward) that grows once to
// the largest S seen and is reused by every later call: no allocation in a step after warm-up.
#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

#include "mom/backend/cpu/eigen_map.hpp"
#include "mom/backend/cpu/gemm.hpp"
#include "mom/backend/cpu/parallel.hpp"
#include "mom/backend/cpu/vecmath.hpp"
#include "mom/backend/shape_checks.hpp"
#include "mom/core/check.hpp"
#include "mom/core/tensor.hpp"

namespace mom::cpu {

inline constexpr index_t kAttentionBlock = 64;

namespace detail {
// This thread's [kAttentionBlock × seq] score scratch number Slot (aligned, grown once).
struct AttentionScratch;
template <class T, int Slot>
T* attention_scratch(index_t seq) {
  return thread_scratch<T, AttentionScratch, Slot>(static_cast<std::size_t>(kAttentionBlock * seq));
}

// The strided [seq × hd] block of head h in part (0 = q, 1 = k, 2 = v) of sequence b.
template <class T>
MatrixView<T> head_block(MatrixView<T> m, index_t b, index_t seq, index_t col0, index_t hd) {
  return m.row_block(b * seq, seq).col_block(col0, hd);
}

// s[0..n) = exp(s·scale - shift), returning the sum: float by vecmath's dispatched kernels (as wide as
// the CPU whatever the program's flags), double by Eigen.
template <class T>
T exp_affine(T* s, index_t n, T scale, T shift) {
  if constexpr (std::is_same_v<T, float>) {
    return vecmath::exp_affine(s, n, scale, shift);
  } else {
    auto a = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>(s, n);
    a = (a * scale - shift).exp();
    return a.sum();
  }
}

// A row's valid scores s[0..i]: an Eigen array over the first i+1 entries.
template <class T>
auto score_row(T* row, index_t i) {
  return Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>(row, i + 1);
}
}  // namespace detail

// out = softmax(q kᵀ / sqrt(hd) + causal mask) v per (sequence, head); lse saved per score row.
template <class T>
void attention_forward(MatrixView<T> out, std::span<T> lse, MatrixView<const T> qkv, index_t batch, index_t seq,
                       index_t heads) {
  checks::attention_shapes<T>("attention_forward", qkv, out, lse, batch, seq, heads);
  const index_t d = qkv.cols / 3, hd = d / heads;
  const T scale = T(1) / std::sqrt(T(hd));
#pragma omp parallel if (batch * heads > 1 && seq * seq * hd > (1 << 14))
  {
  // Every thread of the team sizes its scratch here, also one that gets no pair this time, so a
  // later step never grows it (no allocation after the first step).
  T* scratch = detail::attention_scratch<T, 0>(seq);
#pragma omp for schedule(dynamic)
  for (index_t bh = 0; bh < batch * heads; ++bh) {
    const index_t b = bh / heads, h = bh % heads;
    const auto q = detail::head_block(qkv, b, seq, h * hd, hd);
    const auto k = detail::head_block(qkv, b, seq, d + h * hd, hd);
    const auto v = detail::head_block(qkv, b, seq, 2 * d + h * hd, hd);
    const auto o = detail::head_block(out, b, seq, h * hd, hd);
    T* row_lse = lse.data() + bh * seq;
    for (index_t i0 = 0; i0 < seq; i0 += kAttentionBlock) {
      const index_t i1 = std::min(seq, i0 + kAttentionBlock), rows = i1 - i0;
      const MatrixView<T> p(scratch, rows, i1);  // scores of queries [i0, i1) against keys [0, i1)
      gemm<T>(p, q.row_block(i0, rows), Trans::N, k.row_block(0, i1), Trans::T);
      for (index_t r = 0; r < rows; ++r) {
        const index_t i = i0 + r;
        auto s = detail::score_row(p.row(r), i);
        const T m = s.maxCoeff() * scale;
        const T sum = detail::exp_affine(p.row(r), i + 1, scale, m);  // s = exp(s·scale - m)
        s *= T(1) / sum;
        row_lse[i] = m + std::log(sum);
        std::fill(p.row(r) + i + 1, p.row(r) + i1, T(0));  // causal mask: keys after i
      }
      gemm<T>(o.row_block(i0, rows), p, Trans::N, v.row_block(0, i1), Trans::N);
    }
  }
  }
}

// Accumulates dqkv += (d out / d qkv)ᵀ dout. With P the probabilities (recomputed from lse),
// dV = Pᵀ dO, dP = dO Vᵀ, dS = P ∘ (dP - rowsum(dO ∘ O)), dQ = scale dS K, dK = scale dSᵀ Q.
template <class T>
void attention_backward(MatrixView<T> dqkv, MatrixView<const T> dout, MatrixView<const T> out, std::span<const T> lse,
                        MatrixView<const T> qkv, index_t batch, index_t seq, index_t heads) {
  checks::attention_shapes<T>("attention_backward", qkv, out, lse, batch, seq, heads);
  checks::attention_backward_grad_shapes<T>("attention_backward", dqkv, dout, out, qkv);
  const index_t d = qkv.cols / 3, hd = d / heads;
  const T scale = T(1) / std::sqrt(T(hd));
#pragma omp parallel if (batch * heads > 1 && seq * seq * hd > (1 << 14))
  {
  T* scratch_p = detail::attention_scratch<T, 0>(seq);  // sized on every thread (see forward)
  T* scratch_ds = detail::attention_scratch<T, 1>(seq);
#pragma omp for schedule(dynamic)
  for (index_t bh = 0; bh < batch * heads; ++bh) {
    const index_t b = bh / heads, h = bh % heads;
    const auto q = detail::head_block(qkv, b, seq, h * hd, hd);
    const auto k = detail::head_block(qkv, b, seq, d + h * hd, hd);
    const auto v = detail::head_block(qkv, b, seq, 2 * d + h * hd, hd);
    const auto o = detail::head_block(out, b, seq, h * hd, hd);
    const auto dO = detail::head_block(dout, b, seq, h * hd, hd);
    const auto dq = detail::head_block(dqkv, b, seq, h * hd, hd);
    const auto dk = detail::head_block(dqkv, b, seq, d + h * hd, hd);
    const auto dv = detail::head_block(dqkv, b, seq, 2 * d + h * hd, hd);
    const T* row_lse = lse.data() + bh * seq;
    for (index_t i0 = 0; i0 < seq; i0 += kAttentionBlock) {
      const index_t i1 = std::min(seq, i0 + kAttentionBlock), rows = i1 - i0;
      const MatrixView<T> p(scratch_p, rows, i1), ds(scratch_ds, rows, i1);
      gemm<T>(p, q.row_block(i0, rows), Trans::N, k.row_block(0, i1), Trans::T);
      for (index_t r = 0; r < rows; ++r) {
        const index_t i = i0 + r;
        detail::exp_affine(p.row(r), i + 1, scale, row_lse[i]);
        std::fill(p.row(r) + i + 1, p.row(r) + i1, T(0));
      }
      gemm<T>(dv.row_block(0, i1), p, Trans::T, dO.row_block(i0, rows), Trans::N, T(1), T(1));
      gemm<T>(ds, dO.row_block(i0, rows), Trans::N, v.row_block(0, i1), Trans::T);
      for (index_t r = 0; r < rows; ++r) {
        const index_t i = i0 + r;
        T di = T(0);  // Σ_j P_ij dP_ij = dO_i · O_i
        for (index_t c = 0; c < hd; ++c) di += dO(i, c) * o(i, c);
        auto g = detail::score_row(ds.row(r), i);
        g = scale * detail::score_row(p.row(r), i) * (g - di);
        std::fill(ds.row(r) + i + 1, ds.row(r) + i1, T(0));
      }
      gemm<T>(dq.row_block(i0, rows), ds, Trans::N, k.row_block(0, i1), Trans::N, T(1), T(1));
      gemm<T>(dk.row_block(0, i1), ds, Trans::T, q.row_block(i0, rows), Trans::N, T(1), T(1));
    }
  }
  }
}

}  // namespace mom::cpu

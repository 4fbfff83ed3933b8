#pragma once
// Causal multi-head self-attention, fused per (sequence, head), flash-attention style:
// forward saves only the row log-sum-exp of the scaled scores; backward recomputes the
// probabilities from q, k and lse.
//
// qkv is [B*S × 3d] with columns [q | k | v]; head h reads columns h*hd .. h*hd+hd-1 of each part
// (hd = d / heads). out is [B*S × d] in the same head-major column order. lse is [B*heads*S],
// element ((b*heads + h)*S + i). Scale 1/sqrt(hd) (Vaswani et al., eq. (1)).
//
// Each (b, h) pair is one task: its q, k, v, out, dout, dqkv blocks are strided maps into the big
// matrices (no copies), and pairs write disjoint blocks, so OpenMP runs pairs in parallel. The
// S×S score block of a pair lives in a thread_local scratch that grows once to the largest S seen
// and is reused by every later call (no allocation in a training step after warm-up). The S×S
// products are small, so they are Eigen products on the maps, evaluated single-threaded inside
// the parallel region (Eigen does not nest its own threads there); only the causal lower
// triangle is ever computed (triangular products: half the FLOPs of a dense S×S).
#include <cmath>
#include <span>
#include <vector>

#include "mom/backend/cpu/eigen_map.hpp"
#include "mom/core/check.hpp"
#include "mom/core/tensor.hpp"

namespace mom::cpu {

namespace detail {
template <class T>
void check_attention_shapes(const char* op, MatrixView<const T> qkv, MatrixView<const T> out, std::span<const T> lse,
                            index_t batch, index_t seq, index_t heads) {
  MOM_CHECK(batch > 0 && seq > 0 && heads > 0, op, ": batch ", batch, ", seq ", seq, ", heads ", heads,
            " must be positive");
  MOM_CHECK(qkv.cols % 3 == 0, op, ": qkv ", shape(qkv), " must have 3*d columns [q | k | v]");
  const index_t d = qkv.cols / 3;
  MOM_CHECK(d % heads == 0, op, ": d = ", d, " (qkv ", shape(qkv), ") is not divisible by heads = ", heads);
  MOM_CHECK(qkv.rows == batch * seq, op, ": qkv ", shape(qkv), " must have batch*seq = ", batch, "*", seq, " rows");
  MOM_CHECK(out.rows == qkv.rows && out.cols == d, op, ": out ", shape(out), " must be [", qkv.rows, "x", d,
            "] for qkv ", shape(qkv));
  MOM_CHECK(ssize(lse) == batch * heads * seq, op, ": lse has ", lse.size(), " elements, expected batch*heads*seq = ",
            batch * heads * seq);
}

template <class T>
using AttnMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// A thread's S×S scratch block, grown once.
template <class T, int Slot>
Eigen::Map<AttnMat<T>> attention_scratch(index_t seq) {
  thread_local std::vector<T> buf;
  if (buf.size() < static_cast<std::size_t>(seq * seq)) buf.resize(static_cast<std::size_t>(seq * seq));
  return Eigen::Map<AttnMat<T>>(buf.data(), seq, seq);
}
}  // namespace detail

// out = softmax(q kᵀ / sqrt(hd) + causal mask) v per (sequence, head); lse saved per score row.
template <class T>
void attention_forward(MatrixView<T> out, std::span<T> lse, MatrixView<const T> qkv, index_t batch, index_t seq,
                       index_t heads) {
  detail::check_attention_shapes<T>("attention_forward", qkv, out, lse, batch, seq, heads);
  const index_t d = qkv.cols / 3, hd = d / heads;
  const T scale = T(1) / std::sqrt(T(hd));
#pragma omp parallel for schedule(dynamic) if (batch * heads > 1 && seq * seq * hd > (1 << 14))
  for (index_t bh = 0; bh < batch * heads; ++bh) {
    const index_t b = bh / heads, h = bh % heads;
    const auto rows = qkv.row_block(b * seq, seq);
    const auto q = map(rows.col_block(h * hd, hd));
    const auto k = map(rows.col_block(d + h * hd, hd));
    const auto v = map(rows.col_block(2 * d + h * hd, hd));
    auto o = map(out.row_block(b * seq, seq).col_block(h * hd, hd));
    T* row_lse = lse.data() + bh * seq;

    auto p = detail::attention_scratch<T, 0>(seq);
    p.template triangularView<Eigen::Lower>() = q * k.transpose();
    for (index_t i = 0; i < seq; ++i) {
      auto s = p.row(i).head(i + 1).array();
      const T m = s.maxCoeff() * scale;
      s = (s * scale - m).exp();
      const T sum = s.sum();
      s /= sum;
      row_lse[i] = m + std::log(sum);
    }
    o.noalias() = p.template triangularView<Eigen::Lower>() * v;
  }
}

// Accumulates dqkv += d(out)/d(qkv)ᵀ dout. With P the probabilities (recomputed from lse),
// dV = Pᵀ dO, dP = dO Vᵀ, dS = P ∘ (dP - rowsum(dO ∘ O)), dQ = scale dS K, dK = scale dSᵀ Q.
template <class T>
void attention_backward(MatrixView<T> dqkv, MatrixView<const T> dout, MatrixView<const T> out, std::span<const T> lse,
                        MatrixView<const T> qkv, index_t batch, index_t seq, index_t heads) {
  detail::check_attention_shapes<T>("attention_backward", qkv, out, lse, batch, seq, heads);
  MOM_CHECK(dqkv.rows == qkv.rows && dqkv.cols == qkv.cols, "attention_backward: dqkv ", shape(dqkv),
            " must match qkv ", shape(qkv));
  MOM_CHECK(dout.rows == out.rows && dout.cols == out.cols, "attention_backward: dout ", shape(dout),
            " must match out ", shape(out));
  const index_t d = qkv.cols / 3, hd = d / heads;
  const T scale = T(1) / std::sqrt(T(hd));
#pragma omp parallel for schedule(dynamic) if (batch * heads > 1 && seq * seq * hd > (1 << 14))
  for (index_t bh = 0; bh < batch * heads; ++bh) {
    const index_t b = bh / heads, h = bh % heads;
    const auto rows = qkv.row_block(b * seq, seq);
    const auto q = map(rows.col_block(h * hd, hd));
    const auto k = map(rows.col_block(d + h * hd, hd));
    const auto v = map(rows.col_block(2 * d + h * hd, hd));
    const auto o = map(out.row_block(b * seq, seq).col_block(h * hd, hd));
    const auto dO = map(dout.row_block(b * seq, seq).col_block(h * hd, hd));
    const auto drows = dqkv.row_block(b * seq, seq);
    auto dq = map(drows.col_block(h * hd, hd));
    auto dk = map(drows.col_block(d + h * hd, hd));
    auto dv = map(drows.col_block(2 * d + h * hd, hd));
    const T* row_lse = lse.data() + bh * seq;

    auto p = detail::attention_scratch<T, 0>(seq);
    auto ds = detail::attention_scratch<T, 1>(seq);
    p.template triangularView<Eigen::Lower>() = q * k.transpose();
    for (index_t i = 0; i < seq; ++i) {
      auto s = p.row(i).head(i + 1).array();
      s = (s * scale - row_lse[i]).exp();
    }
    dv.noalias() += p.template triangularView<Eigen::Lower>().transpose() * dO;
    ds.template triangularView<Eigen::Lower>() = dO * v.transpose();
    for (index_t i = 0; i < seq; ++i) {
      const T di = dO.row(i).dot(o.row(i));  // = Σ_j P_ij dP_ij
      auto g = ds.row(i).head(i + 1).array();
      g = scale * p.row(i).head(i + 1).array() * (g - di);
    }
    dq.noalias() += ds.template triangularView<Eigen::Lower>() * k;
    dk.noalias() += ds.template triangularView<Eigen::Lower>().transpose() * q;
  }
}

}  // namespace mom::cpu

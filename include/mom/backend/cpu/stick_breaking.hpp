#pragma once
// Stick-breaking attention (ModuleFormer, Shen et al., arXiv 2306.04640, §3.2 and Appendix A): for query
// t and keys i <= t (the query's own key included),
//
//   z_{i,t} = q_t·k_i / sqrt(hd),   β_{i,t} = σ(z_{i,t}),
//   p_{i,t} = β_{i,t} · Π_{i<j<=t} (1 − β_{j,t})        (eq. (4) / (11)),   o_t = Σ_{i<=t} p_{i,t} v_i   (eq. (5)).
//
// Σ_i p_{i,t} = 1 − Π_{i<=t}(1 − β_{i,t}) <= 1: no normalisation; the rest of the stick is "attend to nothing".
// No position embedding: the order of the keys is in the product. W_o is the module's, not the op's.
//
// Computed in log space, O(T²) time and O(T) extra memory per (sequence, head) row (the paper's code
// builds the [T × T × T] product): with e = exp(−|z|) ∈ (0, 1] and l = log1p(e),
//   log σ(z) = min(z, 0) − l,   softplus(z) = −log(1 − σ(z)) = max(z, 0) + l,
//   log p_{i,t} = log σ(z_{i,t}) − Σ_{i<j<=t} softplus(z_{j,t})   (<= 0: exp never overflows, no log of 0),
// the suffix sums running from the query's own key down (in double, also for float data). Once the suffix
// exceeds stick_breaking_cutoff<T> (exp(−cutoff) is 0 in T) every earlier weight is exactly 0: when that holds
// for all the queries of a lane group the descent stops, and a stick that is spent costs nothing further.
//
// Backward (loss L, δ = dL/do_t, g_i = δ·v_i):
//   dL/dv_i += p_{i,t} δ,
//   dL/dz_j  = g_j p_j (1 − σ_j) − σ_j Σ_{i<j} g_i p_i = g_j p_j − σ_j Σ_{i<=j} g_i p_i   (a prefix sum),
//   dL/dq_t += scale Σ_j dz_j k_j,   dL/dk_j += scale dz_j q_t.
// Forward saves nothing: backward recomputes z (one GEMM, as softmax attention recomputes P from lse), the
// weights and σ, and sums the prefix directly (in double). out is an argument of backward because the
// CUDA kernel reads D_t = δ·o_t = Σ_i g_i p_i from it (kernels/stick_breaking.cuh); the CPU only checks
// its shape.
//
// Key-major blocks: a block of queries [i0, i1) is scored as Zᵀ = K Qᵀ [keys × queries], so the queries are
// the columns and each key's scores are one row. The sums run down (forward) or up (backward) the keys for 16
// queries at once, one per vector lane (vecmath::stick_breaking_lanes for float: exp, log1p and the double sums
// in vectors; a scalar loop per query for double); a query's own order of summation is the row-wise one.
// O = Pᵀ V, dV += P dO, dQ += dSᵀ K, dK += dS Q read the blocks transposed in their GEMMs.
//
// Layout and parallelism as cpu/attention.hpp, with grouped / multi-query key-value heads (ModuleFormer's
// MoA shares one K and V among a token's heads): qkv [B·S × (H + 2·H_kv)·hd] = [q | k | v] with H query
// heads and H_kv key/value heads (H_kv divides H; query head h reads key/value head h / (H / H_kv); H_kv = H
// is the usual [q | k | v] of 3d columns), out [B·S × H·hd]; one OpenMP task per (sequence, query head) in
// forward, per (sequence, key/value head) in backward (its query heads in order); query rows in blocks of
// kAttentionBlock whose scores against keys [0, i1) are one cpu::gemm_serial on strided views; scratch is
// thread_local, grown once to the largest S seen ([S × kAttentionBlock] once in forward, three times in
// backward): no allocation after the first call.
//
// Denormals: the weights fall geometrically with the distance to the query and pass through float's
// denormal range (and the backward multiplies them by small gradients), which costs ~5× in time on x86.
// Each thread runs its rows and their products (gemm_serial) under FlushDenormals (cpu/denormals.hpp):
// values below 2^-126 are 0 here, whatever the thread count.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <type_traits>

#include "mom/backend/cpu/attention.hpp"  // kAttentionBlock, detail::head_block
#include "mom/backend/cpu/decode.hpp"     // detail::check_decode_rows
#include "mom/backend/cpu/denormals.hpp"
#include "mom/backend/cpu/gemm.hpp"
#include "mom/backend/cpu/parallel.hpp"
#include "mom/backend/cpu/vecmath.hpp"
#include "mom/backend/shape_checks.hpp"
#include "mom/core/check.hpp"
#include "mom/core/tensor.hpp"

namespace mom::cpu {

// A suffix of softplus sums past which exp(log σ − suffix) is 0 in T (log σ <= 0; the smallest
// denormal is e^-103.3 in float, e^-744.4 in double).
template <class T>
inline constexpr double stick_breaking_cutoff = std::is_same_v<T, float> ? 110.0 : 750.0;

namespace detail {
struct StickBreakingScratch;
template <class T, int Slot>
T* stick_breaking_scratch(index_t n) {
  return thread_scratch<T, StickBreakingScratch, Slot>(static_cast<std::size_t>(n));
}

// The columns of query head h and of its key / value head in a [q | k | v] row of heads query heads and
// kv_heads key/value heads (kv_heads divides heads; query head h uses key/value head h / (heads / kv_heads)).
struct GroupedHeads {
  index_t heads, kv_heads, hd;
  GroupedHeads(index_t cols, index_t h, index_t kv) : heads(h), kv_heads(kv), hd(cols / (h + 2 * kv)) {}
  index_t q(index_t h) const { return h * hd; }
  index_t k(index_t h) const { return (heads + h / (heads / kv_heads)) * hd; }
  index_t v(index_t h) const { return (heads + kv_heads + h / (heads / kv_heads)) * hd; }
};

// Queries per lane group; a key-major block's leading dimension is a multiple of it.
inline constexpr index_t kStickBreakingLanes = vecmath::kStickBreakingLanes;
inline index_t stick_breaking_ld(index_t queries) {
  return (queries + kStickBreakingLanes - 1) / kStickBreakingLanes * kStickBreakingLanes;
}

// The weights of one lane group: the 16 columns of zt [keys × ld] from zt's first, column c the scaled scores of
// a query against keys 0 .. top[c] (top[c] < 0: no query there). On return p in their place (0 above top[c]),
// σ(z) in sig's (null: not wanted). Returns lo: every weight and σ below key lo is 0 (the sticks are spent).
template <class T>
index_t stick_breaking_lanes(T* zt, T* sig, index_t ld, const std::int32_t* top, index_t jmax) {
  if constexpr (std::is_same_v<T, float>) {
    return vecmath::stick_breaking_lanes(zt, sig, ld, top, jmax, stick_breaking_cutoff<T>);
  } else {
    index_t lo = jmax + 1;
    for (index_t c = 0; c < kStickBreakingLanes; ++c) {
      index_t j = jmax;
      for (; j > top[c]; --j) {
        zt[j * ld + c] = T(0);
        if (sig) sig[j * ld + c] = T(0);
      }
      double suffix = 0;  // Σ softplus(z_j) over the keys above the current one
      for (; j >= 0 && suffix <= stick_breaking_cutoff<T>; --j) {
        T& z = zt[j * ld + c];
        const T e = std::exp(-std::abs(z)), l = std::log1p(e);  // e = exp(−|z|) ∈ (0, 1], l ∈ (0, log 2]
        if (sig) sig[j * ld + c] = (z >= T(0) ? T(1) : e) / (T(1) + e);
        const T sp = std::max(z, T(0)) + l;  // softplus(z) = −log(1 − σ(z))
        z = std::exp(std::min(z, T(0)) - l - T(suffix));  // p = exp(log σ(z) − Σ_{j>i} softplus(z_j))
        suffix += double(sp);
      }
      lo = std::min(lo, j + 1);
      for (; j >= 0; --j) {  // the stick is spent: every earlier p is 0
        zt[j * ld + c] = T(0);
        if (sig) sig[j * ld + c] = T(0);
      }
    }
    return lo;
  }
}

// The backward of a lane group: gt's 16 columns hold g_j = δ·v_j and become scale·(g_j p_j − σ_j Σ_{i<=j} g_i p_i)
// (= dL/d(q·k_j); the prefix in double from key lo up, 0 below lo and above top); pt and sig from
// stick_breaking_lanes.
template <class T>
void stick_breaking_lanes_backward(T* gt, const T* pt, const T* sig, index_t ld, const std::int32_t* top, index_t lo,
                                   index_t jmax, T scale) {
  if constexpr (std::is_same_v<T, float>) {
    vecmath::stick_breaking_lanes_backward(gt, pt, sig, ld, top, lo, jmax, scale);
  } else {
    for (index_t c = 0; c < kStickBreakingLanes; ++c) {
      double prefix = 0;  // Σ_{i<=j} g_i p_i
      for (index_t j = 0; j <= jmax; ++j) {
        T& g = gt[j * ld + c];
        if (j < lo || j > top[c]) {
          g = T(0);
          continue;
        }
        const double gp = double(g) * double(pt[j * ld + c]);
        prefix += gp;
        g = T(double(scale) * (gp - double(sig[j * ld + c]) * prefix));
      }
    }
  }
}

// The queries [i0, i0 + rows) of a block as lane groups: top[c] = i0 + c (−1 past the block), for group c0.
struct BlockTops {
  std::int32_t top[kStickBreakingLanes];
  index_t jmax;  // the group's last query's key: the largest top
  BlockTops(index_t i0, index_t rows, index_t c0) : jmax(i0 + std::min(rows, c0 + kStickBreakingLanes) - 1) {
    for (index_t c = 0; c < kStickBreakingLanes; ++c) top[c] = c0 + c < rows ? std::int32_t(i0 + c0 + c) : -1;
  }
  // Zeroes the group's columns of m (key-major, keys × queries) at the keys above every top: later queries'.
  template <class T>
  void zero_above(MatrixView<T> m, index_t c0) const {
    for (index_t j = jmax + 1; j < m.rows; ++j) std::fill(m.row(j) + c0, m.row(j) + c0 + kStickBreakingLanes, T(0));
  }
};
}  // namespace detail

// out = the stick-breaking attention of every (sequence, query head) (see the top of this file). Saves nothing.
template <class T>
void stick_breaking_forward(MatrixView<T> out, MatrixView<const T> qkv, index_t batch, index_t seq, index_t heads,
                            index_t kv_heads) {
  checks::attention_qkv_shapes<T>("stick_breaking_forward", qkv, out, batch, seq, heads, kv_heads);
  const detail::GroupedHeads L(qkv.cols, heads, kv_heads);
  const index_t hd = L.hd, ldmax = detail::stick_breaking_ld(kAttentionBlock);
  const T scale = T(1) / std::sqrt(T(hd));
#pragma omp parallel if (batch * heads > 1 && seq * seq * hd > (1 << 14))
  {
  const FlushDenormals flush;
  // Every thread of the team sizes its scratch, also one that gets no pair this time (see attention.hpp).
  T* scratch = detail::stick_breaking_scratch<T, 0>(seq * ldmax);
#pragma omp for schedule(dynamic)
  for (index_t bh = 0; bh < batch * heads; ++bh) {
    const index_t b = bh / heads, h = bh % heads;
    const auto q = detail::head_block(qkv, b, seq, L.q(h), hd);
    const auto k = detail::head_block(qkv, b, seq, L.k(h), hd);
    const auto v = detail::head_block(qkv, b, seq, L.v(h), hd);
    const auto o = detail::head_block(out, b, seq, h * hd, hd);
    for (index_t i0 = 0; i0 < seq; i0 += kAttentionBlock) {
      const index_t i1 = std::min(seq, i0 + kAttentionBlock), rows = i1 - i0;
      const MatrixView<T> pt(scratch, i1, rows, detail::stick_breaking_ld(rows));  // zᵀ: keys [0, i1) × queries
      gemm_serial<T>(pt, k.row_block(0, i1), Trans::N, q.row_block(i0, rows), Trans::T, scale);
      for (index_t c0 = 0; c0 < rows; c0 += detail::kStickBreakingLanes) {
        const detail::BlockTops t(i0, rows, c0);
        detail::stick_breaking_lanes<T>(pt.data + c0, nullptr, pt.ld, t.top, t.jmax);
        t.zero_above(pt, c0);
      }
      gemm_serial<T>(o.row_block(i0, rows), pt, Trans::T, v.row_block(0, i1), Trans::N);
    }
  }
  }
}

// Accumulates dqkv += (d out / d qkv)ᵀ dout. Recomputes z, p and σ per query block; with Gᵀ = V dOᵀ
// (g_{t,i} = δ_t·v_i): dS_{t,j} = scale (g_j p_j − σ_j Σ_{i<=j} g_i p_i), dV += P dO, dQ += dSᵀ K, dK += dS Q
// (P and dS key-major). out (forward's output) is only shape-checked here (the CUDA backend reads it). One task
// per (sequence, key/value head): the query heads that share a key/value head accumulate into its dK, dV in
// order, so the sums are deterministic and race-free.
template <class T>
void stick_breaking_backward(MatrixView<T> dqkv, MatrixView<const T> dout, MatrixView<const T> out,
                             MatrixView<const T> qkv, index_t batch, index_t seq, index_t heads, index_t kv_heads) {
  checks::attention_qkv_shapes<T>("stick_breaking_backward", qkv, out, batch, seq, heads, kv_heads);
  checks::attention_backward_grad_shapes<T>("stick_breaking_backward", dqkv, dout, out, qkv);
  const detail::GroupedHeads L(qkv.cols, heads, kv_heads);
  const index_t hd = L.hd, kv = L.kv_heads, group = heads / kv, ldmax = detail::stick_breaking_ld(kAttentionBlock);
  const T scale = T(1) / std::sqrt(T(hd));
#pragma omp parallel if (batch * kv > 1 && seq * seq * hd > (1 << 14))
  {
  const FlushDenormals flush;
  T* scratch_p = detail::stick_breaking_scratch<T, 0>(seq * ldmax);  // sized on every thread
  T* scratch_g = detail::stick_breaking_scratch<T, 2>(seq * ldmax);
  T* scratch_s = detail::stick_breaking_scratch<T, 3>(seq * ldmax);
#pragma omp for schedule(dynamic)
  for (index_t bk = 0; bk < batch * kv; ++bk) {
    const index_t b = bk / kv, kh = bk % kv;
    const auto k = detail::head_block(qkv, b, seq, L.k(kh * group), hd);
    const auto v = detail::head_block(qkv, b, seq, L.v(kh * group), hd);
    const auto dk = detail::head_block(dqkv, b, seq, L.k(kh * group), hd);
    const auto dv = detail::head_block(dqkv, b, seq, L.v(kh * group), hd);
    for (index_t h = kh * group; h < (kh + 1) * group; ++h) {
      const auto q = detail::head_block(qkv, b, seq, L.q(h), hd);
      const auto dO = detail::head_block(dout, b, seq, h * hd, hd);
      const auto dq = detail::head_block(dqkv, b, seq, L.q(h), hd);
      for (index_t i0 = 0; i0 < seq; i0 += kAttentionBlock) {
        const index_t i1 = std::min(seq, i0 + kAttentionBlock), rows = i1 - i0, ld = detail::stick_breaking_ld(rows);
        const MatrixView<T> pt(scratch_p, i1, rows, ld), gt(scratch_g, i1, rows, ld);  // keys × queries
        gemm_serial<T>(pt, k.row_block(0, i1), Trans::N, q.row_block(i0, rows), Trans::T, scale);
        gemm_serial<T>(gt, v.row_block(0, i1), Trans::N, dO.row_block(i0, rows), Trans::T);
        for (index_t c0 = 0; c0 < rows; c0 += detail::kStickBreakingLanes) {
          const detail::BlockTops t(i0, rows, c0);
          const index_t lo = detail::stick_breaking_lanes<T>(pt.data + c0, scratch_s + c0, ld, t.top, t.jmax);
          detail::stick_breaking_lanes_backward<T>(gt.data + c0, pt.data + c0, scratch_s + c0, ld, t.top, lo, t.jmax,
                                                   scale);
          t.zero_above(pt, c0);
          t.zero_above(gt, c0);
        }
        gemm_serial<T>(dv.row_block(0, i1), pt, Trans::N, dO.row_block(i0, rows), Trans::N, T(1), T(1));
        gemm_serial<T>(dq.row_block(i0, rows), gt, Trans::T, k.row_block(0, i1), Trans::N, T(1), T(1));
        gemm_serial<T>(dk.row_block(0, i1), gt, Trans::N, q.row_block(i0, rows), Trans::N, T(1), T(1));
      }
    }
  }
  }
}

// Incremental decoding (cpu/decode.hpp's cache layout): out[r] = the stick-breaking attention of row r
// (sequence slot[r] at position pos[r], q from qkv's row r) over the cached keys and values of positions
// 0 .. pos[r] of its slot, its own included (write them with kv_write first). Caches hold kv_heads heads
// of hd. O(pos[r]·hd) per row and query head; the (row, query head) pairs run as the lanes of the forward's
// key-major blocks, 16 at a time (their scores written column by column), so each equals the forward's row.
template <class T>
void stick_breaking_decode(MatrixView<T> out, MatrixView<const T> qkv, MatrixView<const T> k_cache,
                           MatrixView<const T> v_cache, std::span<const index_t> slot, std::span<const index_t> pos,
                           index_t max_len, index_t heads, index_t kv_heads) {
  checks::decode_shapes<T>("stick_breaking_decode", out, qkv, k_cache, v_cache, ssize(slot), ssize(pos), max_len, heads,
                           kv_heads);
  const index_t rows = qkv.rows;
  detail::check_decode_rows("stick_breaking_decode", rows, slot, pos, k_cache.rows, max_len);
  const detail::GroupedHeads L(qkv.cols, heads, kv_heads);
  const index_t hd = L.hd, group = heads / L.kv_heads, pairs = rows * heads, lanes = detail::kStickBreakingLanes;
  const index_t groups = (pairs + lanes - 1) / lanes;
  const T scale = T(1) / std::sqrt(T(hd));
#pragma omp parallel if (groups > 1 && rows * max_len * heads * hd > (1 << 15))
  {
    const FlushDenormals flush;
    T* zt = detail::stick_breaking_scratch<T, 4>(max_len * lanes);  // keys × the group's pairs
#pragma omp for schedule(static)
    for (index_t gi = 0; gi < groups; ++gi) {
      std::int32_t top[detail::kStickBreakingLanes];
      index_t jmax = -1;
      for (index_t c = 0; c < lanes; ++c) {
        const index_t rh = gi * lanes + c;
        if (rh >= pairs) {
          top[c] = -1;
          continue;
        }
        const index_t r = rh / heads, h = rh % heads, len = pos[std::size_t(r)] + 1, kc = (h / group) * hd;
        top[c] = std::int32_t(len - 1);
        jmax = std::max(jmax, len - 1);
        const T* q = qkv.row(r) + L.q(h);
        const index_t base = slot[std::size_t(r)] * max_len;
        for (index_t j = 0; j < len; ++j) {
          const T* kr = k_cache.row(base + j) + kc;
          T dot = T(0);
#pragma omp simd reduction(+ : dot)
          for (index_t i = 0; i < hd; ++i) dot += q[i] * kr[i];
          zt[j * lanes + c] = dot * scale;
        }
      }
      const index_t lo = detail::stick_breaking_lanes<T>(zt, nullptr, lanes, top, jmax);
      for (index_t c = 0; c < lanes && gi * lanes + c < pairs; ++c) {
        const index_t rh = gi * lanes + c, r = rh / heads, h = rh % heads, kc = (h / group) * hd;
        const index_t base = slot[std::size_t(r)] * max_len;
        T* o = out.row(r) + h * hd;
        std::fill(o, o + hd, T(0));
        for (index_t j = lo; j <= top[c]; ++j) {
          const T* vr = v_cache.row(base + j) + kc;
          const T w = zt[j * lanes + c];
#pragma omp simd
          for (index_t i = 0; i < hd; ++i) o[i] += w * vr[i];
        }
      }
    }
  }
}

}  // namespace mom::cpu

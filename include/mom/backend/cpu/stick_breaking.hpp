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
// exceeds stick_breaking_cutoff<T> (exp(−cutoff) is 0 in T), every earlier weight is exactly 0 and the
// row stops at the end of that chunk of kStickBreakingChunk keys: a row that has spent its stick costs
// nothing further in the elementwise work.
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
// Layout and parallelism as cpu/attention.hpp, with grouped / multi-query key-value heads (ModuleFormer's
// MoA shares one K and V among a token's heads): qkv [B·S × (H + 2·H_kv)·hd] = [q | k | v] with H query
// heads and H_kv key/value heads (H_kv divides H; query head h reads key/value head h / (H / H_kv); H_kv = H
// is the usual [q | k | v] of 3d columns), out [B·S × H·hd]; one OpenMP task per (sequence, query head) in
// forward, per (sequence, key/value head) in backward (its query heads in order); query rows in blocks of
// kAttentionBlock whose scores against keys [0, i1) are one cpu::gemm_serial on strided views; scratch is
// thread_local, grown once to the largest S seen ([kAttentionBlock × S] once in forward, twice in
// backward, plus rows of S): no allocation after the first call.
//
// Denormals: the weights fall geometrically with the distance to the query and pass through float's
// denormal range (and the backward multiplies them by small gradients), which costs ~5× in time on x86.
// Each thread runs its rows and their products (gemm_serial) under FlushDenormals (cpu/denormals.hpp):
// values below 2^-126 are 0 here, whatever the thread count.
#include <algorithm>
#include <cmath>
#include <span>
#include <type_traits>

#include "mom/backend/cpu/attention.hpp"  // kAttentionBlock, detail::head_block
#include "mom/backend/cpu/decode.hpp"     // detail::check_decode_rows
#include "mom/backend/cpu/denormals.hpp"
#include "mom/backend/cpu/eigen_map.hpp"
#include "mom/backend/cpu/gemm.hpp"
#include "mom/backend/cpu/parallel.hpp"
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

// Keys per step of stick_breaking_row's descent (the elementwise passes are vectorised over a chunk).
inline constexpr index_t kStickBreakingChunk = 256;

// One query row: z[0..n) are its scaled scores (key n−1 is the query's own position). On return
// z[i] = p_i; sig[i] = σ(z_i) when sig is given. sp[0..n) is scratch. Returns lo: the weights below lo
// are exactly 0 (the softplus suffix passed the cutoff; z and sig there are set to 0), 0 otherwise.
template <class T>
index_t stick_breaking_row(T* z, T* sp, T* sig, index_t n) {
  using Arr = Eigen::Array<T, Eigen::Dynamic, 1>;
  double suffix = 0;  // Σ softplus(z_j) over the keys above the current one
  index_t hi = n;
  while (hi > 0) {
    const index_t lo = std::max<index_t>(0, hi - kStickBreakingChunk), m = hi - lo;
    Eigen::Map<Arr> zz(z + lo, m), e(sp + lo, m);
    e = (-zz.abs()).exp();  // e = exp(−|z|) ∈ (0, 1]
    if (sig) Eigen::Map<Arr>(sig + lo, m) = (zz >= T(0)).select(T(1), e) / (T(1) + e);
    e = e.log1p();  // l = log(1 + e) ∈ (0, log 2]
    T* zc = z + lo;
    T* sc = sp + lo;
#pragma omp simd
    for (index_t i = 0; i < m; ++i) {
      const T zi = zc[i], li = sc[i];
      zc[i] = std::min(zi, T(0)) - li;  // log σ(z)
      sc[i] = std::max(zi, T(0)) + li;  // softplus(z) = −log(1 − σ(z))
    }
    for (index_t i = m - 1; i >= 0; --i) {  // sp ← the suffix above each key (exclusive)
      const T s = sc[i];
      sc[i] = T(suffix);
      suffix += double(s);
    }
    zz = (zz - e).exp();  // p = exp(log σ(z_i) − Σ_{j>i} softplus(z_j)), exponent <= 0
    hi = lo;
    if (suffix > stick_breaking_cutoff<T> && hi > 0) {  // the stick is spent: every earlier p is 0
      std::fill(z, z + hi, T(0));
      if (sig) std::fill(sig, sig + hi, T(0));
      return hi;
    }
  }
  return 0;
}
}  // namespace detail

// out = the stick-breaking attention of every (sequence, query head) (see the top of this file). Saves nothing.
template <class T>
void stick_breaking_forward(MatrixView<T> out, MatrixView<const T> qkv, index_t batch, index_t seq, index_t heads,
                            index_t kv_heads) {
  checks::attention_qkv_shapes<T>("stick_breaking_forward", qkv, out, batch, seq, heads, kv_heads);
  const detail::GroupedHeads L(qkv.cols, heads, kv_heads);
  const index_t hd = L.hd;
  const T scale = T(1) / std::sqrt(T(hd));
#pragma omp parallel if (batch * heads > 1 && seq * seq * hd > (1 << 14))
  {
  const FlushDenormals flush;
  // Every thread of the team sizes its scratch, also one that gets no pair this time (see attention.hpp).
  T* scratch = detail::stick_breaking_scratch<T, 0>(kAttentionBlock * seq);
  T* sp = detail::stick_breaking_scratch<T, 1>(seq);
#pragma omp for schedule(dynamic)
  for (index_t bh = 0; bh < batch * heads; ++bh) {
    const index_t b = bh / heads, h = bh % heads;
    const auto q = detail::head_block(qkv, b, seq, L.q(h), hd);
    const auto k = detail::head_block(qkv, b, seq, L.k(h), hd);
    const auto v = detail::head_block(qkv, b, seq, L.v(h), hd);
    const auto o = detail::head_block(out, b, seq, h * hd, hd);
    for (index_t i0 = 0; i0 < seq; i0 += kAttentionBlock) {
      const index_t i1 = std::min(seq, i0 + kAttentionBlock), rows = i1 - i0;
      const MatrixView<T> p(scratch, rows, i1);  // z of queries [i0, i1) against keys [0, i1), then p
      gemm_serial<T>(p, q.row_block(i0, rows), Trans::N, k.row_block(0, i1), Trans::T, scale);
      for (index_t r = 0; r < rows; ++r) {
        const index_t i = i0 + r;
        detail::stick_breaking_row<T>(p.row(r), sp, nullptr, i + 1);
        std::fill(p.row(r) + i + 1, p.row(r) + i1, T(0));  // causal: keys after i
      }
      gemm_serial<T>(o.row_block(i0, rows), p, Trans::N, v.row_block(0, i1), Trans::N);
    }
  }
  }
}

// Accumulates dqkv += (d out / d qkv)ᵀ dout. Recomputes z, p and σ per query block; with G = dO Vᵀ
// (g_{t,i} = δ_t·v_i): dS_{t,j} = scale (g_j p_j − σ_j Σ_{i<=j} g_i p_i), dV += Pᵀ dO, dQ += dS K,
// dK += dSᵀ Q. out (forward's output) is only shape-checked here (the CUDA backend reads it). One task per
// (sequence, key/value head): the query heads that share a key/value head accumulate into its dK, dV in
// order, so the sums are deterministic and race-free.
template <class T>
void stick_breaking_backward(MatrixView<T> dqkv, MatrixView<const T> dout, MatrixView<const T> out,
                             MatrixView<const T> qkv, index_t batch, index_t seq, index_t heads, index_t kv_heads) {
  checks::attention_qkv_shapes<T>("stick_breaking_backward", qkv, out, batch, seq, heads, kv_heads);
  checks::attention_backward_grad_shapes<T>("stick_breaking_backward", dqkv, dout, out, qkv);
  const detail::GroupedHeads L(qkv.cols, heads, kv_heads);
  const index_t hd = L.hd, kv = L.kv_heads, group = heads / kv;
  const T scale = T(1) / std::sqrt(T(hd));
#pragma omp parallel if (batch * kv > 1 && seq * seq * hd > (1 << 14))
  {
  const FlushDenormals flush;
  T* scratch_p = detail::stick_breaking_scratch<T, 0>(kAttentionBlock * seq);  // sized on every thread
  T* sp = detail::stick_breaking_scratch<T, 1>(seq);
  T* scratch_g = detail::stick_breaking_scratch<T, 2>(kAttentionBlock * seq);
  T* sig = detail::stick_breaking_scratch<T, 3>(seq);
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
        const index_t i1 = std::min(seq, i0 + kAttentionBlock), rows = i1 - i0;
        const MatrixView<T> p(scratch_p, rows, i1), g(scratch_g, rows, i1);
        gemm_serial<T>(p, q.row_block(i0, rows), Trans::N, k.row_block(0, i1), Trans::T, scale);
        gemm_serial<T>(g, dO.row_block(i0, rows), Trans::N, v.row_block(0, i1), Trans::T);
        for (index_t r = 0; r < rows; ++r) {
          const index_t i = i0 + r;
          T* pr = p.row(r);
          T* gr = g.row(r);  // g, then dS
          const index_t lo = detail::stick_breaking_row<T>(pr, sp, sig, i + 1);
          std::fill(gr, gr + lo, T(0));  // p = 0 and the prefix is 0 below lo
          double prefix = 0;             // Σ_{i<=j} g_i p_i
          for (index_t j = lo; j <= i; ++j) {
            const double gp = double(gr[j]) * double(pr[j]);
            prefix += gp;
            gr[j] = T(double(scale) * (gp - double(sig[j]) * prefix));
          }
          std::fill(pr + i + 1, pr + i1, T(0));
          std::fill(gr + i + 1, gr + i1, T(0));
        }
        gemm_serial<T>(dv.row_block(0, i1), p, Trans::T, dO.row_block(i0, rows), Trans::N, T(1), T(1));
        gemm_serial<T>(dq.row_block(i0, rows), g, Trans::N, k.row_block(0, i1), Trans::N, T(1), T(1));
        gemm_serial<T>(dk.row_block(0, i1), g, Trans::T, q.row_block(i0, rows), Trans::N, T(1), T(1));
      }
    }
  }
  }
}

// Incremental decoding (cpu/decode.hpp's cache layout): out[r] = the stick-breaking attention of row r
// (sequence slot[r] at position pos[r], q from qkv's row r) over the cached keys and values of positions
// 0 .. pos[r] of its slot, its own included (write them with kv_write first). Caches hold kv_heads heads
// of hd. O(pos[r]·hd) per row and query head; equal to stick_breaking_forward's row at that position.
template <class T>
void stick_breaking_decode(MatrixView<T> out, MatrixView<const T> qkv, MatrixView<const T> k_cache,
                           MatrixView<const T> v_cache, std::span<const index_t> slot, std::span<const index_t> pos,
                           index_t max_len, index_t heads, index_t kv_heads) {
  checks::decode_shapes<T>("stick_breaking_decode", out, qkv, k_cache, v_cache, ssize(slot), ssize(pos), max_len, heads,
                           kv_heads);
  const index_t rows = qkv.rows;
  detail::check_decode_rows("stick_breaking_decode", rows, slot, pos, k_cache.rows, max_len);
  const detail::GroupedHeads L(qkv.cols, heads, kv_heads);
  const index_t hd = L.hd, group = heads / L.kv_heads;
  const T scale = T(1) / std::sqrt(T(hd));
#pragma omp parallel if (rows * heads > 1 && rows * max_len * heads * hd > (1 << 15))
  {
    const FlushDenormals flush;
    T* z = detail::stick_breaking_scratch<T, 4>(max_len);
    T* sp = detail::stick_breaking_scratch<T, 5>(max_len);
#pragma omp for schedule(static)
    for (index_t rh = 0; rh < rows * heads; ++rh) {
      const index_t r = rh / heads, h = rh % heads, len = pos[std::size_t(r)] + 1, kc = (h / group) * hd;
      const T* q = qkv.row(r) + L.q(h);
      const index_t base = slot[std::size_t(r)] * max_len;
      for (index_t j = 0; j < len; ++j) {
        const T* k = k_cache.row(base + j) + kc;
        T dot = T(0);
#pragma omp simd reduction(+ : dot)
        for (index_t c = 0; c < hd; ++c) dot += q[c] * k[c];
        z[j] = dot * scale;
      }
      const index_t lo = detail::stick_breaking_row<T>(z, sp, nullptr, len);
      T* o = out.row(r) + h * hd;
      std::fill(o, o + hd, T(0));
      for (index_t j = lo; j < len; ++j) {
        const T* v = v_cache.row(base + j) + kc;
        const T w = z[j];
#pragma omp simd
        for (index_t c = 0; c < hd; ++c) o[c] += w * v[c];
      }
    }
  }
}

}  // namespace mom::cpu

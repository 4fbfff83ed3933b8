#pragma once
// Dense causal attention in bf16 on tensor cores with its softmax in registers (FlashAttention-2, arXiv:2307.08691):
// the kernels Kernels<float>::attention_forward / attention_backward take for Precision::BF16 at head dim 64 or 128
// (attention_tc.cuh's attention_tc_forward / attention_tc_backward dispatch; TF32 keeps the wmma kernels there), and
// the packed / grouped ones in attention_packed_tc.cuh run the same warp work. Same contract as those: out and lse
// written (lse natural log), dqkv accumulated, no [S × S] buffer; the attention-linear pair's bf16 layouts add O as bf16
// (forward and backward) and dK, dV written as bf16 with dQ in a separate fp32 buffer (backward).
//
// Forward. A block is 4 warps and 64 query rows, warp w rows 16w .. 16w + 15; key tiles of 64 stream through shared
// memory (K and V rounded to bf16 when staged, as attention_tc's staging does; Q through K's buffer once, then held
// as A fragments). Per tile a warp computes S = Q Kᵀ into 8 C fragments (16 × 8 each: mma.cuh's layouts) for the
// 16-key blocks that hold a key <= its last query; the online softmax works on those fragments (a row's 64 values sit
// in the 4 lanes of a quad: two shuffles give its max and, at the end, its sum); P, rounded to bf16, is the A
// fragment of O += P V straight from registers. Base-2 exponentials of S · scale · log2 e (one FMA a score);
// l sums the unrounded probabilities, as the wmma kernel and the reference do. Query tiles are launched longest
// first (the last causal tiles carry the most keys), so the grid's tail is short tiles.
//
// From a bf16 qkv (the attention pair's qkv layout, attention_ops.hpp) Q, K and V are not converted: their tiles are
// copied as they are with cp.async (16 bytes a thread a copy), K and V two buffers deep, so that the next key tile's
// copies run while the warps multiply this one (FlashAttention-2's pipelining; 4 tiles of shared memory, not 2).
//
// Backward (FlashAttention-2's one kernel, 5 products a tile pair). A block owns 64 keys, warp w keys 16w .. 16w + 15,
// and streams the query tiles that see them (Q, dO rounded when staged; lse and D = rowsum(dO ∘ O) in fp32). Per tile a
// warp computes Sᵀ = K Qᵀ and dPᵀ = V dOᵀ into C fragments, Pᵀ and dSᵀ = Pᵀ ∘ (dPᵀ − D) on them, and dV += Pᵀ dO,
// dK += dSᵀ Q with P and dS packed to bf16 A fragments from registers; dSᵀ also goes to shared memory (bf16), and after
// a barrier warp w adds scale · dS K for the tile's queries 16w .. to dQ with 4-float atomics (no fixed order).
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "mom/backend/cuda/kernels/attention_mma_smem.cuh"  // shared-memory layouts, the copies into them
#include "mom/backend/cuda/kernels/attention_tc_tile.cuh"  // TcLayout, tc_stage, tc_tile, tc_threads
#include "mom/backend/cuda/kernels/mma.cuh"

namespace mom::cuda {

namespace dev {

inline constexpr float mma_log2e = 1.4426950408889634f;
inline constexpr float mma_ln2 = 0.6931471805599453f;

#if defined(MOM_MMA_BF16)
// ---- a warp's forward work, shared by the dense kernel below and the packed / grouped one
// (attention_packed_tc.cuh). The warp owns 16 query rows; this lane's two rows are g and g + 8 (r = 0, 1).

// The warp's Q as A fragments, from the staged tile (its rows 16w .. 16w + 15).
template <int HD>
struct MmaQ {
  u32 f[HD / 16][4];
};
template <int HD>
__device__ __forceinline__ void mma_load_q(MmaQ<HD>& q, const bf16_t* sQ) {
  constexpr int LD = TcLayout<gemm_bf16, HD>::ld;
  const smem_addr a = mma_lane_a(sQ, LD) + mma_block(16 * (threadIdx.x / 32), 0, LD);
#pragma unroll
  for (int k = 0; k < HD / 16; ++k) ldmatrix_x4(q.f[k], a + mma_block(0, 16 * k, LD));
}

// The online softmax's state of the lane's two rows: O's C fragments (16 × 8 column tiles), the running max m (units
// of log2) and this lane's part of the sum l.
template <int HD>
struct MmaRows {
  float o[HD / 8][4];
  float m[2], l[2];
};
template <int HD>
__device__ __forceinline__ void mma_rows_start(MmaRows<HD>& st) {
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) st.o[n][0] = st.o[n][1] = st.o[n][2] = st.o[n][3] = 0.0f;
  st.m[0] = st.m[1] = neg_inf<float>();
  st.l[0] = st.l[1] = 0.0f;
}

// Row r's visible columns of a 64-wide tile starting at x0, [lo, hi) in absolute indices, as 32-bit bounds relative
// to the lane's first column 2t and clipped to the multiplied 16-column blocks [f_lo, f_hi).
__device__ __forceinline__ void mma_visible(int (&vlo)[2], int (&vhi)[2], index_t x0, const index_t (&lo)[2],
                                            const index_t (&hi)[2], int f_lo, int f_hi) {
  const int t = threadIdx.x % 4;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const index_t base = x0 + 2 * t;
    vlo[r] = max(static_cast<int>(min(max(lo[r] - base, index_t(0)), index_t(tc_tile))), 16 * f_lo - 2 * t);
    vhi[r] = min(static_cast<int>(min(max(hi[r] - base, index_t(0)), index_t(tc_tile))), 16 * f_hi - 2 * t);
  }
}

// One streamed key tile (staged K, V; first key j0): S = Q Kᵀ over the 16-key blocks [f_lo, f_hi), row r's visible
// keys [lo[r], hi[r]) (others, and the blocks not multiplied, P = 0), the online softmax, O rescaled, O += P V.
// sl2 = scale · log2 e. A row with no visible key so far keeps m = -inf, l = 0, O = 0.
template <int HD>
__device__ __forceinline__ void mma_forward_tile(MmaRows<HD>& st, const MmaQ<HD>& q, const bf16_t* sK, const bf16_t* sV,
                                                 index_t j0, const index_t (&lo)[2], const index_t (&hi)[2], int f_lo,
                                                 int f_hi, float sl2) {
  constexpr int LD = TcLayout<gemm_bf16, HD>::ld, NK = HD / 16, NO = HD / 8;
  const smem_addr ka = mma_lane_b(sK, LD), va = mma_lane_b(sV, LD, true);
  float s[8][4];
#pragma unroll
  for (int f = 0; f < 4; ++f) {
    s[2 * f][0] = s[2 * f][1] = s[2 * f][2] = s[2 * f][3] = 0.0f;
    s[2 * f + 1][0] = s[2 * f + 1][1] = s[2 * f + 1][2] = s[2 * f + 1][3] = 0.0f;
    if (f >= f_lo && f < f_hi) {
#pragma unroll
      for (int k = 0; k < NK; ++k) {
        u32 kb[4];
        ldmatrix_x4(kb, ka + mma_block(16 * f, 16 * k, LD));
        mma_bf16(s[2 * f], q.f[k], kb[0], kb[1]);
        mma_bf16(s[2 * f + 1], q.f[k], kb[2], kb[3]);
      }
    }
  }
  // Column c = 8n + (e & 1) (+ 2t) of row e / 2: visible when the key j0 + 2t + c is in [lo, hi) and in a multiplied
  // block.
  int vlo[2], vhi[2];
  mma_visible(vlo, vhi, j0, lo, hi, f_lo, f_hi);
  float mx[2] = {st.m[0], st.m[1]};
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int c = 8 * n + (e & 1);
      const bool vis = c >= vlo[e / 2] && c < vhi[e / 2];
      s[n][e] = vis ? s[n][e] * sl2 : neg_inf<float>();
      mx[e / 2] = max(mx[e / 2], s[n][e]);
    }
  float corr[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = max(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = max(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    corr[r] = mx[r] == neg_inf<float>() ? 1.0f : exp2f(st.m[r] - mx[r]);  // no key yet: nothing to rescale
    st.m[r] = mx[r];
    st.l[r] *= corr[r];
  }
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[n][e] = s[n][e] == neg_inf<float>() ? 0.0f : exp2f(s[n][e] - st.m[e / 2]);
      st.l[e / 2] += s[n][e];
    }
#pragma unroll
  for (int n = 0; n < NO; ++n) {
    st.o[n][0] *= corr[0], st.o[n][1] *= corr[0];
    st.o[n][2] *= corr[1], st.o[n][3] *= corr[1];
  }
#pragma unroll
  for (int f = 0; f < 4; ++f) {
    if (f >= f_lo && f < f_hi) {
      u32 pa[4];
      mma_a_from_c(pa, s[2 * f], s[2 * f + 1]);
#pragma unroll
      for (int dn = 0; dn < HD / 16; ++dn) {
        u32 vb[4];
        ldmatrix_x4_trans(vb, va + mma_block(16 * f, 16 * dn, LD));
        mma_bf16(st.o[2 * dn], pa, vb[0], vb[1]);
        mma_bf16(st.o[2 * dn + 1], pa, vb[2], vb[3]);
      }
    }
  }
}

// The end: each row's sum over its quad, then put(r, c, x, y) for O's normalised columns c, c + 1 of row r (0: the
// lane's row g, 1: g + 8; every lane its 2 · HD / 8 pairs) and row_lse(r, lse) from the quad's lane t = 0 (natural
// log). A row that saw no key: a zero row and lse = -inf.
template <int HD, class Put, class Lse>
__device__ __forceinline__ void mma_forward_finish(MmaRows<HD>& st, Put&& put, Lse&& row_lse) {
  const int t = threadIdx.x % 4;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float l = st.l[r];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) put(r, 8 * n + 2 * t, st.o[n][2 * r] * inv, st.o[n][2 * r + 1] * inv);
    if (t == 0) row_lse(r, l > 0.0f ? st.m[r] * mma_ln2 + log_(l) : neg_inf<float>());
  }
}

// ---- a warp's backward work. The block owns 64 keys (warp w keys 16w .. 16w + 15: this lane's keys g and g + 8,
// r = 0, 1); query tiles of 64 stream through shared memory.

// The warp's dK and dV (16 keys × HD) as C fragments.
template <int HD>
struct MmaKeyGrads {
  float dk[HD / 8][4], dv[HD / 8][4];
};
template <int HD>
__device__ __forceinline__ void mma_key_grads_start(MmaKeyGrads<HD>& a) {
#pragma unroll
  for (int n = 0; n < HD / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) a.dk[n][e] = a.dv[n][e] = 0.0f;
}

// One streamed query tile (first query i0) against the warp's keys: Sᵀ = K Qᵀ and dPᵀ = V dOᵀ over the 16-query blocks
// [f_lo, f_hi); Pᵀ = exp2(Sᵀ · sl2 − lse · log2 e) and dSᵀ = Pᵀ ∘ (dPᵀ − D) for key row r's visible queries [lo[r],
// hi[r]) (0 elsewhere); dV += Pᵀ dO, dK += dSᵀ Q with P and dS rounded to bf16 as A fragments from registers; dSᵀ's
// multiplied blocks stored (rounded) to sm.ds rows 16w .. for dQ (mma_dq_tile, after the caller's barrier).
template <int HD>
__device__ __forceinline__ void mma_backward_tile(MmaKeyGrads<HD>& acc, const MmaBackwardSmem<HD>& sm, index_t i0,
                                                  const index_t (&lo)[2], const index_t (&hi)[2], int f_lo, int f_hi,
                                                  float sl2) {
  using Lay = TcLayout<gemm_bf16, HD>;
  constexpr int LD = Lay::ld, PLD = Lay::pld, NK = HD / 16;
  const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
  const smem_addr ka = mma_lane_a(sm.k, LD) + mma_block(16 * warp, 0, LD);
  const smem_addr va = mma_lane_a(sm.v, LD) + mma_block(16 * warp, 0, LD);
  const smem_addr qb = mma_lane_b(sm.q, LD), ob = mma_lane_b(sm.dout, LD);
  float s[8][4], dp[8][4];
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[n][e] = dp[n][e] = 0.0f;
#pragma unroll
  for (int k = 0; k < NK; ++k) {
    u32 kf[4], vf[4];
    ldmatrix_x4(kf, ka + mma_block(0, 16 * k, LD));
    ldmatrix_x4(vf, va + mma_block(0, 16 * k, LD));
#pragma unroll
    for (int f = 0; f < 4; ++f) {
      if (f >= f_lo && f < f_hi) {
        u32 qf[4], of[4];
        ldmatrix_x4(qf, qb + mma_block(16 * f, 16 * k, LD));
        ldmatrix_x4(of, ob + mma_block(16 * f, 16 * k, LD));
        mma_bf16(s[2 * f], kf, qf[0], qf[1]);
        mma_bf16(s[2 * f + 1], kf, qf[2], qf[3]);
        mma_bf16(dp[2 * f], vf, of[0], of[1]);
        mma_bf16(dp[2 * f + 1], vf, of[2], of[3]);
      }
    }
  }
  int vlo[2], vhi[2];
  mma_visible(vlo, vhi, i0, lo, hi, f_lo, f_hi);
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int c = 8 * n + (e & 1);  // + 2t: the query column in the tile
      const bool vis = c >= vlo[e / 2] && c < vhi[e / 2];
      const float p = vis ? exp2f(s[n][e] * sl2 - sm.lse[c + 2 * t] * mma_log2e) : 0.0f;
      s[n][e] = p;
      dp[n][e] = p * (dp[n][e] - sm.d[c + 2 * t]);
    }
  bf16_t* ds_rows = sm.ds + (16 * warp + g) * PLD + 2 * t;
#pragma unroll
  for (int f = 0; f < 4; ++f) {
    if (f >= f_lo && f < f_hi) {
      u32 pa[4], da[4];
      mma_a_from_c(pa, s[2 * f], s[2 * f + 1]);
      mma_a_from_c(da, dp[2 * f], dp[2 * f + 1]);
      // da holds dSᵀ (g, 16f + 2t..) [0], (g + 8, ..) [1], (g, 16f + 8 + 2t..) [2], (g + 8, ..) [3]: its rounded pairs.
      *reinterpret_cast<u32*>(ds_rows + 16 * f) = da[0];
      *reinterpret_cast<u32*>(ds_rows + 8 * PLD + 16 * f) = da[1];
      *reinterpret_cast<u32*>(ds_rows + 16 * f + 8) = da[2];
      *reinterpret_cast<u32*>(ds_rows + 8 * PLD + 16 * f + 8) = da[3];
      const smem_addr dob = mma_lane_b(sm.dout, LD, true) + mma_block(16 * f, 0, LD);
      const smem_addr qtb = mma_lane_b(sm.q, LD, true) + mma_block(16 * f, 0, LD);
#pragma unroll
      for (int dn = 0; dn < HD / 16; ++dn) {
        u32 b[4];
        ldmatrix_x4_trans(b, dob + mma_block(0, 16 * dn, LD));
        mma_bf16(acc.dv[2 * dn], pa, b[0], b[1]);
        mma_bf16(acc.dv[2 * dn + 1], pa, b[2], b[3]);
        ldmatrix_x4_trans(b, qtb + mma_block(0, 16 * dn, LD));
        mma_bf16(acc.dk[2 * dn], da, b[0], b[1]);
        mma_bf16(acc.dk[2 * dn + 1], da, b[2], b[3]);
      }
    }
  }
}

// dQ of the warp's 16 queries of the streamed tile (16w .. 16w + 15), after a barrier published every warp's dSᵀ:
// dS K over the 16-key blocks kb with bit kb of kmask set (those whose warps wrote these queries' columns), dS read
// transposed from sm.ds, K from its tile. add4(row, c, v): 4 consecutive columns c .. c + 3 of query row 16w + row
// (scaled by scale), each lane 2 · HD / 8 of them (lane pairs exchange halves so that each holds 4 consecutive).
template <int HD, class Add4>
__device__ __forceinline__ void mma_dq_tile(const MmaBackwardSmem<HD>& sm, unsigned kmask, float scale, Add4&& add4) {
  using Lay = TcLayout<gemm_bf16, HD>;
  constexpr int LD = Lay::ld, PLD = Lay::pld, NO = HD / 8;
  const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
  const smem_addr da = mma_lane_a(sm.ds, PLD, true) + mma_block(0, 16 * warp, PLD);
  const smem_addr kb = mma_lane_b(sm.k, LD, true);
  float dq[NO][4];
#pragma unroll
  for (int n = 0; n < NO; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;
#pragma unroll
  for (int b = 0; b < 4; ++b) {
    if (!(kmask >> b & 1u)) continue;
    u32 a[4];
    ldmatrix_x4_trans(a, da + mma_block(16 * b, 0, PLD));
#pragma unroll
    for (int dn = 0; dn < HD / 16; ++dn) {
      u32 f[4];
      ldmatrix_x4_trans(f, kb + mma_block(16 * b, 16 * dn, LD));
      mma_bf16(dq[2 * dn], a, f[0], f[1]);
      mma_bf16(dq[2 * dn + 1], a, f[2], f[3]);
    }
  }
  const bool odd = t & 1;
#pragma unroll
  for (int n = 0; n < NO; ++n) {
    // Even lanes keep row g's columns 2t .. 2t + 3 (their own pair and the odd partner's), odd lanes row g + 8's
    // columns 2t − 2 .. 2t + 1.
    const float s0 = odd ? dq[n][0] : dq[n][2], s1 = odd ? dq[n][1] : dq[n][3];
    const float r0 = __shfl_xor_sync(0xffffffffu, s0, 1), r1 = __shfl_xor_sync(0xffffffffu, s1, 1);
    const float4 v = odd ? float4{scale * r0, scale * r1, scale * dq[n][2], scale * dq[n][3]}
                         : float4{scale * dq[n][0], scale * dq[n][1], scale * r0, scale * r1};
    add4(odd ? g + 8 : g, 8 * n + 2 * (t & ~1), v);
  }
}

// The end: put(r, c, dk_x, dk_y, dv_x, dv_y) for columns c, c + 1 of key row r (0: g, 1: g + 8).
template <int HD, class Put>
__device__ __forceinline__ void mma_key_grads_finish(const MmaKeyGrads<HD>& a, Put&& put) {
  const int t = threadIdx.x % 4;
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int n = 0; n < HD / 8; ++n)
      put(r, 8 * n + 2 * t, a.dk[n][2 * r], a.dk[n][2 * r + 1], a.dv[n][2 * r], a.dv[n][2 * r + 1]);
}

// Two adjacent values of an output row: p[0] = x, p[1] = y, as float or as bf16 bits (rounded as to_bf16 rounds), in
// one store where `pairs` (p's pair aligned: every pair of the row is then, c being even).
template <class E>
__device__ __forceinline__ bool aligned_pair(const E* p) {
  return reinterpret_cast<std::uintptr_t>(p) % (2 * sizeof(E)) == 0;
}
template <class E>
__device__ __forceinline__ void store_pair(E* p, float x, float y, bool pairs) {
  if constexpr (std::is_same_v<E, float>) {
    if (pairs) {
      *reinterpret_cast<float2*>(p) = float2{x, y};
      return;
    }
    p[0] = x;
    p[1] = y;
  } else if (pairs) {
    *reinterpret_cast<u32*>(p) = u32(bf16_bits(x)) | u32(bf16_bits(y)) << 16;
  } else {
    p[0] = bf16_bits(x);
    p[1] = bf16_bits(y);
  }
}

#endif

// Dense causal attention, forward (the header's design).
// OE: O's element, float, or std::uint16_t for bf16 bits (the attention-linear pair's layout, attention_ops.hpp: the
// bits to_bf16 makes of the fp32 O). Rows L.out_ld elements apart either way.
// Q, K and V come from qkv (fp32, rounded when staged) or, with Q16, from the bf16 bits qkv16 (rows L.qkv_ld apart
// either way: the attention-linear pair's qkv layout, attention_ops.hpp; head dim 64).
template <int HD, class OE, bool Q16 = false>
__global__ void attention_mma_forward_kernel(OE* out, float* lse, MatrixView<const float> qkv,
                                             const std::uint16_t* qkv16, HeadLayout L, float scale) {
#if defined(MOM_MMA_BF16)
  using Lay = TcLayout<gemm_bf16, HD>;
  unsigned char* sm = dynamic_smem();
  bf16_t* sK = reinterpret_cast<bf16_t*>(sm);
  bf16_t* sV = reinterpret_cast<bf16_t*>(sm + Lay::tile);

  const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4;
  const index_t bh = blockIdx.y, b = bh / L.heads, h = bh % L.heads;
  const index_t i0 = index_t(gridDim.x - 1 - blockIdx.x) * tc_tile, w0 = i0 + 16 * warp;  // longest first
  const QkvRows<Q16> src{qkv.data, qkv16, b * L.seq * L.qkv_ld};
  const index_t last = min(L.seq, i0 + tc_tile) - 1;  // the block's last query: keys [0, last] matter
  const index_t wlast = min(L.seq, w0 + 16) - 1;      // the warp's last query
  const bool active = w0 < L.seq;                      // the same for the whole warp
  const index_t qi[2] = {w0 + g, w0 + g + 8};           // this lane's two rows
  const index_t lo[2] = {0, 0}, hi[2] = {min(qi[0] + 1, L.seq), min(qi[1] + 1, L.seq)};

  MmaQ<HD> q;
  MmaRows<HD> st;
  mma_rows_start<HD>(st);
  const float sl2 = scale * mma_log2e;
  // 16-key blocks holding a key <= the warp's last query (j0 <= i0 <= w0: at least one).
  const auto tile = [&](const bf16_t* k, const bf16_t* v, index_t j0) {
    const int nf = static_cast<int>(min(index_t(4), (wlast - j0) / 16 + 1));
    mma_forward_tile<HD>(st, q, k, v, j0, lo, hi, 0, nf, sl2);
  };
  if constexpr (Q16) {
    // A bf16 qkv: its tiles are copied as they are (cp.async), two K, V buffers deep, so that the copies of the next
    // key tile run while the warps work on this one. Q goes through the second buffer's K first.
    bf16_t* const sK2 = reinterpret_cast<bf16_t*>(sm + 2 * Lay::tile);
    bf16_t* const sV2 = reinterpret_cast<bf16_t*>(sm + 3 * Lay::tile);
    src.template stage_async<HD>(sK2, L, i0, h * L.hd);
    cp_async_commit();
    src.template stage_async<HD>(sK, L, 0, L.d + h * L.hd);
    src.template stage_async<HD>(sV, L, 0, 2 * L.d + h * L.hd);
    cp_async_commit();
    cp_async_wait<1>();  // Q's copies done (the first key tile's may still run)
    __syncthreads();
    mma_load_q<HD>(q, sK2);
    __syncthreads();  // every warp has its Q fragments: the second buffer is free
    int buf = 0;
    for (index_t j0 = 0; j0 <= last; j0 += tc_tile, buf ^= 1) {
      if (j0 + tc_tile <= last) {  // the next tile into the other buffer (read last in the previous iteration)
        src.template stage_async<HD>(buf ? sK : sK2, L, j0 + tc_tile, L.d + h * L.hd);
        src.template stage_async<HD>(buf ? sV : sV2, L, j0 + tc_tile, 2 * L.d + h * L.hd);
        cp_async_commit();
        cp_async_wait<1>();  // this tile's copies done
      } else {
        cp_async_wait<0>();
      }
      __syncthreads();  // every thread's copies of this tile visible
      if (active) tile(buf ? sK2 : sK, buf ? sV2 : sV, j0);
      __syncthreads();  // this tile's buffer read by every warp before the next iteration's copies into it
    }
  } else {
    src.template stage<HD, 1>(sK, L, i0, h * L.hd);  // Q, through K's buffer
    __syncthreads();
    mma_load_q<HD>(q, sK);
    for (index_t j0 = 0; j0 <= last; j0 += tc_tile) {
      __syncthreads();  // Q (first tile) or the previous K, V consumed
      src.template stage<HD, 1>(sK, L, j0, L.d + h * L.hd);
      src.template stage<HD, 1>(sV, L, j0, 2 * L.d + h * L.hd);
      __syncthreads();
      if (active) tile(sK, sV, j0);
    }
  }
  if (!active) return;
  const bool pairs = L.out_ld % 2 == 0 && aligned_pair(out + h * L.hd);
  mma_forward_finish<HD>(
      st,
      [&](int r, int c, float x, float y) {
        if (qi[r] < L.seq) store_pair(out + (b * L.seq + qi[r]) * L.out_ld + h * L.hd + c, x, y, pairs);
      },
      [&](int r, float v) {
        if (qi[r] < L.seq) lse[bh * L.seq + qi[r]] = v;
      });
#else
  (void)out, (void)lse, (void)qkv, (void)qkv16, (void)L, (void)scale;
#endif
}

// Dense causal attention, backward (FlashAttention-2's, one kernel): block = 64 keys, streaming the query tiles at or
// after them; per tile mma_backward_tile, a barrier, then each warp's dQ rows added to dqkv atomically (the blocks of
// every key tile at or before those queries add to the same rows: no fixed order, docs/cuda.md, "Determinism").
// At the end dK = scale · Σ dSᵀ Q and dV = Σ Pᵀ dO go to their rows: dkv [rows × ·], dK at column 0, dV at column L.d.
// OE: O's element, as the forward wrote it (D = rowsum(dO ∘ O) from it).
// GE: dK and dV's element: float, added to dkv's rows (with dq = the same rows' Q columns: dqkv accumulated), or
// std::uint16_t, written as bf16 bits (the attention-linear pair's gradient layout, attention_ops.hpp: the bits
// to_bf16 makes of them), dQ then added into a separate fp32 buffer (zeroed by the caller) to be converted after.
template <int HD, class OE, class GE, bool Q16 = false>
__global__ void attention_mma_backward_kernel(float* dq, index_t dq_ld, GE* dkv, index_t dkv_ld,
                                              MatrixView<const float> dout, const OE* out, const float* lse,
                                              MatrixView<const float> qkv, const std::uint16_t* qkv16, HeadLayout L,
                                              float scale, index_t dout_ld) {
#if defined(MOM_MMA_BF16)
  const MmaBackwardSmem<HD> sm = mma_backward_smem<HD>(dynamic_smem());
  const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4;
  const index_t bh = blockIdx.y, b = bh / L.heads, h = bh % L.heads;
  const index_t j0 = index_t(blockIdx.x) * tc_tile, w0 = j0 + 16 * warp;  // block 0 has the most query tiles
  const QkvRows<Q16> src{qkv.data, qkv16, b * L.seq * L.qkv_ld};
  const float* dbase = dout.data + b * L.seq * dout_ld;
  const OE* obase = out + b * L.seq * L.out_ld;
  const bool active = w0 < L.seq;
  const bool dq_aligned = dq_ld % 4 == 0 && aligned16(dq + h * L.hd);
  const index_t kj[2] = {w0 + g, w0 + g + 8};  // this lane's keys: they see the queries [key, seq)
  const index_t lo[2] = {kj[0], kj[1]}, hi[2] = {kj[0] < L.seq ? L.seq : 0, kj[1] < L.seq ? L.seq : 0};

  MmaKeyGrads<HD> acc;
  mma_key_grads_start<HD>(acc);
  const float sl2 = scale * mma_log2e;
  // One query tile at i0 (its Q, dO, D and lse staged in cur): the products, a barrier, the dQ rows.
  const auto query_tile = [&](const MmaBackwardSmem<HD>& cur, index_t i0) {
    // 16-query blocks with a query >= the warp's first key and < seq.
    if (active)
      mma_backward_tile<HD>(acc, cur, i0, lo, hi, i0 == j0 ? warp : 0,
                            static_cast<int>(min(index_t(4), (L.seq - i0 + 15) / 16)), sl2);
    __syncthreads();  // every warp's dSᵀ rows written
    // dQ of queries q0 .. q0 + 15 over the key blocks whose warps wrote their columns: the keys < seq, and on the
    // diagonal tile the blocks at or before the queries' own (a warp's written columns start at its block there).
    const index_t q0 = i0 + 16 * warp;
    if (q0 < L.seq) {
      const int kb = i0 == j0 ? warp + 1 : static_cast<int>(min(index_t(4), (L.seq - j0 + 15) / 16));
      mma_dq_tile<HD>(cur, (1u << kb) - 1u, scale, [&](int row, int c, float4 v) {
        if (q0 + row < L.seq) atomic_add4(dq + (b * L.seq + q0 + row) * dq_ld + h * L.hd + c, v, dq_aligned);
      });
    }
  };
  // The pipelined form (head dim 64, a bf16 O: attention_mma_smem.cuh's mma_backward_smem_bytes sizes it).
  constexpr bool can_pipeline = Q16 && HD == 64 && std::is_same_v<OE, std::uint16_t>;
  bool pipelined = false;
  if constexpr (can_pipeline) {
    pipelined = mma_backward_pipelined(dbase, dout_ld, obase, L);
    if (pipelined) {
      // A bf16 qkv and O, 16-byte aligned rows: each query tile's Q, dO (fp32) and O copied with cp.async two deep
      // (attention_mma_smem.cuh), K and V with the first; then dO rounded and D summed from the copies as tc_stage_dout
      // does from memory (the same values: the same bits). lse goes through a register, stored a tile ahead.
      const MmaBackwardPipe<HD> pp = mma_backward_pipe<HD>(dynamic_smem());
      const int tid = threadIdx.x;
      const float* lse_bh = lse + bh * L.seq;
      src.template stage_async<HD>(sm.k, L, j0, L.d + h * L.hd);
      src.template stage_async<HD>(sm.v, L, j0, 2 * L.d + h * L.hd);
      mma_backward_copies<HD>(pp, 0, src, dbase, dout_ld, obase, L, j0, h * L.hd);
      cp_async_commit();
      if (tid < tc_tile) pp.lse[0][tid] = j0 + tid < L.seq ? lse_bh[j0 + tid] : 0.0f;
      int buf = 0;
      for (index_t i0 = j0; i0 < L.seq; i0 += tc_tile, buf ^= 1) {  // query tiles at or after this key tile
        const bool more = i0 + tc_tile < L.seq;
        float lse_next = 0.0f;
        if (more) {  // the next tile's copies into the other buffers (read last in the previous iteration)
          mma_backward_copies<HD>(pp, buf ^ 1, src, dbase, dout_ld, obase, L, i0 + tc_tile, h * L.hd);
          cp_async_commit();
          if (tid < tc_tile && i0 + tc_tile + tid < L.seq) lse_next = lse_bh[i0 + tc_tile + tid];
          cp_async_wait<1>();  // this tile's copies done
        } else {
          cp_async_wait<0>();
        }
        __syncthreads();  // every thread's copies (and lse) of this tile visible
        tc_stage_dout<gemm_bf16, HD>(sm.dout, sm.d, sm.lse, pp.dout[buf], MmaBackwardPipe<HD>::ld32, pp.out[buf],
                                     TcLayout<gemm_bf16, HD>::ld, pp.lse[buf], 0, tc_tile, 0);
        __syncthreads();
        MmaBackwardSmem<HD> cur = sm;
        cur.q = pp.q[buf];
        query_tile(cur, i0);
        if (more && tid < tc_tile) pp.lse[buf ^ 1][tid] = lse_next;  // read after the next iteration's barrier
      }
    }
  }
  if (!pipelined) {
    src.template stage<HD>(sm.k, L, j0, L.d + h * L.hd);
    src.template stage<HD>(sm.v, L, j0, 2 * L.d + h * L.hd);
    for (index_t i0 = j0; i0 < L.seq; i0 += tc_tile) {  // query tiles at or after this key tile
      __syncthreads();
      src.template stage<HD>(sm.q, L, i0, h * L.hd);
      tc_stage_dout<gemm_bf16, HD>(sm.dout, sm.d, sm.lse, dbase, dout_ld, obase, L.out_ld, lse + bh * L.seq, i0,
                                   L.seq, h * L.hd);
      __syncthreads();
      query_tile(sm, i0);
    }
  }
  if (!active) return;
  [[maybe_unused]] const bool pairs = dkv_ld % 2 == 0 && L.d % 2 == 0 && aligned_pair(dkv + h * L.hd);
  mma_key_grads_finish<HD>(acc, [&](int r, int c, float kx, float ky, float vx, float vy) {
    if (kj[r] >= L.seq) return;
    GE* row = dkv + (b * L.seq + kj[r]) * dkv_ld + h * L.hd + c;
    if constexpr (std::is_same_v<GE, float>) {
      row[0] += scale * kx;
      row[1] += scale * ky;
      row[L.d] += vx;
      row[L.d + 1] += vy;
    } else {
      store_pair(row, scale * kx, scale * ky, pairs);
      store_pair(row + L.d, vx, vy, pairs);
    }
  });
#else
  (void)dq, (void)dq_ld, (void)dkv, (void)dkv_ld, (void)dout, (void)out, (void)lse, (void)qkv, (void)qkv16, (void)L,
      (void)scale, (void)dout_ld;
#endif
}

}  // namespace dev

}  // namespace mom::cuda

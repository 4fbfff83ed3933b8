#pragma once
// Dense causal attention in bf16 on tensor cores with its softmax in registers (FlashAttention-2, arXiv:2307.08691):
// the kernels Kernels<float>::attention_forward takes for Precision::BF16 at head dim 64 or 128 (attention_tc.cuh's
// attention_tc_forward dispatches; TF32 keeps the wmma kernels there). Same contract as those: out and lse written
// (lse natural log), no [S × S] buffer.
//
// Forward. A block is 4 warps and 64 query rows, warp w rows 16w .. 16w + 15; key tiles of 64 stream through shared
// memory (K and V rounded to bf16 when staged, as attention_tc's staging does; Q through K's buffer once, then held
// as A fragments). Per tile a warp computes S = Q Kᵀ into 8 C fragments (16 × 8 each: mma.cuh's layouts) for the
// 16-key blocks that hold a key <= its last query; the online softmax works on those fragments (a row's 64 values sit
// in the 4 lanes of a quad: two shuffles give its max and, at the end, its sum); P, rounded to bf16, is the A
// fragment of O += P V straight from registers. Base-2 exponentials of S · scale · log2 e (one FMA a score);
// l sums the unrounded probabilities, as the wmma kernel and the reference do. Query tiles are launched longest
// first (the last causal tiles carry the most keys), so the grid's tail is short tiles.
#include <cstddef>
#include <cstdint>

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

// One streamed key tile (staged K, V; first key j0): S = Q Kᵀ over the 16-key blocks [f_lo, f_hi), row r's visible
// keys [lo[r], hi[r]) (others, and the blocks not multiplied, P = 0), the online softmax, O rescaled, O += P V.
// sl2 = scale · log2 e. A row with no visible key so far keeps m = -inf, l = 0, O = 0.
template <int HD>
__device__ __forceinline__ void mma_forward_tile(MmaRows<HD>& st, const MmaQ<HD>& q, const bf16_t* sK, const bf16_t* sV,
                                                 index_t j0, const index_t (&lo)[2], const index_t (&hi)[2], int f_lo,
                                                 int f_hi, float sl2) {
  constexpr int LD = TcLayout<gemm_bf16, HD>::ld, NK = HD / 16, NO = HD / 8;
  const int t = threadIdx.x % 4;
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
  // block; the bounds relative to the lane's first key, clamped to [0, 64], as 32-bit integers.
  int vlo[2], vhi[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const index_t base = j0 + 2 * t;
    vlo[r] = static_cast<int>(min(max(lo[r] - base, index_t(0)), index_t(tc_tile)));
    vhi[r] = static_cast<int>(min(max(hi[r] - base, index_t(0)), index_t(tc_tile)));
    vlo[r] = max(vlo[r], 16 * f_lo - 2 * t);
    vhi[r] = min(vhi[r], 16 * f_hi - 2 * t);
  }
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
#endif

// Dense causal attention, forward (the header's design).
template <int HD>
__global__ void attention_mma_forward_kernel(MatrixView<float> out, float* lse, MatrixView<const float> qkv,
                                             HeadLayout L, float scale) {
#if defined(MOM_MMA_BF16)
  using Lay = TcLayout<gemm_bf16, HD>;
  unsigned char* sm = dynamic_smem();
  bf16_t* sK = reinterpret_cast<bf16_t*>(sm);
  bf16_t* sV = reinterpret_cast<bf16_t*>(sm + Lay::tile);

  const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4;
  const index_t bh = blockIdx.y, b = bh / L.heads, h = bh % L.heads;
  const index_t i0 = index_t(gridDim.x - 1 - blockIdx.x) * tc_tile, w0 = i0 + 16 * warp;  // longest first
  const float* base = qkv.data + b * L.seq * L.qkv_ld;
  const index_t last = min(L.seq, i0 + tc_tile) - 1;  // the block's last query: keys [0, last] matter
  const index_t wlast = min(L.seq, w0 + 16) - 1;      // the warp's last query
  const bool active = w0 < L.seq;                      // the same for the whole warp
  const index_t qi[2] = {w0 + g, w0 + g + 8};           // this lane's two rows
  const index_t lo[2] = {0, 0}, hi[2] = {min(qi[0] + 1, L.seq), min(qi[1] + 1, L.seq)};

  tc_stage<gemm_bf16, HD, 1>(sK, base, L.qkv_ld, i0, L.seq, h * L.hd);  // Q, through K's buffer
  __syncthreads();
  MmaQ<HD> q;
  mma_load_q<HD>(q, sK);
  MmaRows<HD> st;
  mma_rows_start<HD>(st);
  const float sl2 = scale * mma_log2e;
  for (index_t j0 = 0; j0 <= last; j0 += tc_tile) {
    __syncthreads();  // Q (first tile) or the previous K, V consumed
    tc_stage<gemm_bf16, HD, 1>(sK, base, L.qkv_ld, j0, L.seq, L.d + h * L.hd);
    tc_stage<gemm_bf16, HD, 1>(sV, base, L.qkv_ld, j0, L.seq, 2 * L.d + h * L.hd);
    __syncthreads();
    if (!active) continue;
    // 16-key blocks holding a key <= the warp's last query (j0 <= i0 <= w0: at least one).
    const int nf = static_cast<int>(min(index_t(4), (wlast - j0) / 16 + 1));
    mma_forward_tile<HD>(st, q, sK, sV, j0, lo, hi, 0, nf, sl2);
  }
  if (!active) return;
  const bool pairs = L.out_ld % 2 == 0 && reinterpret_cast<std::uintptr_t>(out.data + h * L.hd) % 8 == 0;
  mma_forward_finish<HD>(
      st,
      [&](int r, int c, float x, float y) {
        if (qi[r] >= L.seq) return;
        float* p = out.data + (b * L.seq + qi[r]) * L.out_ld + h * L.hd + c;
        if (pairs) {
          *reinterpret_cast<float2*>(p) = float2{x, y};
        } else {
          p[0] = x;
          p[1] = y;
        }
      },
      [&](int r, float v) {
        if (qi[r] < L.seq) lse[bh * L.seq + qi[r]] = v;
      });
#else
  (void)out, (void)lse, (void)qkv, (void)L, (void)scale;
#endif
}

}  // namespace dev

}  // namespace mom::cuda

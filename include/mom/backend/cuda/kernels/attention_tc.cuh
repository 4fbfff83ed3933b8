#pragma once
// Dense causal attention on tensor cores (nvcuda::wmma) for cuda::Backend<float> with
// Precision::TF32 or BF16 and head dim 64 or 128: the path Kernels<float>::attention_forward /
// attention_backward (attention.cuh) take when attention_tc_forward / attention_tc_backward below
// accept the call; everything else (double, Precision::FP32, other head dims, GPUs without the
// shared memory) keeps the SIMT kernels of attention.cuh. Same contract as those: out and lse written
// (lse[(b·heads + h)·seq + i], natural log), dqkv accumulated (+=), no [S × S] buffer.
//
// FlashAttention-2 structure. A block is 4 warps (128 threads) and owns a tile of 64 rows (queries
// in the forward and dQ, keys in dK/dV); warp w owns rows 16w .. 16w + 15 of it. The other side
// streams through shared memory in tiles of 64 rows; causal tiles wholly above the diagonal are
// never visited, and inside the diagonal tile a warp only multiplies the 16-column blocks that
// hold a key <= its last query. Operands are rounded when staged into shared memory, as the
// grouped GEMM does (grouped_linear.cuh): TF32 (cvt.rna, wmma m16n16k8) or bf16 (nearest even,
// m16n16k16), fp32 accumulate. Scores, softmax statistics, D = rowsum(dO ∘ O) and the output stay
// fp32; the probabilities P (and dS in the backward) are rounded like the operands before their
// products, since they are the A operand of the next wmma.
//
// Softmax through shared memory: the fragment layout of an accumulator is opaque, so a warp
// stores its 16 × 64 score block to an fp32 scratch; lanes 2r and 2r + 1 own row r (32 columns
// each, combined by one shuffle) for the online max / sum, and write the rounded P next to it.
// The output accumulator stays in registers; rescaling it by a per-row factor uses a row-index
// fragment: an accumulator fragment loaded from a table whose (r, c) entry is r. load_matrix_sync,
// store_matrix_sync and mma_sync share one element mapping per fragment type (a store of a
// loaded fragment reproduces the memory), so x[e] of that fragment is the row of x[e] in every
// accumulator of the same type.
//
// Shared memory is dynamic (up to 167 KB for dQ and dK/dV at head dim 128 in TF32): the launchers
// fall back to the SIMT kernels when the device allows less per block.
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "mom/backend/cuda/kernels/attention.cuh"
#include "mom/backend/cuda/kernels/grouped_linear.cuh"

namespace mom::cuda {

namespace dev {

inline constexpr int tc_tile = 64;      // rows per block, and per streamed tile
inline constexpr int tc_threads = 128;  // 4 warps × 16 rows

// dynamic_smem() and launch_smem(): common.cuh.

constexpr std::size_t round128(std::size_t n) { return (n + 127) / 128 * 128; }

// Staged element type, wmma k and shared-memory layout of a path (gemm_tf32 or gemm_bf16).
template <int Path, int HD>
struct TcLayout {
  static_assert(Path == gemm_tf32 || Path == gemm_bf16);
  using S = typename GemmStage<float, Path>::type;                            // float or bf16
  using frag_t = std::conditional_t<Path == gemm_bf16, bf16_t, tf32_tag>;     // wmma element tag
  static constexpr int kf = Path == gemm_bf16 ? 16 : 8;                       // wmma k
  // Row strides (elements): wmma wants ldm a multiple of 16 bytes and 32-byte aligned fragment
  // rows; +4 floats / +8 bf16 also keeps consecutive rows off the same banks.
  static constexpr int ld = HD + (Path == gemm_bf16 ? 8 : 4);                 // staged tiles [64][ld]
  static constexpr int sld = tc_tile + 4;                                     // fp32 scratch [64][sld]
  static constexpr int pld = Path == gemm_bf16 ? tc_tile + 8 : sld;           // rounded P / dS [64][pld]
  static constexpr int old = HD + 4;                                          // fp32 output staging
  static constexpr std::size_t tile = round128(std::size_t(tc_tile) * ld * sizeof(S));
  static constexpr std::size_t scratch = round128(std::size_t(tc_tile) * sld * sizeof(float));
  // TF32: P / dS overwrite their fp32 scratch in place (each lane rewrites only what it read).
  static constexpr std::size_t pstage = Path == gemm_bf16 ? round128(std::size_t(tc_tile) * pld * sizeof(S)) : 0;
  static constexpr std::size_t vec = round128(tc_tile * sizeof(float));
  static constexpr std::size_t rows_table = round128(16 * 16 * sizeof(float));
  // forward: K, V | S | P | corr | row table.  dQ: Q, dO, K, V | S, dP | dS | lse, D.
  // dK/dV: K, V, Q, dO | S, dP | P, dS | lse, D.
  static constexpr std::size_t fwd_bytes = 2 * tile + scratch + pstage + vec + rows_table;
  static constexpr std::size_t dq_bytes = 4 * tile + 2 * scratch + pstage + 2 * vec;
  static constexpr std::size_t dkdv_bytes = 4 * tile + 2 * scratch + 2 * pstage + 2 * vec;
  // The output staging [64][old] fp32 overlays the first two tiles once the loop is done.
  static_assert(2 * tile >= std::size_t(tc_tile) * old * sizeof(float));
};

// The tensor-core kernels need sm_80 (TF32 / bf16 wmma); code compiled for older targets is empty
// and never launched (tc_kernel_usable checks the compiled architecture).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define MOM_TC_ATTENTION_BODY 1
#endif

// d[0..3] = the four values of v, rounded for the path (the staged operand's type).
template <int Path>
__device__ __forceinline__ void tc_store4(typename GemmStage<float, Path>::type* d, float4 v) {
  d[0] = stage_value<float, Path>(v.x);
  d[1] = stage_value<float, Path>(v.y);
  d[2] = stage_value<float, Path>(v.z);
  d[3] = stage_value<float, Path>(v.w);
}

// dst[rr][c] = rounded base[(r0 + rr)·ld + col0 + c] for rr < 64, c < HD; rows past seq are 0.
// 16-byte loads when every row of the slice starts 16-byte aligned (the usual qkv / dout layouts);
// the condition is the same for the whole block. Batch: each thread's float4s (8 at head dim 64, 16 at 128)
// in batches of that many, a batch's loads all issued before its first shared store (interleaved, the
// compiler may not move a global load above a store through the generic shared pointer, and each load's
// latency is paid in turn). Measured on an H200 (bench/RESULTS.md, "Issues 27 and 28 on an H200"): batches
// of 8 took dQ 7.27 → 6.31 ms and dK/dV 10.59 → 9.49 ms a GPT-2-small step, but the forward 3.86 → 4.84 ms
// (its accumulators and Q fragments stay live across the staging), so the forward stages one at a time.
template <int Path, int HD, int Batch = 8>
__device__ __forceinline__ void tc_stage(typename TcLayout<Path, HD>::S* dst, const float* base, index_t ld,
                                         index_t r0, index_t seq, index_t col0) {
  constexpr int LD = TcLayout<Path, HD>::ld;
  if (ld % 4 == 0 && reinterpret_cast<std::uintptr_t>(base + col0) % 16 == 0) {
    constexpr int H4 = HD / 4, per = tc_tile * H4 / tc_threads, batch = Batch;
    static_assert(per % batch == 0);
#pragma unroll
    for (int b0 = 0; b0 < per; b0 += batch) {
      float4 v[batch];
#pragma unroll
      for (int k = 0; k < batch; ++k) {
        const int e = threadIdx.x + (b0 + k) * tc_threads, rr = e / H4, c = (e % H4) * 4;
        v[k] = r0 + rr < seq ? *reinterpret_cast<const float4*>(base + (r0 + rr) * ld + col0 + c)
                             : float4{0.0f, 0.0f, 0.0f, 0.0f};
      }
#pragma unroll
      for (int k = 0; k < batch; ++k) {
        const int e = threadIdx.x + (b0 + k) * tc_threads, rr = e / H4, c = (e % H4) * 4;
        tc_store4<Path>(dst + rr * LD + c, v[k]);
      }
    }
    return;
  }
  for (int e = threadIdx.x; e < tc_tile * HD; e += tc_threads) {
    const int rr = e / HD, c = e % HD;
    const index_t r = r0 + rr;
    dst[rr * LD + c] = stage_value<float, Path>(r < seq ? base[r * ld + col0 + c] : 0.0f);
  }
}

// Stages rows r0 .. r0 + 63 of dO (rounded) and, per row i, D_i = Σ_c dO_ic O_ic (fp32, from the
// unrounded values) and lse_i = lse_bh[i · lse_stride]; rows past seq get zeros. When every row of dO and O starts 16-byte
// aligned (the usual layouts), 16 consecutive threads share a row, each loading float4s of dO and O
// (HD / 64 of each), and the row's D is a sum over those 16 lanes: the block's 64 rows in 8 passes,
// the loads of 4 passes issued before their first store (as in tc_stage). (One warp per 16 rows, a
// row at a time with a warp sum, as the fallback below does, is a chain of 16 dependent
// load-and-reduce steps per warp; the dK / dV kernel runs it once per (key tile, query tile) pair.)
template <int Path, int HD>
__device__ __forceinline__ void tc_stage_dout(typename TcLayout<Path, HD>::S* sdo, float* sd, float* slse,
                                              const float* dbase, index_t dld, const float* obase, index_t old_,
                                              const float* lse_bh, index_t r0, index_t seq, index_t col0,
                                              index_t lse_stride = 1) {
  constexpr int LD = TcLayout<Path, HD>::ld;
  if (dld % 4 == 0 && old_ % 4 == 0 && reinterpret_cast<std::uintptr_t>(dbase + col0) % 16 == 0 &&
      reinterpret_cast<std::uintptr_t>(obase + col0) % 16 == 0) {
    constexpr int tpr = 16;                    // threads per row (a half warp)
    constexpr int per = HD / 4 / tpr;          // float4s of a row per thread: 1 or 2
    constexpr int rows = tc_threads / tpr;     // rows per pass: 8
    constexpr int batch = 4;                   // passes whose loads are issued before their stores (see tc_stage)
    const int t = threadIdx.x % tpr, rp = threadIdx.x / tpr;
#pragma unroll
    for (int p0 = 0; p0 < tc_tile / rows; p0 += batch) {
      float4 g[batch][per], o[batch][per];
#pragma unroll
      for (int p = 0; p < batch; ++p) {
        const index_t r = r0 + (p0 + p) * rows + rp;
#pragma unroll
        for (int v = 0; v < per; ++v) {
          const int c = 4 * (t + tpr * v);
          g[p][v] = o[p][v] = float4{0.0f, 0.0f, 0.0f, 0.0f};
          if (r < seq) {
            g[p][v] = *reinterpret_cast<const float4*>(dbase + r * dld + col0 + c);
            o[p][v] = *reinterpret_cast<const float4*>(obase + r * old_ + col0 + c);
          }
        }
      }
#pragma unroll
      for (int p = 0; p < batch; ++p) {
        const int rr = (p0 + p) * rows + rp;
        float di = 0.0f;
#pragma unroll
        for (int v = 0; v < per; ++v) {
          const float4 a = g[p][v], b = o[p][v];
          di += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
          tc_store4<Path>(sdo + rr * LD + 4 * (t + tpr * v), a);
        }
#pragma unroll
        for (int off = tpr / 2; off > 0; off /= 2) di += __shfl_xor_sync(0xffffffffu, di, off);
        if (t == 0) {
          const index_t r = r0 + rr;
          sd[rr] = di;
          slse[rr] = r < seq ? lse_bh[r * lse_stride] : 0.0f;
        }
      }
    }
    return;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int rr = 16 * warp; rr < 16 * warp + 16; ++rr) {
    const index_t r = r0 + rr;
    float di = 0.0f;
#pragma unroll
    for (int c = lane; c < HD; c += 32) {
      const float g = r < seq ? dbase[r * dld + col0 + c] : 0.0f;
      if (r < seq) di += g * obase[r * old_ + col0 + c];
      sdo[rr * LD + c] = stage_value<float, Path>(g);
    }
    di = warp_sum(di);
    if (lane == 0) {
      sd[rr] = di;
      slse[rr] = r < seq ? lse_bh[r * lse_stride] : 0.0f;
    }
  }
}

namespace wm = nvcuda::wmma;

template <int Path, int HD>
__global__ void attention_tc_forward_kernel(MatrixView<float> out, float* lse, MatrixView<const float> qkv,
                                            HeadLayout L, float scale) {
#if defined(MOM_TC_ATTENTION_BODY)
  using Lay = TcLayout<Path, HD>;
  using S = typename Lay::S;
  using FT = typename Lay::frag_t;
  constexpr int KF = Lay::kf, LD = Lay::ld, SLD = Lay::sld, PLD = Lay::pld, NK = HD / KF, NO = HD / 16;
  unsigned char* sm = dynamic_smem();
  S* sK = reinterpret_cast<S*>(sm);
  S* sV = reinterpret_cast<S*>(sm + Lay::tile);
  float* sS = reinterpret_cast<float*>(sm + 2 * Lay::tile);
  S* sP = Path == gemm_bf16 ? reinterpret_cast<S*>(sm + 2 * Lay::tile + Lay::scratch) : reinterpret_cast<S*>(sS);
  float* sCorr = reinterpret_cast<float*>(sm + 2 * Lay::tile + Lay::scratch + Lay::pstage);
  float* sRows = reinterpret_cast<float*>(sm + 2 * Lay::tile + Lay::scratch + Lay::pstage + Lay::vec);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const index_t bh = blockIdx.y, b = bh / L.heads, h = bh % L.heads;
  const index_t i0 = index_t(blockIdx.x) * tc_tile, w0 = i0 + 16 * warp;
  const float* base = qkv.data + b * L.seq * L.qkv_ld;
  const index_t last = min(L.seq, i0 + tc_tile) - 1;  // the block's last query: keys [0, last] matter
  const index_t wlast = min(L.seq, w0 + 16) - 1;      // the warp's last query
  const bool active = w0 < L.seq;                      // the same for the whole warp

  tc_stage<Path, HD, 1>(sK, base, L.qkv_ld, i0, L.seq, h * L.hd);  // Q, through K's buffer
  for (int e = threadIdx.x; e < 256; e += tc_threads) sRows[e] = float(e / 16);
  __syncthreads();
  wm::fragment<wm::matrix_a, 16, 16, KF, FT, wm::row_major> qf[NK];
#pragma unroll
  for (int k = 0; k < NK; ++k) wm::load_matrix_sync(qf[k], sK + 16 * warp * LD + k * KF, LD);
  wm::fragment<wm::accumulator, 16, 16, KF, float> rows, o[NO];
  wm::load_matrix_sync(rows, sRows, 16, wm::mem_row_major);
#pragma unroll
  for (int n = 0; n < NO; ++n) wm::fill_fragment(o[n], 0.0f);

  const int r = lane >> 1, half = lane & 1;  // this lane's row of the warp's 16, and half of the 64 columns
  const index_t i = w0 + r;
  float* ss = sS + 16 * warp * SLD;
  S* sp = sP + 16 * warp * PLD;
  float* corr_w = sCorr + 16 * warp;
  float m = neg_inf<float>(), l = 0.0f;
  for (index_t j0 = 0; j0 <= last; j0 += tc_tile) {
    __syncthreads();  // Q (first tile) or the previous K, V consumed
    tc_stage<Path, HD, 1>(sK, base, L.qkv_ld, j0, L.seq, L.d + h * L.hd);
    tc_stage<Path, HD, 1>(sV, base, L.qkv_ld, j0, L.seq, 2 * L.d + h * L.hd);
    __syncthreads();
    if (!active) continue;
    // 16-key column blocks holding a key <= the warp's last query (j0 <= i0 <= w0: at least one).
    const int nf = static_cast<int>(min(index_t(4), (wlast - j0) / 16 + 1));
#pragma unroll
    for (int f = 0; f < 4; ++f) {
      if (f < nf) {
        wm::fragment<wm::accumulator, 16, 16, KF, float> sf;
        wm::fill_fragment(sf, 0.0f);
#pragma unroll
        for (int k = 0; k < NK; ++k) {
          wm::fragment<wm::matrix_b, 16, 16, KF, FT, wm::col_major> kb;  // Kᵀ: (c, j) at sK[j][c]
          wm::load_matrix_sync(kb, sK + 16 * f * LD + k * KF, LD);
          wm::mma_sync(sf, qf[k], kb, sf);
        }
        wm::store_matrix_sync(ss + 16 * f, sf, SLD, wm::mem_row_major);
      }
    }
    __syncwarp();
    // Online softmax of row r over columns [c0, c1) (this lane's half of the multiplied blocks).
    const int c0 = 32 * half, c1 = min(c0 + 32, 16 * nf);
    float tmax = neg_inf<float>();
    for (int c = c0; c < c1; ++c)
      if (j0 + c <= i) tmax = max(tmax, ss[r * SLD + c] * scale);
    tmax = max(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
    const float mnew = max(m, tmax);  // finite: key j0 <= i
    const float corr = exp_(m - mnew);
    float sum = 0.0f;
    for (int c = c0; c < c1; ++c) {
      const float p = j0 + c <= i ? exp_(ss[r * SLD + c] * scale - mnew) : 0.0f;
      sum += p;
      sp[r * PLD + c] = stage_value<float, Path>(p);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l = l * corr + sum;
    m = mnew;
    if (half == 0) corr_w[r] = corr;
    __syncwarp();
#pragma unroll
    for (int n = 0; n < NO; ++n)
#pragma unroll
      for (int e = 0; e < o[n].num_elements; ++e) o[n].x[e] *= corr_w[int(rows.x[e])];
    for (int kk = 0; kk < 16 * nf; kk += KF) {  // O += P V over the multiplied keys
      wm::fragment<wm::matrix_a, 16, 16, KF, FT, wm::row_major> pa;
      wm::load_matrix_sync(pa, sp + kk, PLD);
#pragma unroll
      for (int n = 0; n < NO; ++n) {
        wm::fragment<wm::matrix_b, 16, 16, KF, FT, wm::row_major> vb;
        wm::load_matrix_sync(vb, sV + kk * LD + 16 * n, LD);
        wm::mma_sync(o[n], pa, vb, o[n]);
      }
    }
  }
  __syncthreads();  // K, V consumed: their space stages the output
  if (!active) return;
  if (half == 0) corr_w[r] = 1.0f / l;
  __syncwarp();
  float* so = reinterpret_cast<float*>(sm) + 16 * warp * Lay::old;
#pragma unroll
  for (int n = 0; n < NO; ++n) {
#pragma unroll
    for (int e = 0; e < o[n].num_elements; ++e) o[n].x[e] *= corr_w[int(rows.x[e])];
    wm::store_matrix_sync(so + 16 * n, o[n], Lay::old, wm::mem_row_major);
  }
  __syncwarp();
  for (int e = lane; e < 16 * HD; e += 32) {
    const int rr = e / HD, c = e % HD;
    if (w0 + rr < L.seq) out.data[(b * L.seq + w0 + rr) * L.out_ld + h * L.hd + c] = so[rr * Lay::old + c];
  }
  if (half == 0 && i < L.seq) lse[bh * L.seq + i] = m + log_(l);
#else
  (void)out, (void)lse, (void)qkv, (void)L, (void)scale;
#endif
}

// dQ: block = 64 queries, streaming key tiles j0 <= its last query. Per tile and warp:
// S = Q Kᵀ, dP = dO Vᵀ (wmma), then P = exp(scale·S − lse), dS = P ∘ (dP − D) in fp32 (scratch),
// dS rounded, dQ += dS K (wmma); at the end dqkv[q] += scale · dQ.
template <int Path, int HD>
__global__ void attention_tc_dq_kernel(MatrixView<float> dqkv, MatrixView<const float> dout,
                                       MatrixView<const float> out, const float* lse, MatrixView<const float> qkv,
                                       HeadLayout L, float scale, index_t dqkv_ld, index_t dout_ld) {
#if defined(MOM_TC_ATTENTION_BODY)
  using Lay = TcLayout<Path, HD>;
  using S = typename Lay::S;
  using FT = typename Lay::frag_t;
  constexpr int KF = Lay::kf, LD = Lay::ld, SLD = Lay::sld, PLD = Lay::pld, NK = HD / KF, NO = HD / 16;
  unsigned char* sm = dynamic_smem();
  S* sQ = reinterpret_cast<S*>(sm);
  S* sdO = reinterpret_cast<S*>(sm + Lay::tile);
  S* sK = reinterpret_cast<S*>(sm + 2 * Lay::tile);
  S* sV = reinterpret_cast<S*>(sm + 3 * Lay::tile);
  float* sS = reinterpret_cast<float*>(sm + 4 * Lay::tile);
  float* sdP = reinterpret_cast<float*>(sm + 4 * Lay::tile + Lay::scratch);
  S* sdS = Path == gemm_bf16 ? reinterpret_cast<S*>(sm + 4 * Lay::tile + 2 * Lay::scratch) : reinterpret_cast<S*>(sS);
  float* sLse = reinterpret_cast<float*>(sm + 4 * Lay::tile + 2 * Lay::scratch + Lay::pstage);
  float* sD = sLse + tc_tile;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const index_t bh = blockIdx.y, b = bh / L.heads, h = bh % L.heads;
  const index_t i0 = index_t(blockIdx.x) * tc_tile, w0 = i0 + 16 * warp;
  const float* base = qkv.data + b * L.seq * L.qkv_ld;
  const index_t last = min(L.seq, i0 + tc_tile) - 1;
  const index_t wlast = min(L.seq, w0 + 16) - 1;
  const bool active = w0 < L.seq;

  tc_stage<Path, HD>(sQ, base, L.qkv_ld, i0, L.seq, h * L.hd);
  tc_stage_dout<Path, HD>(sdO, sD, sLse, dout.data + b * L.seq * dout_ld, dout_ld, out.data + b * L.seq * L.out_ld,
                          L.out_ld, lse + bh * L.seq, i0, L.seq, h * L.hd);
  wm::fragment<wm::accumulator, 16, 16, KF, float> dq[NO];
#pragma unroll
  for (int n = 0; n < NO; ++n) wm::fill_fragment(dq[n], 0.0f);
  const int r = lane >> 1, half = lane & 1;
  const index_t i = w0 + r;
  float* ss = sS + 16 * warp * SLD;
  float* sdp = sdP + 16 * warp * SLD;
  S* sds = sdS + 16 * warp * PLD;
  const S* sq = sQ + 16 * warp * LD;
  const S* sdo = sdO + 16 * warp * LD;
  for (index_t j0 = 0; j0 <= last; j0 += tc_tile) {
    __syncthreads();
    tc_stage<Path, HD>(sK, base, L.qkv_ld, j0, L.seq, L.d + h * L.hd);
    tc_stage<Path, HD>(sV, base, L.qkv_ld, j0, L.seq, 2 * L.d + h * L.hd);
    __syncthreads();
    if (!active) continue;
    const int nf = static_cast<int>(min(index_t(4), (wlast - j0) / 16 + 1));
    for (int f = 0; f < nf; ++f) {
      wm::fragment<wm::accumulator, 16, 16, KF, float> sf, pf;
      wm::fill_fragment(sf, 0.0f);
      wm::fill_fragment(pf, 0.0f);
#pragma unroll
      for (int k = 0; k < NK; ++k) {
        wm::fragment<wm::matrix_a, 16, 16, KF, FT, wm::row_major> a;
        wm::fragment<wm::matrix_b, 16, 16, KF, FT, wm::col_major> bt;
        wm::load_matrix_sync(a, sq + k * KF, LD);
        wm::load_matrix_sync(bt, sK + 16 * f * LD + k * KF, LD);
        wm::mma_sync(sf, a, bt, sf);
        wm::load_matrix_sync(a, sdo + k * KF, LD);
        wm::load_matrix_sync(bt, sV + 16 * f * LD + k * KF, LD);
        wm::mma_sync(pf, a, bt, pf);
      }
      wm::store_matrix_sync(ss + 16 * f, sf, SLD, wm::mem_row_major);
      wm::store_matrix_sync(sdp + 16 * f, pf, SLD, wm::mem_row_major);
    }
    __syncwarp();
    {
      const int c0 = 32 * half, c1 = min(c0 + 32, 16 * nf);
      const float li = sLse[16 * warp + r], di = sD[16 * warp + r];
      for (int c = c0; c < c1; ++c) {
        const float p = (j0 + c <= i && i < L.seq) ? exp_(ss[r * SLD + c] * scale - li) : 0.0f;
        sds[r * PLD + c] = stage_value<float, Path>(p * (sdp[r * SLD + c] - di));
      }
    }
    __syncwarp();
    for (int kk = 0; kk < 16 * nf; kk += KF) {  // dQ += dS K
      wm::fragment<wm::matrix_a, 16, 16, KF, FT, wm::row_major> a;
      wm::load_matrix_sync(a, sds + kk, PLD);
#pragma unroll
      for (int n = 0; n < NO; ++n) {
        wm::fragment<wm::matrix_b, 16, 16, KF, FT, wm::row_major> kb;
        wm::load_matrix_sync(kb, sK + kk * LD + 16 * n, LD);
        wm::mma_sync(dq[n], a, kb, dq[n]);
      }
    }
  }
  __syncthreads();  // Q, dO consumed: their space stages dQ
  if (!active) return;
  float* so = reinterpret_cast<float*>(sm) + 16 * warp * Lay::old;
#pragma unroll
  for (int n = 0; n < NO; ++n) wm::store_matrix_sync(so + 16 * n, dq[n], Lay::old, wm::mem_row_major);
  __syncwarp();
  for (int e = lane; e < 16 * HD; e += 32) {
    const int rr = e / HD, c = e % HD;
    if (w0 + rr < L.seq) dqkv.data[(b * L.seq + w0 + rr) * dqkv_ld + h * L.hd + c] += scale * so[rr * Lay::old + c];
  }
#else
  (void)dqkv, (void)dout, (void)out, (void)lse, (void)qkv, (void)L, (void)scale, (void)dqkv_ld, (void)dout_ld;
#endif
}

// dK, dV: block = 64 keys, streaming query tiles i0 >= its first key. Per tile and warp (16 keys):
// Sᵀ = K Qᵀ, dPᵀ = V dOᵀ (wmma), Pᵀ = exp(scale·Sᵀ − lse), dSᵀ = Pᵀ ∘ (dPᵀ − D) (fp32 scratch),
// both rounded, dV += Pᵀ dO, dK += dSᵀ Q (wmma); at the end dqkv[k] += scale · dK, dqkv[v] += dV.
template <int Path, int HD>
__global__ void attention_tc_dkdv_kernel(MatrixView<float> dqkv, MatrixView<const float> dout,
                                         MatrixView<const float> out, const float* lse, MatrixView<const float> qkv,
                                         HeadLayout L, float scale, index_t dqkv_ld, index_t dout_ld) {
#if defined(MOM_TC_ATTENTION_BODY)
  using Lay = TcLayout<Path, HD>;
  using S = typename Lay::S;
  using FT = typename Lay::frag_t;
  constexpr int KF = Lay::kf, LD = Lay::ld, SLD = Lay::sld, PLD = Lay::pld, NK = HD / KF, NO = HD / 16;
  unsigned char* sm = dynamic_smem();
  S* sK = reinterpret_cast<S*>(sm);
  S* sV = reinterpret_cast<S*>(sm + Lay::tile);
  S* sQ = reinterpret_cast<S*>(sm + 2 * Lay::tile);
  S* sdO = reinterpret_cast<S*>(sm + 3 * Lay::tile);
  float* sS = reinterpret_cast<float*>(sm + 4 * Lay::tile);
  float* sdP = reinterpret_cast<float*>(sm + 4 * Lay::tile + Lay::scratch);
  S* sP = Path == gemm_bf16 ? reinterpret_cast<S*>(sm + 4 * Lay::tile + 2 * Lay::scratch) : reinterpret_cast<S*>(sS);
  S* sdS = Path == gemm_bf16 ? reinterpret_cast<S*>(sm + 4 * Lay::tile + 2 * Lay::scratch + Lay::pstage)
                             : reinterpret_cast<S*>(sdP);
  float* sLse = reinterpret_cast<float*>(sm + 4 * Lay::tile + 2 * Lay::scratch + 2 * Lay::pstage);
  float* sD = sLse + tc_tile;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const index_t bh = blockIdx.y, b = bh / L.heads, h = bh % L.heads;
  const index_t j0 = index_t(blockIdx.x) * tc_tile, w0 = j0 + 16 * warp;
  const float* base = qkv.data + b * L.seq * L.qkv_ld;
  const float* dbase = dout.data + b * L.seq * dout_ld;
  const float* obase = out.data + b * L.seq * L.out_ld;
  const bool active = w0 < L.seq;

  tc_stage<Path, HD>(sK, base, L.qkv_ld, j0, L.seq, L.d + h * L.hd);
  tc_stage<Path, HD>(sV, base, L.qkv_ld, j0, L.seq, 2 * L.d + h * L.hd);
  wm::fragment<wm::accumulator, 16, 16, KF, float> dk[NO], dv[NO];
#pragma unroll
  for (int n = 0; n < NO; ++n) {
    wm::fill_fragment(dk[n], 0.0f);
    wm::fill_fragment(dv[n], 0.0f);
  }
  const int r = lane >> 1, half = lane & 1;
  const index_t j = w0 + r;  // this lane's key
  float* ss = sS + 16 * warp * SLD;
  float* sdp = sdP + 16 * warp * SLD;
  S* sp = sP + 16 * warp * PLD;
  S* sds = sdS + 16 * warp * PLD;
  const S* sk = sK + 16 * warp * LD;
  const S* sv = sV + 16 * warp * LD;
  for (index_t i0 = j0; i0 < L.seq; i0 += tc_tile) {  // query tiles at or after this key tile
    __syncthreads();
    tc_stage<Path, HD>(sQ, base, L.qkv_ld, i0, L.seq, h * L.hd);
    tc_stage_dout<Path, HD>(sdO, sD, sLse, dbase, dout_ld, obase, L.out_ld, lse + bh * L.seq, i0, L.seq, h * L.hd);
    __syncthreads();
    if (!active) continue;
    // 16-query column blocks with a query >= the warp's first key and < seq.
    const int f_lo = i0 == j0 ? warp : 0;
    const int f_hi = static_cast<int>(min(index_t(4), (L.seq - i0 + 15) / 16));
    for (int f = f_lo; f < f_hi; ++f) {
      wm::fragment<wm::accumulator, 16, 16, KF, float> sf, pf;
      wm::fill_fragment(sf, 0.0f);
      wm::fill_fragment(pf, 0.0f);
#pragma unroll
      for (int k = 0; k < NK; ++k) {
        wm::fragment<wm::matrix_a, 16, 16, KF, FT, wm::row_major> a;
        wm::fragment<wm::matrix_b, 16, 16, KF, FT, wm::col_major> bt;
        wm::load_matrix_sync(a, sk + k * KF, LD);
        wm::load_matrix_sync(bt, sQ + 16 * f * LD + k * KF, LD);
        wm::mma_sync(sf, a, bt, sf);
        wm::load_matrix_sync(a, sv + k * KF, LD);
        wm::load_matrix_sync(bt, sdO + 16 * f * LD + k * KF, LD);
        wm::mma_sync(pf, a, bt, pf);
      }
      wm::store_matrix_sync(ss + 16 * f, sf, SLD, wm::mem_row_major);
      wm::store_matrix_sync(sdp + 16 * f, pf, SLD, wm::mem_row_major);
    }
    __syncwarp();
    {
      const int c0 = max(32 * half, 16 * f_lo), c1 = min(32 * half + 32, 16 * f_hi);
      for (int c = c0; c < c1; ++c) {
        const index_t iq = i0 + c;
        const float p = (iq >= j && iq < L.seq && j < L.seq) ? exp_(ss[r * SLD + c] * scale - sLse[c]) : 0.0f;
        const float ds = p * (sdp[r * SLD + c] - sD[c]);
        sp[r * PLD + c] = stage_value<float, Path>(p);
        sds[r * PLD + c] = stage_value<float, Path>(ds);
      }
    }
    __syncwarp();
    for (int kk = 16 * f_lo; kk < 16 * f_hi; kk += KF) {  // dV += Pᵀ dO, dK += dSᵀ Q
      wm::fragment<wm::matrix_a, 16, 16, KF, FT, wm::row_major> pa, da;
      wm::load_matrix_sync(pa, sp + kk, PLD);
      wm::load_matrix_sync(da, sds + kk, PLD);
#pragma unroll
      for (int n = 0; n < NO; ++n) {
        wm::fragment<wm::matrix_b, 16, 16, KF, FT, wm::row_major> bb;
        wm::load_matrix_sync(bb, sdO + kk * LD + 16 * n, LD);
        wm::mma_sync(dv[n], pa, bb, dv[n]);
        wm::load_matrix_sync(bb, sQ + kk * LD + 16 * n, LD);
        wm::mma_sync(dk[n], da, bb, dk[n]);
      }
    }
  }
  __syncthreads();  // K, V consumed: their space stages dK, then dV
  if (!active) return;
  float* so = reinterpret_cast<float*>(sm) + 16 * warp * Lay::old;
#pragma unroll
  for (int n = 0; n < NO; ++n) wm::store_matrix_sync(so + 16 * n, dk[n], Lay::old, wm::mem_row_major);
  __syncwarp();
  for (int e = lane; e < 16 * HD; e += 32) {
    const int rr = e / HD, c = e % HD;
    if (w0 + rr < L.seq)
      dqkv.data[(b * L.seq + w0 + rr) * dqkv_ld + L.d + h * L.hd + c] += scale * so[rr * Lay::old + c];
  }
  __syncwarp();
#pragma unroll
  for (int n = 0; n < NO; ++n) wm::store_matrix_sync(so + 16 * n, dv[n], Lay::old, wm::mem_row_major);
  __syncwarp();
  for (int e = lane; e < 16 * HD; e += 32) {
    const int rr = e / HD, c = e % HD;
    if (w0 + rr < L.seq) dqkv.data[(b * L.seq + w0 + rr) * dqkv_ld + 2 * L.d + h * L.hd + c] += so[rr * Lay::old + c];
  }
#else
  (void)dqkv, (void)dout, (void)out, (void)lse, (void)qkv, (void)L, (void)scale, (void)dqkv_ld, (void)dout_ld;
#endif
}

// Whether kernel can run here with smem bytes of dynamic shared memory: compiled for sm_80 or later
// (the empty pre-sm_80 body must never run) and within the device's per-block opt-in limit (common.cuh).
template <auto kernel>
bool tc_kernel_usable(const Context& ctx, std::size_t smem) {
  return smem_fits<kernel>(ctx, smem, 80);
}

// Calls f(path, head dim) as integral constants when the tensor-core path applies: float,
// Precision::TF32 or BF16, head dim 64 or 128.
template <class T, class F>
bool with_tc_attention(const Context& ctx, index_t hd, F&& f) {
  if constexpr (!std::is_same_v<T, float>) {
    (void)ctx, (void)hd, (void)f;
    return false;
  } else {
    if (ctx.precision == Precision::FP32 || (hd != 64 && hd != 128)) return false;
    const auto with_hd = [&](auto path) {
      return hd == 64 ? f(path, std::integral_constant<int, 64>{}) : f(path, std::integral_constant<int, 128>{});
    };
    return ctx.precision == Precision::BF16 ? with_hd(std::integral_constant<int, gemm_bf16>{})
                                            : with_hd(std::integral_constant<int, gemm_tf32>{});
  }
}

template <class T>
bool attention_tc_forward(const Context& ctx, MatrixView<T> out, T* lse, MatrixView<const T> qkv, HeadLayout L,
                          index_t batch) {
  return with_tc_attention<T>(ctx, L.hd, [&](auto path, auto hd) {
    constexpr int P = decltype(path)::value, HD = decltype(hd)::value;
    constexpr std::size_t smem = TcLayout<P, HD>::fwd_bytes;
    constexpr auto kernel = attention_tc_forward_kernel<P, HD>;
    if (!tc_kernel_usable<kernel>(ctx, smem)) return false;
    const dim3 grid(blocks_exact(L.seq, tc_tile), static_cast<unsigned>(batch * L.heads));
    launch_smem("attention_forward", ctx, grid, tc_threads, smem, kernel, out, lse, qkv, L,
                1.0f / std::sqrt(float(L.hd)));
    return true;
  });
}

template <class T>
bool attention_tc_backward(const Context& ctx, MatrixView<T> dqkv, MatrixView<const T> dout, MatrixView<const T> out,
                           const T* lse, MatrixView<const T> qkv, HeadLayout L, index_t batch) {
  return with_tc_attention<T>(ctx, L.hd, [&](auto path, auto hd) {
    constexpr int P = decltype(path)::value, HD = decltype(hd)::value;
    constexpr std::size_t dq_smem = TcLayout<P, HD>::dq_bytes, dkdv_smem = TcLayout<P, HD>::dkdv_bytes;
    constexpr auto dq_kernel = attention_tc_dq_kernel<P, HD>;
    constexpr auto dkdv_kernel = attention_tc_dkdv_kernel<P, HD>;
    if (!tc_kernel_usable<dq_kernel>(ctx, dq_smem) || !tc_kernel_usable<dkdv_kernel>(ctx, dkdv_smem)) return false;
    const dim3 grid(blocks_exact(L.seq, tc_tile), static_cast<unsigned>(batch * L.heads));
    const float scale = 1.0f / std::sqrt(float(L.hd));
    launch_smem("attention_backward", ctx, grid, tc_threads, dq_smem, dq_kernel, dqkv, dout, out, lse, qkv, L, scale,
                dqkv.ld, dout.ld);
    launch_smem("attention_backward", ctx, grid, tc_threads, dkdv_smem, dkdv_kernel, dqkv, dout, out, lse, qkv, L,
                scale, dqkv.ld, dout.ld);
    return true;
  });
}

}  // namespace dev

}  // namespace mom::cuda

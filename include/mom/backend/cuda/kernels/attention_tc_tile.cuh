#pragma once
// The pieces of the tensor-core attention kernels (attention_tc.cuh: dense; attention_packed_tc.cuh: packed and
// grouped) that do not depend on which rows meet which: the block and shared-memory layouts, the staging of a
// 64-row tile (rounded to TF32 / bf16), and a warp's work on one streamed tile (the products, the online
// softmax, the accumulation, the write-out). attention_tc.cuh's header describes the design.
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
  // forward: K, V | S | P | corr | row table.  backward: K, V, Q, dO | S, dP | P, dS | lse, D.
  static constexpr std::size_t fwd_bytes = 2 * tile + scratch + pstage + vec + rows_table;
  static constexpr std::size_t bwd_bytes = 4 * tile + 2 * scratch + 2 * pstage + 2 * vec;
  // The output staging [64][old] fp32 overlays the first two tiles once the loop is done.
  static_assert(2 * tile >= std::size_t(tc_tile) * old * sizeof(float));
};

// The kernels' shared-memory regions, carved from the dynamic shared memory in TcLayout's order (TF32: P and dS
// overwrite their fp32 scratch in place); each kernel unpacks them by a structured binding.
template <int Path, int HD>
struct TcForwardSmem {
  using S = typename TcLayout<Path, HD>::S;
  S *k, *v;            // K (Q first), V
  float* s;            // fp32 scores
  S* p;                // rounded P
  float *corr, *rows;  // per-row rescaling factors, the row-index table
};
template <int Path, int HD>
__device__ __forceinline__ TcForwardSmem<Path, HD> tc_forward_smem(unsigned char* sm) {
  using Lay = TcLayout<Path, HD>;
  using S = typename Lay::S;
  float* s = reinterpret_cast<float*>(sm + 2 * Lay::tile);
  unsigned char* st = sm + 2 * Lay::tile + Lay::scratch;
  return {reinterpret_cast<S*>(sm), reinterpret_cast<S*>(sm + Lay::tile), s,
          Path == gemm_bf16 ? reinterpret_cast<S*>(st) : reinterpret_cast<S*>(s),
          reinterpret_cast<float*>(st + Lay::pstage), reinterpret_cast<float*>(st + Lay::pstage + Lay::vec)};
}
template <int Path, int HD>
struct TcBackwardSmem {
  using S = typename TcLayout<Path, HD>::S;
  S *k, *v, *q, *dout;  // the block's keys and values, the streamed query tile's Q and dO
  float *s, *dp;         // fp32 S and dP
  S *p, *ds;             // rounded P and dS
  float *lse, *d;        // the staged query rows' lse and D
};
template <int Path, int HD>
__device__ __forceinline__ TcBackwardSmem<Path, HD> tc_backward_smem(unsigned char* sm) {
  using Lay = TcLayout<Path, HD>;
  using S = typename Lay::S;
  constexpr bool bf16 = Path == gemm_bf16;
  float* s = reinterpret_cast<float*>(sm + 4 * Lay::tile);
  float* dp = reinterpret_cast<float*>(sm + 4 * Lay::tile + Lay::scratch);
  unsigned char* st = sm + 4 * Lay::tile + 2 * Lay::scratch;  // the rounded stages (bf16)
  S* p = bf16 ? reinterpret_cast<S*>(st) : reinterpret_cast<S*>(s);
  S* ds = bf16 ? reinterpret_cast<S*>(st + Lay::pstage) : reinterpret_cast<S*>(dp);
  float* lse = reinterpret_cast<float*>(st + 2 * Lay::pstage);
  return {reinterpret_cast<S*>(sm), reinterpret_cast<S*>(sm + Lay::tile), reinterpret_cast<S*>(sm + 2 * Lay::tile),
          reinterpret_cast<S*>(sm + 3 * Lay::tile), s, dp, p, ds, lse, lse + tc_tile};
}

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

// dst[rr][c] = rounded base[(r0 + rr)·ld + col0 + c] for rr < 64, c < HD; rows past seq are 0. E: float, or
// std::uint16_t for bf16 bits (the qkv product's bf16 output, attention_ops.hpp; the bf16 path only), copied as they are,
// being the bits the rounding of the fp32 values makes.
// 16-byte loads when every row of the slice starts 16-byte aligned (the usual qkv / dout layouts);
// the condition is the same for the whole block. Batch: each thread's 16-byte loads (8 float4s at head dim 64, 16 at
// 128) in batches of that many, a batch's loads all issued before its first shared store (interleaved, the
// compiler may not move a global load above a store through the generic shared pointer, and each load's
// latency is paid in turn). Measured on an H200 (bench/RESULTS.md, "Issues 27 and 28 on an H200"): batches
// of 8 took dQ 7.27 → 6.31 ms and dK/dV 10.59 → 9.49 ms a GPT-2-small step, but the forward 3.86 → 4.84 ms
// (its accumulators and Q fragments stay live across the staging), so the forward stages one at a time.
template <int Path, int HD, int Batch = 8, class E>
__device__ __forceinline__ void tc_stage(typename TcLayout<Path, HD>::S* dst, const E* base, index_t ld,
                                         index_t r0, index_t seq, index_t col0) {
  constexpr bool bits = std::is_same_v<E, std::uint16_t>;
  static_assert(std::is_same_v<E, float> || (bits && Path == gemm_bf16), "fp32 values, or bf16 bits for the bf16 path");
  using V = std::conditional_t<bits, uint4, float4>;  // a 16-byte load
  constexpr int LD = TcLayout<Path, HD>::ld, N = 16 / int(sizeof(E));
  if (ld % N == 0 && aligned16(base + col0)) {
    constexpr int HN = HD / N, per = tc_tile * HN / tc_threads, batch = Batch < per ? Batch : per;
    static_assert(per % batch == 0);
#pragma unroll
    for (int b0 = 0; b0 < per; b0 += batch) {
      V v[batch];
#pragma unroll
      for (int k = 0; k < batch; ++k) {
        const int e = threadIdx.x + (b0 + k) * tc_threads, rr = e / HN, c = (e % HN) * N;
        v[k] = r0 + rr < seq ? load16<V>(base + (r0 + rr) * ld + col0 + c) : V{};
      }
#pragma unroll
      for (int k = 0; k < batch; ++k) {
        const int e = threadIdx.x + (b0 + k) * tc_threads, rr = e / HN, c = (e % HN) * N;
        if constexpr (bits) store16(reinterpret_cast<std::uint16_t*>(dst) + rr * LD + c, v[k]);
        else tc_store4<Path>(dst + rr * LD + c, v[k]);
      }
    }
    return;
  }
  for (int e = threadIdx.x; e < tc_tile * HD; e += tc_threads) {
    const int rr = e / HD, c = e % HD;
    const index_t r = r0 + rr;
    if constexpr (bits) reinterpret_cast<std::uint16_t*>(dst)[rr * LD + c] = r < seq ? base[r * ld + col0 + c] : E(0);
    else dst[rr * LD + c] = stage_value<float, Path>(r < seq ? base[r * ld + col0 + c] : 0.0f);
  }
}

// Stages rows r0 .. r0 + 63 of dO (rounded) and, per row i, D_i = Σ_c dO_ic O_ic (fp32, from the
// unrounded values) and lse_i = lse_bh[i · lse_stride]; rows past seq get zeros. When every row of dO and O starts 16-byte
// aligned (the usual layouts), 16 consecutive threads share a row, each loading float4s of dO and O
// (HD / 64 of each), and the row's D is a sum over those 16 lanes: the block's 64 rows in 8 passes,
// the loads of 4 passes issued before their first store (as in tc_stage). (One warp per 16 rows, a
// row at a time with a warp sum, as the fallback below does, is a chain of 16 dependent
// load-and-reduce steps per warp; the backward kernel runs it once per (key tile, query tile) pair.)
// O's element OE is float, or std::uint16_t for bf16 bits (attention_mma.cuh's bf16 output; 4 of them an 8-byte load).
__device__ __forceinline__ float o_value(float v) { return v; }
__device__ __forceinline__ float o_value(std::uint16_t v) { return bf16_float(v); }
__device__ __forceinline__ float4 load_o4(const float* p) { return load16<float4>(p); }
__device__ __forceinline__ float4 load_o4(const std::uint16_t* p) {
  const uint2 u = *reinterpret_cast<const uint2*>(p);
  return float4{bf16_float(static_cast<std::uint16_t>(u.x)), bf16_float(static_cast<std::uint16_t>(u.x >> 16)),
                bf16_float(static_cast<std::uint16_t>(u.y)), bf16_float(static_cast<std::uint16_t>(u.y >> 16))};
}
template <int Path, int HD, class OE = float>
__device__ __forceinline__ void tc_stage_dout(typename TcLayout<Path, HD>::S* sdo, float* sd, float* slse,
                                              const float* dbase, index_t dld, const OE* obase, index_t old_,
                                              const float* lse_bh, index_t r0, index_t seq, index_t col0,
                                              index_t lse_stride = 1) {
  constexpr int LD = TcLayout<Path, HD>::ld;
  if (dld % 4 == 0 && old_ % 4 == 0 && aligned16(dbase + col0) && aligned16(obase + col0)) {
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
            g[p][v] = load16<float4>(dbase + r * dld + col0 + c);
            o[p][v] = load_o4(obase + r * old_ + col0 + c);
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
      if (r < seq) di += g * o_value(obase[r * old_ + col0 + c]);
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

// ---- the pieces of a warp's work on one streamed tile, shared by the dense kernels below and the packed / grouped
// ones (attention_packed_tc.cuh). A warp owns 16 rows; lane pair (2r, 2r + 1) owns row r, each lane half of the 64
// columns. Column blocks [f_lo, f_hi) of 16 are the ones multiplied; the kernels pass the blocks that hold a
// visible entry of the warp's rows, and a row's visible columns are j0 + c in [lo, hi).
#if defined(MOM_TC_ATTENTION_BODY)
template <int Path>
using TcFragT = std::conditional_t<Path == gemm_bf16, bf16_t, tf32_tag>;
template <int Path>
inline constexpr int tc_kf = TcLayout<Path, 64>::kf;
template <int Path>
using TcAcc = wm::fragment<wm::accumulator, 16, 16, tc_kf<Path>, float>;

// A warp's Q fragments (the forward keeps them in registers).
template <int Path, int HD>
struct TcQFrags {
  wm::fragment<wm::matrix_a, 16, 16, tc_kf<Path>, TcFragT<Path>, wm::row_major> f[HD / tc_kf<Path>];
};
// The forward's start, after Q is staged in sK (this block's barrier publishes it): the row-index table and its
// fragment (attention_tc.cuh's header), the warp's Q fragments, O = 0.
template <int Path, int HD>
__device__ __forceinline__ void tc_forward_start(TcQFrags<Path, HD>& qf, TcAcc<Path>& rows, TcAcc<Path> (&o)[HD / 16],
                                                 const typename TcLayout<Path, HD>::S* sK, float* sRows) {
  constexpr int KF = tc_kf<Path>, LD = TcLayout<Path, HD>::ld;
  const int warp = threadIdx.x / 32;
  for (int e = threadIdx.x; e < 256; e += tc_threads) sRows[e] = float(e / 16);
  __syncthreads();
#pragma unroll
  for (int k = 0; k < HD / KF; ++k) wm::load_matrix_sync(qf.f[k], sK + 16 * warp * LD + k * KF, LD);
  wm::load_matrix_sync(rows, sRows, 16, wm::mem_row_major);
#pragma unroll
  for (int n = 0; n < HD / 16; ++n) wm::fill_fragment(o[n], 0.0f);
}

// s1 (and s2) [16 × 64] fp32 scratch, blocks f in [f_lo, f_hi): s1 = A1 B1ᵀ (s2 = A2 B2ᵀ), A's 16 rows and B's 64
// rows staged with row stride LD (the backward kernels' Sᵀ and dPᵀ; the forward's S is tc_scores).
template <int Path, int HD, bool Two>
__device__ __forceinline__ void tc_products(float* s1, const typename TcLayout<Path, HD>::S* a1,
                                            const typename TcLayout<Path, HD>::S* b1, float* s2,
                                            const typename TcLayout<Path, HD>::S* a2,
                                            const typename TcLayout<Path, HD>::S* b2, int f_lo, int f_hi) {
  using Lay = TcLayout<Path, HD>;
  constexpr int KF = Lay::kf, LD = Lay::ld, SLD = Lay::sld, NK = HD / KF;
  for (int f = f_lo; f < f_hi; ++f) {
    TcAcc<Path> sf, pf;
    wm::fill_fragment(sf, 0.0f);
    if constexpr (Two) wm::fill_fragment(pf, 0.0f);
#pragma unroll
    for (int k = 0; k < NK; ++k) {
      wm::fragment<wm::matrix_a, 16, 16, KF, TcFragT<Path>, wm::row_major> fa;
      wm::fragment<wm::matrix_b, 16, 16, KF, TcFragT<Path>, wm::col_major> bt;
      wm::load_matrix_sync(fa, a1 + k * KF, LD);
      wm::load_matrix_sync(bt, b1 + 16 * f * LD + k * KF, LD);
      wm::mma_sync(sf, fa, bt, sf);
      if constexpr (Two) {
        wm::load_matrix_sync(fa, a2 + k * KF, LD);
        wm::load_matrix_sync(bt, b2 + 16 * f * LD + k * KF, LD);
        wm::mma_sync(pf, fa, bt, pf);
      }
    }
    wm::store_matrix_sync(s1 + 16 * f, sf, SLD, wm::mem_row_major);
    if constexpr (Two) wm::store_matrix_sync(s2 + 16 * f, pf, SLD, wm::mem_row_major);
  }
}
// The forward's S = Q Kᵀ with Q's fragments held in registers.
template <int Path, int HD>
__device__ __forceinline__ void tc_scores(float* ss, const TcQFrags<Path, HD>& qf, const typename TcLayout<Path, HD>::S* sK,
                                          int f_lo, int f_hi) {
  using Lay = TcLayout<Path, HD>;
  constexpr int KF = Lay::kf, LD = Lay::ld, SLD = Lay::sld, NK = HD / KF;
#pragma unroll
  for (int f = 0; f < 4; ++f) {
    if (f >= f_lo && f < f_hi) {
      TcAcc<Path> sf;
      wm::fill_fragment(sf, 0.0f);
#pragma unroll
      for (int k = 0; k < NK; ++k) {
        wm::fragment<wm::matrix_b, 16, 16, KF, TcFragT<Path>, wm::col_major> kb;  // Kᵀ: (c, j) at sK[j][c]
        wm::load_matrix_sync(kb, sK + 16 * f * LD + k * KF, LD);
        wm::mma_sync(sf, qf.f[k], kb, sf);
      }
      wm::store_matrix_sync(ss + 16 * f, sf, SLD, wm::mem_row_major);
    }
  }
}

// The forward's online softmax over row r's columns [c0, c1) (visible: j0 + c in [lo, hi)), partner lanes combined:
// P rounded into sp, (m, l) updated; returns the factor the row's output is rescaled by.
template <int Path, int HD>
__device__ __forceinline__ float tc_softmax(const float* ss, typename TcLayout<Path, HD>::S* sp, int r, int c0, int c1,
                                            index_t j0, index_t lo, index_t hi, float scale, float& m, float& l) {
  constexpr int SLD = TcLayout<Path, HD>::sld, PLD = TcLayout<Path, HD>::pld;
  float tmax = neg_inf<float>();
  for (int c = c0; c < c1; ++c)
    if (j0 + c >= lo && j0 + c < hi) tmax = max(tmax, ss[r * SLD + c] * scale);
  tmax = max(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
  const float mnew = max(m, tmax);
  const float corr = mnew == neg_inf<float>() ? 1.0f : exp_(m - mnew);  // no key yet: nothing to rescale
  float sum = 0.0f;
  for (int c = c0; c < c1; ++c) {
    const float p = j0 + c >= lo && j0 + c < hi ? exp_(ss[r * SLD + c] * scale - mnew) : 0.0f;
    sum += p;
    sp[r * PLD + c] = stage_value<float, Path>(p);
  }
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  l = l * corr + sum;
  m = mnew;
  return corr;
}

// acc[n] *= w[row] for every element (the row-index fragment rows: attention_tc.cuh's header).
template <int Path, int HD>
__device__ __forceinline__ void tc_scale_rows(TcAcc<Path> (&acc)[HD / 16], const TcAcc<Path>& rows, const float* w) {
#pragma unroll
  for (int n = 0; n < HD / 16; ++n)
#pragma unroll
    for (int x = 0; x < acc[n].num_elements; ++x) acc[n].x[x] *= w[int(rows.x[x])];
}
// acc[n] += A[16 × kk0..kk1) B[kk0..kk1) × 16n..] for every n (A's rows ald apart): the forwards' O += P V.
template <int Path, int HD>
__device__ __forceinline__ void tc_accumulate(TcAcc<Path> (&acc)[HD / 16], const typename TcLayout<Path, HD>::S* a, int ald,
                                              const typename TcLayout<Path, HD>::S* b, int kk0, int kk1) {
  constexpr int KF = TcLayout<Path, HD>::kf, LD = TcLayout<Path, HD>::ld, NO = HD / 16;
  for (int kk = kk0; kk < kk1; kk += KF) {
    wm::fragment<wm::matrix_a, 16, 16, KF, TcFragT<Path>, wm::row_major> fa;
    wm::load_matrix_sync(fa, a + kk, ald);
#pragma unroll
    for (int n = 0; n < NO; ++n) {
      wm::fragment<wm::matrix_b, 16, 16, KF, TcFragT<Path>, wm::row_major> bb;
      wm::load_matrix_sync(bb, b + kk * LD + 16 * n, LD);
      wm::mma_sync(acc[n], fa, bb, acc[n]);
    }
  }
}
// dV += Pᵀ dO and dK += dSᵀ Q over columns [kk0, kk1) of the warp's P / dS rows (the backward kernels).
template <int Path, int HD>
__device__ __forceinline__ void tc_accumulate_dkdv(TcAcc<Path> (&dk)[HD / 16], TcAcc<Path> (&dv)[HD / 16],
                                                   const typename TcLayout<Path, HD>::S* sp,
                                                   const typename TcLayout<Path, HD>::S* sds,
                                                   const typename TcLayout<Path, HD>::S* sdO,
                                                   const typename TcLayout<Path, HD>::S* sQ, int kk0, int kk1) {
  constexpr int KF = TcLayout<Path, HD>::kf, LD = TcLayout<Path, HD>::ld, PLD = TcLayout<Path, HD>::pld, NO = HD / 16;
  for (int kk = kk0; kk < kk1; kk += KF) {
    wm::fragment<wm::matrix_a, 16, 16, KF, TcFragT<Path>, wm::row_major> pa, da;
    wm::load_matrix_sync(pa, sp + kk, PLD);
    wm::load_matrix_sync(da, sds + kk, PLD);
#pragma unroll
    for (int n = 0; n < NO; ++n) {
      wm::fragment<wm::matrix_b, 16, 16, KF, TcFragT<Path>, wm::row_major> bb;
      wm::load_matrix_sync(bb, sdO + kk * LD + 16 * n, LD);
      wm::mma_sync(dv[n], pa, bb, dv[n]);
      wm::load_matrix_sync(bb, sQ + kk * LD + 16 * n, LD);
      wm::mma_sync(dk[n], da, bb, dk[n]);
    }
  }
}

// The backward kernels' dQ (FlashAttention-2's fused backward): after a barrier that publishes every warp's dSᵀ
// rows (sds: [64 keys][PLD], key-major, as tc_accumulate_dkdv reads them), warp w takes the tile's queries
// 16w .. 16w + 15: dQ [16 × HD] = scale · dS K over the 16-key blocks kb with bit kb of kmask set (those whose
// warps wrote these queries' columns of dSᵀ), dS (query, key) read transposed (col_major) from sds, K from its
// staged tile.
// One 16 × 16 accumulator at a time (the dK / dV accumulators are live around it), each through the warp's fp32
// staging so (16 rows, SLD apart) to add4(row, column, 4 values from that column), lanes over consecutive columns:
// the kernels add them to dQ atomically (other key tiles' blocks add to the same rows).
template <int Path, int HD, class Add4>
__device__ __forceinline__ void tc_dq_from_dst(const typename TcLayout<Path, HD>::S* sds,
                                               const typename TcLayout<Path, HD>::S* sK, unsigned kmask, float scale,
                                               float* so, Add4&& add4) {
  constexpr int KF = TcLayout<Path, HD>::kf, LD = TcLayout<Path, HD>::ld, PLD = TcLayout<Path, HD>::pld;
  constexpr int SLD = TcLayout<Path, HD>::sld, NO = HD / 16;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll 1
  for (int n = 0; n < NO; ++n) {
    TcAcc<Path> acc;
    wm::fill_fragment(acc, 0.0f);
#pragma unroll 1
    for (int kk = 0; kk < tc_tile; kk += KF) {
      if (!(kmask >> (kk / 16) & 1u)) continue;
      wm::fragment<wm::matrix_a, 16, 16, KF, TcFragT<Path>, wm::col_major> da;  // dS (q, k) at sds[k][q]
      wm::fragment<wm::matrix_b, 16, 16, KF, TcFragT<Path>, wm::row_major> kb;
      wm::load_matrix_sync(da, sds + kk * PLD + 16 * warp, PLD);
      wm::load_matrix_sync(kb, sK + kk * LD + 16 * n, LD);
      wm::mma_sync(acc, da, kb, acc);
    }
    wm::store_matrix_sync(so, acc, SLD, wm::mem_row_major);
    __syncwarp();
    for (int e = lane; e < 64; e += 32) {
      const float* v = so + (e / 4) * SLD + 4 * (e % 4);
      add4(e / 4, 16 * n + 4 * (e % 4), float4{scale * v[0], scale * v[1], scale * v[2], scale * v[3]});
    }
    __syncwarp();
  }
}

// The warp's 16 × HD accumulators through its fp32 staging so (rows Lay::old apart), then put(row, column, value)
// for every element, lanes over consecutive columns.
template <int Path, int HD, class Put>
__device__ __forceinline__ void tc_write_rows(TcAcc<Path> (&acc)[HD / 16], float* so, Put&& put) {
  constexpr int OLD = TcLayout<Path, HD>::old, NO = HD / 16;
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int n = 0; n < NO; ++n) wm::store_matrix_sync(so + 16 * n, acc[n], OLD, wm::mem_row_major);
  __syncwarp();
  for (int e = lane; e < 16 * HD; e += 32) put(e / HD, e % HD, so[(e / HD) * OLD + e % HD]);
  __syncwarp();
}
#endif

}  // namespace dev

}  // namespace mom::cuda

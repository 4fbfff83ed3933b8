#pragma once
// The grouped GEMMs' tile cores (grouped_linear.cuh runs them): the operands' tile loads (a row list fused in), the
// SIMT tile and the wmma tensor-core tile (TF32; gemm_tile_mma.cuh has the bf16 tile on mma.sync).
#include <type_traits>

#include "mom/backend/cuda/kernels/common.cuh"
#include "mom/backend/cuda/kernels/linear.cuh"

#if defined(MOM_CUDA_EMULATE)
#include "mom/backend/cuda/emulate_wmma.hpp"  // nvcuda::wmma and bf16 on CPU threads
#else
#include <cuda_bf16.h>
#include <mma.h>
#endif

namespace mom::cuda {

namespace dev {

// ---- the grouped GEMM core ------------------------------------------------------------------------
//
// C tile += A [M × K] · B [K × N] over one output tile at (m0, n0): 256 threads, k steps through
// double-buffered shared memory (one barrier per step; the next step's elements are loaded into
// registers while the current one is multiplied). Element (i, k) of an operand (i = row of A or column
// of B) is at p[i·ld + k] when KC ("k contiguous") and at p[k·ld + i] otherwise; each layout is loaded
// with its contiguous index fastest across threads (coalesced) and stored k-major into shared memory (A
// column-major, B row-major). Out-of-range elements load as 0. The three layouts: forward A = x (KC),
// B = W_g (KC); dx A = dy (KC), B = W_g (not KC); dW A = dyᵀ (not KC), B = x (not KC). Each output goes
// to the kernel's epilogue, epi(row in tile, column in tile, value).
//
// Paths (float only; double is always SIMT):
//   gemm_simt  tile 64 × 64, k steps of 16; 4 × 4 outputs per thread at rows ty + 16a, columns
//              tx + 16b (the 16 lanes of a half-warp read consecutive shared columns), fp32/fp64 FMAs:
//              Precision::FP32 (gemm_tile).
//   gemm_tf32  operands rounded to TF32 (cvt.rna) when staged; wmma m16n16k8 on tensor cores,
//              fp32 accumulate: Precision::TF32 (the default, as cuBLAS' FAST_TF32) (gemm_tile_tc).
//   gemm_bf16  operands converted to bf16 (round to nearest even) when staged; mma.sync m16n8k16, fp32
//              accumulate, k steps of 32, 16-byte loads: Precision::BF16 (gemm_tile_mma.cuh).
// The tensor-core paths take a 128 × 128 tile: the 8 warps tile it as 2 (rows) × 4 (columns) of 64 × 32 (the TF32
// wmma tile: four × two 16 × 16 accumulators a warp, k steps of 16). The weight gradients (grouped_dw_kernel: one
// block per output tile and group, each looping over its group's rows) take the 64 × 64 tile where the 128 × 128 one
// would give fewer than dw_wide_tile_blocks blocks (small dW_g: four times the blocks, the same sums in the same
// order). They need sm_80; where the kernels were not compiled for it the launchers take the SIMT path
// (with_gemm_path).
inline constexpr int gemm_bm = 64, gemm_bn = 64, gemm_bk = 16, gemm_threads = 256;
enum GemmPath : int { gemm_simt = 0, gemm_tf32 = 1, gemm_bf16 = 2 };
// A path's output tile: rows (of C or dW) and columns.
template <int Path>
inline constexpr int gemm_tile_m = Path == gemm_simt ? gemm_bm : 128;
template <int Path>
inline constexpr int gemm_tile_n = Path == gemm_simt ? gemm_bn : 128;

#if defined(MOM_CUDA_EMULATE)
using bf16_t = EmuBf16;
__device__ inline bf16_t to_bf16_t(float x) { return {bf16_bits(x)}; }
__device__ inline float from_stage(bf16_t x) { return x.to_float(); }
#else
using bf16_t = __nv_bfloat16;
__device__ __forceinline__ bf16_t to_bf16_t(float x) { return __float2bfloat16_rn(x); }
__device__ __forceinline__ float from_stage(bf16_t x) { return __bfloat162float(x); }
#endif
__device__ __forceinline__ float from_stage(float x) { return x; }
__device__ __forceinline__ double from_stage(double x) { return x; }

// TF32 / bf16 wmma need sm_80; code compiled for older targets has no tensor-core tile (with_gemm_path
// takes the SIMT path there).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
inline constexpr bool wmma_available = true;
using tf32_tag = nvcuda::wmma::precision::tf32;
__device__ __forceinline__ float to_tf32(float v) { return nvcuda::wmma::__float_to_tf32(v); }
#else
inline constexpr bool wmma_available = false;
struct tf32_tag;
__device__ __forceinline__ float to_tf32(float v) { return v; }
#endif

// Shared-memory element type and row padding (keeps the transposed stores at most 2-way
// bank-conflicted, and wmma's ldm a multiple of 16 bytes with 32-byte aligned fragment rows).
template <class T, int Path>
struct GemmStage {
  using type = T;
  static constexpr int ld = gemm_bm + 4;
};
template <>
struct GemmStage<float, gemm_bf16> {
  using type = bf16_t;
  static constexpr int ld = gemm_bm + 8;
};

template <class T, int Path>
__device__ __forceinline__ typename GemmStage<T, Path>::type stage_value(T v) {
  if constexpr (Path == gemm_tf32) return to_tf32(v);
  else if constexpr (Path == gemm_bf16) return to_bf16_t(v);
  else return v;
}

// An operand's memory rows read through an index list (a gather fused into the tile loads, as the CPU's
// gemm_gathered): memory row r is the table's row rows[r]; rows == nullptr: row r itself. Indices outside
// [0, bound) read as zero (the forward kernel reports them).
struct RowList {
  const token_t* rows = nullptr;
  index_t bound = 0;
};

// A [TI × TK] tile of an operand (TI rows of A or columns of B, TK of k) into TI·TK / 256 registers a thread.
template <class T, bool KC, int TI = gemm_bm, int TK = gemm_bk>
__device__ __forceinline__ void gemm_load(T (&r)[TI * TK / gemm_threads], const T* p, index_t ld, index_t ni,
                                          index_t nk, index_t i0, index_t k0, RowList rl) {
#pragma unroll
  for (int q = 0; q < TI * TK / gemm_threads; ++q) {
    const int e = int(threadIdx.x) + q * gemm_threads;
    const int i = KC ? e / TK : e % TI;
    const int k = KC ? e % TK : e / TI;
    const index_t gi = i0 + i, gk = k0 + k;
    r[q] = T(0);
    if (gi < ni && gk < nk) {
      index_t row = KC ? gi : gk;  // the memory row (KC: i, else k)
      if (rl.rows) row = rl.rows[row];
      if (!rl.rows || (row >= 0 && row < rl.bound)) r[q] = p[row * ld + (KC ? gk : gi)];
    }
  }
}
template <class T, bool KC, int Path, int TI = gemm_bm, int TK = gemm_bk, int LD = GemmStage<T, Path>::ld>
__device__ __forceinline__ void gemm_store(typename GemmStage<T, Path>::type (*s)[LD],
                                           const T (&r)[TI * TK / gemm_threads]) {
#pragma unroll
  for (int q = 0; q < TI * TK / gemm_threads; ++q) {
    const int e = int(threadIdx.x) + q * gemm_threads;
    const int i = KC ? e / TK : e % TI;
    const int k = KC ? e % TK : e / TI;
    s[k][i] = stage_value<T, Path>(r[q]);
  }
}
// The sum of a thread's loaded values, in a fixed order (the fused bias gradient's partial sums).
template <class T, int Q>
__device__ __forceinline__ T gemm_part_sum(const T (&r)[Q]) {
  if constexpr (Q == 1) {
    return r[0];
  } else {
    T h[Q / 2];
#pragma unroll
    for (int q = 0; q < Q / 2; ++q) h[q] = r[2 * q] + r[2 * q + 1];
    return gemm_part_sum<T, Q / 2>(h);
  }
}

// acc[a][b] += Σ_{k<K} A(m0 + ty + 16a, k) · B(k, n0 + tx + 16b) (ty = thread / 16, tx = thread % 16), the SIMT
// path's 64 × 64 tile. With Product = false only the A tiles are loaded (the bias gradient alone). With want_asum
// (A not KC only), thread t < 64 also gets asum += Σ_k A(m0 + t, k) in full precision, the fused
// bias gradient: in that layout thread t loads only elements of row t % 64, so it sums them from
// its registers and the 4 partial sums of a row meet in shared memory (deterministic).
// Every thread of the block must call it (barriers).
template <class T, bool AKC, bool BKC, bool Product>
__device__ void gemm_tile(T (&acc)[4][4], T& asum, bool want_asum, const T* A, index_t lda, const T* B, index_t ldb,
                          index_t M, index_t N, index_t K, index_t m0, index_t n0, RowList arows = {},
                          RowList brows = {}) {
  using S = typename GemmStage<T, gemm_simt>::type;
  constexpr int ld = GemmStage<T, gemm_simt>::ld;
  alignas(32) __shared__ S As[2][gemm_bk][ld];
  alignas(32) __shared__ S Bs[2][gemm_bk][ld];
  const int t = threadIdx.x, tx = t % 16, ty = t / 16;
  const index_t steps = (K + gemm_bk - 1) / gemm_bk;
  if (steps == 0) return;
  T ra[4], rb[4], part = T(0);
  gemm_load<T, AKC>(ra, A, lda, M, K, m0, 0, arows);
  if (!AKC && want_asum) part += gemm_part_sum(ra);
  gemm_store<T, AKC, gemm_simt>(As[0], ra);
  if constexpr (Product) {
    gemm_load<T, BKC>(rb, B, ldb, N, K, n0, 0, brows);
    gemm_store<T, BKC, gemm_simt>(Bs[0], rb);
  }
  __syncthreads();

  for (index_t s = 0; s < steps; ++s) {
    const int cur = int(s & 1);
    const bool next = s + 1 < steps;
    if (next) {
      gemm_load<T, AKC>(ra, A, lda, M, K, m0, (s + 1) * gemm_bk, arows);
      if (!AKC && want_asum) part += gemm_part_sum(ra);
      if constexpr (Product) gemm_load<T, BKC>(rb, B, ldb, N, K, n0, (s + 1) * gemm_bk, brows);
    }
    if constexpr (Product) {
#pragma unroll
      for (int k = 0; k < gemm_bk; ++k) {
        T a[4], b[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) a[i] = T(from_stage(As[cur][k][ty + 16 * i]));
#pragma unroll
        for (int j = 0; j < 4; ++j) b[j] = T(from_stage(Bs[cur][k][tx + 16 * j]));
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
      }
    }
    if (next) {
      gemm_store<T, AKC, gemm_simt>(As[cur ^ 1], ra);
      if constexpr (Product) gemm_store<T, BKC, gemm_simt>(Bs[cur ^ 1], rb);
    }
    __syncthreads();  // step s's buffer is free and step s + 1's is complete
  }

  if constexpr (!AKC) {
    if (want_asum) {  // the same for every thread of the block
      __shared__ T red[gemm_threads / gemm_bm][gemm_bm];
      red[t / gemm_bm][t % gemm_bm] = part;
      __syncthreads();
      if (t < gemm_bm) asum += (red[0][t] + red[1][t]) + (red[2][t] + red[3][t]);
    }
  }
}

// The TF32 tensor-core tile (see above): BM × BM outputs (128, or 64 for small weight gradients), k steps of
// bk, operands staged as S with rows ld apart (wmma's ldm: a multiple of 16 bytes; the fragments' rows 32-byte
// aligned). The 8 warps are 2 (rows) × 4 (columns) of BM / 2 × BM / 4, fi × fj accumulators each.
template <int Path, int BM = 128>
struct TcGemmTile {
  static_assert(Path == gemm_tf32, "the wmma tile is TF32's (bf16: gemm_tile_mma.cuh)");
  static_assert(BM == 128 || BM == 64, "the tensor-core tile is 128 x 128 or 64 x 64");
  static constexpr int bm = BM, bn = BM, fi = BM / 32, fj = BM / 64;
  static constexpr int bk = 16, kf = 8;  // k step, wmma k
  static constexpr int ld = bm + 4;
  static constexpr int stage_ld = 16;  // a warp's fp32 staging of one accumulator in the epilogue (in the A and B buffers)
  static_assert(bm * bk % gemm_threads == 0);
};

// The TF32 wmma tile: C(m0 + i, n0 + j) = Σ_{k<K} A(m0 + i, k) · B(k, n0 + j) for i, j < BM, each passed to
// epi(i, j, value) once (rows and columns past M, N too: the epilogue checks). Warp w owns rows BM / 2·(w % 2) ..
// and columns BM / 4·(w / 2) ..; after the last step each warp stores its accumulators one at a time into its own
// staging in the (then free) operand buffers and calls epi from there. want_asum (A not KC): thread t < BM gets
// asum += Σ_k A(m0 + t, k) as gemm_tile does (thread t loads only row t % BM of A). Every thread must call it. Each
// output's products are the same k-ordered chain at either BM (the same bits).
template <bool AKC, bool BKC, int Path, int BM, class Epi>
__device__ void gemm_tile_tc(float& asum, bool want_asum, const float* A, index_t lda, const float* B, index_t ldb,
                             index_t M, index_t N, index_t K, index_t m0, index_t n0, RowList arows, RowList brows,
                             Epi&& epi) {
  if constexpr (wmma_available) {
    namespace wm = nvcuda::wmma;
    using Tile = TcGemmTile<Path, BM>;
    using S = typename GemmStage<float, Path>::type;
    using FragT = tf32_tag;
    constexpr int BN = Tile::bn, BK = Tile::bk, LD = Tile::ld, KF = Tile::kf, SLD = Tile::stage_ld;
    constexpr int FI = Tile::fi, FJ = Tile::fj, WR = BM / 2, WC = BM / 4;  // a warp's accumulators, rows, columns
    constexpr int Q = BM * BK / gemm_threads;
    alignas(128) __shared__ S Ops[2][2][BK][LD];  // [A, B][double buffer]
    S(&As)[2][BK][LD] = Ops[0];
    S(&Bs)[2][BK][LD] = Ops[1];
    static_assert(sizeof(Ops) >= sizeof(float) * 8 * 16 * SLD, "the epilogue's staging must fit in the operand buffers");
    const int t = threadIdx.x, warp = t / 32, lane = t % 32, wm_ = warp % 2, wn_ = warp / 2;
    wm::fragment<wm::accumulator, 16, 16, KF, float> c[FI][FJ];
#pragma unroll
    for (int i = 0; i < FI; ++i)
#pragma unroll
      for (int j = 0; j < FJ; ++j) wm::fill_fragment(c[i][j], 0.0f);
    float part = 0.0f;
    const index_t steps = (K + BK - 1) / BK;
    if (steps > 0) {
      float ra[Q], rb[Q];
      gemm_load<float, AKC, BM, BK>(ra, A, lda, M, K, m0, 0, arows);
      if (!AKC && want_asum) part += gemm_part_sum(ra);
      gemm_store<float, AKC, Path, BM, BK, LD>(As[0], ra);
      gemm_load<float, BKC, BN, BK>(rb, B, ldb, N, K, n0, 0, brows);
      gemm_store<float, BKC, Path, BN, BK, LD>(Bs[0], rb);
      __syncthreads();
      for (index_t s = 0; s < steps; ++s) {
        const int cur = int(s & 1);
        const bool next = s + 1 < steps;
        if (next) {
          gemm_load<float, AKC, BM, BK>(ra, A, lda, M, K, m0, (s + 1) * BK, arows);
          if (!AKC && want_asum) part += gemm_part_sum(ra);
          gemm_load<float, BKC, BN, BK>(rb, B, ldb, N, K, n0, (s + 1) * BK, brows);
        }
#pragma unroll
        for (int kk = 0; kk < BK; kk += KF) {
          wm::fragment<wm::matrix_a, 16, 16, KF, FragT, wm::col_major> af[FI];
          wm::fragment<wm::matrix_b, 16, 16, KF, FragT, wm::row_major> bf[FJ];
#pragma unroll
          for (int i = 0; i < FI; ++i) wm::load_matrix_sync(af[i], &As[cur][kk][wm_ * WR + 16 * i], LD);
#pragma unroll
          for (int j = 0; j < FJ; ++j) wm::load_matrix_sync(bf[j], &Bs[cur][kk][wn_ * WC + 16 * j], LD);
#pragma unroll
          for (int i = 0; i < FI; ++i)
#pragma unroll
            for (int j = 0; j < FJ; ++j) wm::mma_sync(c[i][j], af[i], bf[j], c[i][j]);
        }
        if (next) {
          gemm_store<float, AKC, Path, BM, BK, LD>(As[cur ^ 1], ra);
          gemm_store<float, BKC, Path, BN, BK, LD>(Bs[cur ^ 1], rb);
        }
        __syncthreads();  // step s's buffer is free and step s + 1's is complete
      }
    }
    float* stage = reinterpret_cast<float*>(&Ops[0][0][0][0]) + warp * 16 * SLD;
#pragma unroll
    for (int i = 0; i < FI; ++i)
#pragma unroll
      for (int j = 0; j < FJ; ++j) {
        wm::store_matrix_sync(stage, c[i][j], SLD, wm::mem_row_major);
        __syncwarp();
        for (int e = lane; e < 256; e += 32)
          epi(wm_ * WR + 16 * i + e / 16, wn_ * WC + 16 * j + e % 16, stage[(e / 16) * SLD + e % 16]);
        __syncwarp();
      }
    if constexpr (!AKC) {
      if (want_asum) {  // the same for every thread of the block
        __shared__ float red[gemm_threads / BM][BM];
        red[t / BM][t % BM] = part;
        __syncthreads();
        if (t < BM) {
          if constexpr (BM == 128) asum += red[0][t] + red[1][t];
          else asum += (red[0][t] + red[1][t]) + (red[2][t] + red[3][t]);  // as gemm_tile's
        }
      }
    }
  } else {
    (void)asum, (void)want_asum, (void)A, (void)lda, (void)B, (void)ldb, (void)M, (void)N, (void)K, (void)m0, (void)n0,
        (void)arows, (void)brows, (void)epi;  // never launched (with_gemm_path)
  }
}

}  // namespace dev

}  // namespace mom::cuda

#pragma once
// The grouped GEMMs' tile core on the CUDA cores (grouped_linear.cuh runs it; gemm_tile_mma.cuh has the tensor-core
// tile) and what the tensor-core kernels share: the paths, the staged element types and roundings (the tensor-core
// attention stages with them too), a row list fused into an operand's loads.
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
// with its contiguous index fastest across threads (coalesced); the SIMT tile stores it k-major into shared memory
// (A column-major, B row-major), the tensor-core tile in the orientation it was loaded in (gemm_tile_mma.cuh).
// Out-of-range elements load as 0. The three layouts: forward A = x (KC),
// B = W_g (KC); dx A = dy (KC), B = W_g (not KC); dW A = dyᵀ (not KC), B = x (not KC). Each output goes
// to the kernel's epilogue, epi(row in tile, column in tile, value).
//
// Paths (float only; double is always SIMT):
//   gemm_simt  tile 64 × 64, k steps of 16; 4 × 4 outputs per thread at rows ty + 16a, columns
//              tx + 16b (the 16 lanes of a half-warp read consecutive shared columns), fp32/fp64 FMAs:
//              Precision::FP32 (gemm_tile).
//   gemm_tf32  operands rounded to TF32 (cvt.rna) when staged; mma.sync m16n8k8 on tensor cores, fp32
//              accumulate, k steps of 16: Precision::TF32 (the default, as cuBLAS' FAST_TF32; gemm_tile_mma.cuh).
//   gemm_bf16  operands converted to bf16 (round to nearest even) when staged; mma.sync m16n8k16, fp32
//              accumulate, k steps of 32: Precision::BF16 (gemm_tile_mma.cuh).
// The tensor-core paths take a 128 × 128 tile: the 8 warps tile it as 2 (rows) × 4 (columns) of 64 × 32 (16-byte
// loads, 4 × 4 accumulators of 16 × 8 a warp). The weight gradients (grouped_dw_kernel: one
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

// TF32 needs sm_80; code compiled for older targets has no tensor-core kernels (with_gemm_path and the attention's
// dispatch take the SIMT paths there).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
using tf32_tag = nvcuda::wmma::precision::tf32;  // the TF32 attention's wmma element tag
__device__ __forceinline__ float to_tf32(float v) { return nvcuda::wmma::__float_to_tf32(v); }
#else
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
  // The memory row of operand line `line` into row; false where the list's entry is outside [0, bound) (read as 0).
  __device__ __forceinline__ bool memory_row(index_t line, index_t& row) const {
    row = rows ? index_t(rows[line]) : line;
    return !rows || (row >= 0 && row < bound);
  }
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
      index_t row;  // the memory row (KC: i's, else k's)
      if (rl.memory_row(KC ? gi : gk, row)) r[q] = p[row * ld + (KC ? gk : gi)];
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

}  // namespace dev

}  // namespace mom::cuda

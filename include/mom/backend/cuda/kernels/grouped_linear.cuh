#pragma once
// The grouped GEMMs (grouped_kernels.hpp: linear_forward, linear_backward_dx, linear_backward_dw):
// one tiled kernel core, SIMT or wmma tensor cores (TF32 / bf16) for float.
#include <type_traits>

#include "mom/backend/cuda/kernels/grouped.cuh"
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
// C tile [64 × 64] += A [M × K] · B [K × N] over a 64 × 64 output tile at (m0, n0): 256 threads,
// 16-deep k steps through double-buffered shared memory (one barrier per step; the next step's
// elements are loaded into registers while the current one is multiplied). Element (i, k) of an
// operand (i = row of A or column of B) is at p[i·ld + k] when KC ("k contiguous") and at
// p[k·ld + i] otherwise; each layout is loaded with its contiguous index fastest across threads
// (coalesced) and stored k-major into shared memory (A column-major, B row-major). Out-of-range
// elements load as 0. The three layouts: forward A = x (KC), B = W_g (KC); dx A = dy (KC),
// B = W_g (not KC); dW A = dyᵀ (not KC), B = x (not KC).
//
// Paths (float only; double is always SIMT):
//   gemm_simt  4 × 4 outputs per thread at rows ty + 16a, columns tx + 16b (the 16 lanes of a
//              half-warp read consecutive shared columns), fp32/fp64 FMAs: Precision::FP32.
//   gemm_tf32  operands rounded to TF32 (cvt.rna) when staged; wmma m16n16k8 on tensor cores,
//              fp32 accumulate: Precision::TF32 (the default, as cuBLAS' FAST_TF32).
//   gemm_bf16  operands converted to bf16 (round to nearest even) when staged; wmma m16n16k16,
//              fp32 accumulate: Precision::BF16 (as the backend's bf16 cuBLAS GEMMs).
// On the tensor-core paths the 8 warps tile the 64 × 64 block as 4 (rows) × 2 (32 columns: two
// 16 × 16 accumulators each); the accumulators go through shared memory into the same acc[4][4]
// layout as the SIMT path, so the kernels' epilogues are shared.
inline constexpr int gemm_bm = 64, gemm_bn = 64, gemm_bk = 16, gemm_threads = 256;
enum GemmPath : int { gemm_simt = 0, gemm_tf32 = 1, gemm_bf16 = 2 };

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

// TF32 / bf16 wmma need sm_80; older targets run the tensor-core paths' staged values through
// the SIMT FMAs instead (bf16-rounded; TF32 then unrounded).
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

// The two 16 × 16 fp32 accumulators of a warp on the tensor-core paths (nothing otherwise).
template <bool TensorCores, int Kf>
struct AccFragments {};
template <int Kf>
struct AccFragments<true, Kf> {
  nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, Kf, float> f[2];
};

// An operand's memory rows read through an index list (a gather fused into the tile loads, as the CPU's
// gemm_gathered): memory row r is the table's row rows[r]; rows == nullptr: row r itself. Indices outside
// [0, bound) read as zero (the forward kernel reports them).
struct RowList {
  const token_t* rows = nullptr;
  index_t bound = 0;
};

template <class T, bool KC>
__device__ __forceinline__ void gemm_load(T (&r)[4], const T* p, index_t ld, index_t ni, index_t nk, index_t i0,
                                          index_t k0, RowList rl) {
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int e = int(threadIdx.x) + q * gemm_threads;
    const int i = KC ? e / gemm_bk : e % gemm_bm;
    const int k = KC ? e % gemm_bk : e / gemm_bm;
    const index_t gi = i0 + i, gk = k0 + k;
    r[q] = T(0);
    if (gi < ni && gk < nk) {
      index_t row = KC ? gi : gk;  // the memory row (KC: i, else k)
      if (rl.rows) row = rl.rows[row];
      if (!rl.rows || (row >= 0 && row < rl.bound)) r[q] = p[row * ld + (KC ? gk : gi)];
    }
  }
}
template <class T, bool KC, int Path>
__device__ __forceinline__ void gemm_store(typename GemmStage<T, Path>::type (*s)[GemmStage<T, Path>::ld],
                                           const T (&r)[4]) {
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int e = int(threadIdx.x) + q * gemm_threads;
    const int i = KC ? e / gemm_bk : e % gemm_bm;
    const int k = KC ? e % gemm_bk : e / gemm_bm;
    s[k][i] = stage_value<T, Path>(r[q]);
  }
}

// acc[a][b] += Σ_{k<K} A(m0 + ty + 16a, k) · B(k, n0 + tx + 16b) (ty = thread / 16, tx = thread % 16).
// With Product = false only the A tiles are loaded (the bias gradient alone). With want_asum
// (A not KC only), thread t < 64 also gets asum += Σ_k A(m0 + t, k) in full precision, the fused
// bias gradient: in that layout thread t loads only elements of row t % 64, so it sums them from
// its registers and the 4 partial sums of a row meet in shared memory (deterministic).
// Every thread of the block must call it (barriers).
template <class T, bool AKC, bool BKC, bool Product, int Path>
__device__ void gemm_tile(T (&acc)[4][4], T& asum, bool want_asum, const T* A, index_t lda, const T* B, index_t ldb,
                          index_t M, index_t N, index_t K, index_t m0, index_t n0, RowList arows = {},
                          RowList brows = {}) {
  using S = typename GemmStage<T, Path>::type;
  constexpr int ld = GemmStage<T, Path>::ld;
  alignas(32) __shared__ S As[2][gemm_bk][ld];
  alignas(32) __shared__ S Bs[2][gemm_bk][ld];
  const int t = threadIdx.x, tx = t % 16, ty = t / 16;
  const index_t steps = (K + gemm_bk - 1) / gemm_bk;
  if (steps == 0) return;
  T ra[4], rb[4], part = T(0);
  gemm_load<T, AKC>(ra, A, lda, M, K, m0, 0, arows);
  if (!AKC && want_asum) part += (ra[0] + ra[1]) + (ra[2] + ra[3]);
  gemm_store<T, AKC, Path>(As[0], ra);
  if constexpr (Product) {
    gemm_load<T, BKC>(rb, B, ldb, N, K, n0, 0, brows);
    gemm_store<T, BKC, Path>(Bs[0], rb);
  }
  __syncthreads();

  constexpr bool tensor_cores = Path != gemm_simt && wmma_available;
  [[maybe_unused]] const int warp = t / 32, wm = warp % 4, wn = warp / 4;
  constexpr int kf = Path == gemm_bf16 ? 16 : 8;  // wmma k of the path
  using FragT = std::conditional_t<Path == gemm_bf16, bf16_t, tf32_tag>;
  [[maybe_unused]] AccFragments<tensor_cores, kf> cf;
  if constexpr (tensor_cores) {
    nvcuda::wmma::fill_fragment(cf.f[0], 0.0f);
    nvcuda::wmma::fill_fragment(cf.f[1], 0.0f);
  }

  for (index_t s = 0; s < steps; ++s) {
    const int cur = int(s & 1);
    const bool next = s + 1 < steps;
    if (next) {
      gemm_load<T, AKC>(ra, A, lda, M, K, m0, (s + 1) * gemm_bk, arows);
      if (!AKC && want_asum) part += (ra[0] + ra[1]) + (ra[2] + ra[3]);
      if constexpr (Product) gemm_load<T, BKC>(rb, B, ldb, N, K, n0, (s + 1) * gemm_bk, brows);
    }
    if constexpr (Product && tensor_cores) {
#pragma unroll
      for (int kk = 0; kk < gemm_bk; kk += kf) {
        nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, kf, FragT, nvcuda::wmma::col_major> af;
        nvcuda::wmma::load_matrix_sync(af, &As[cur][kk][wm * 16], ld);
#pragma unroll
        for (int f = 0; f < 2; ++f) {
          nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, kf, FragT, nvcuda::wmma::row_major> bf;
          nvcuda::wmma::load_matrix_sync(bf, &Bs[cur][kk][wn * 32 + f * 16], ld);
          nvcuda::wmma::mma_sync(cf.f[f], af, bf, cf.f[f]);
        }
      }
    } else if constexpr (Product) {
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
      gemm_store<T, AKC, Path>(As[cur ^ 1], ra);
      if constexpr (Product) gemm_store<T, BKC, Path>(Bs[cur ^ 1], rb);
    }
    __syncthreads();  // step s's buffer is free and step s + 1's is complete
  }

  if constexpr (Product && tensor_cores) {  // accumulators -> the SIMT register layout
    alignas(32) __shared__ float Cs[gemm_bm][gemm_bn + 4];
#pragma unroll
    for (int f = 0; f < 2; ++f)
      nvcuda::wmma::store_matrix_sync(&Cs[wm * 16][wn * 32 + f * 16], cf.f[f], gemm_bn + 4,
                                      nvcuda::wmma::mem_row_major);
    __syncthreads();
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][j] += Cs[ty + 16 * i][tx + 16 * j];
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

// Runs f(std::integral_constant<int, path>) with the GEMM path of the backend's precision.
template <class T, class F>
void with_gemm_path(const Context& ctx, F&& f) {
  if constexpr (std::is_same_v<T, float>) {
    if (ctx.precision == Precision::TF32) return f(std::integral_constant<int, gemm_tf32>{});
    if (ctx.precision == Precision::BF16) return f(std::integral_constant<int, gemm_bf16>{});
  }
  f(std::integral_constant<int, gemm_simt>{});
}

// Row-grouped GEMM (linear forward, dx): blockIdx.x enumerates every group's 64-row tiles
// (find_row_tile), blockIdx.y the 64-column tiles of C. C rows are group g's rows of c.
// Forward (Accumulate = false): c = a · W_gᵀ + bias_g, W_g [N × K] (KC). dx (Accumulate = true):
// c += a · W_g, W_g [K × N] (not KC). ldw is W_g's row stride. With a_idx, c's row r reads a's row a_idx[r]
// (a the table: the gather fused into the loads); the groups index c's rows.
template <class T, bool BKC, bool Accumulate, int Path>
__global__ void grouped_rows_gemm_kernel(MatrixView<T> c, MatrixView<const T> a, const token_t* a_idx,
                                         PerGroup<const T> w, index_t ldw, PerGroup<const T> bias, RowGroups g,
                                         int* error) {
  check_offsets(g, c.rows, error);
  int gi = 0;
  index_t tile = 0;
  if (!find_row_tile(g, c.rows, gemm_bm, blockIdx.x, &gi, &tile)) return;
  const RowRange rr = group_rows(g, gi, c.rows);
  const index_t M = rr.hi - rr.lo, N = c.cols, K = a.cols;
  const index_t m0 = tile * gemm_bm, n0 = index_t(blockIdx.y) * gemm_bn;
  const RowList arows = a_idx ? RowList{a_idx + rr.lo, a.rows} : RowList{};
  if (a_idx && blockIdx.y == 0 && threadIdx.x < gemm_bm && m0 + threadIdx.x < M) {
    const index_t r = rr.lo + m0 + threadIdx.x;
    if (a_idx[r] < 0 || a_idx[r] >= a.rows) report(error, DeviceError::gather_index, r, a_idx[r], a.rows);
  }
  T acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = T(0);
  T unused = T(0);
  gemm_tile<T, true, BKC, true, Path>(acc, unused, false, a_idx ? a.data : a.data + rr.lo * a.ld, a.ld,
                                      w.base + w.at[gi], ldw, M, N, K, m0, n0, arows);
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const T* b = bias.base ? bias.base + bias.at[gi] : nullptr;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const index_t m = m0 + ty + 16 * i;
    if (m >= M) continue;
    T* row = c.data + (rr.lo + m) * c.ld;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const index_t n = n0 + tx + 16 * j;
      if (n >= N) continue;
      if constexpr (Accumulate) row[n] += acc[i][j];
      else row[n] = acc[i][j] + (b ? b[n] : T(0));
    }
  }
}

// Per-group reduction GEMM (dW_g += dy_gᵀ x_g, db_g += Σ dy_g): blockIdx.x enumerates the output
// tiles of dW ([M = dy.cols] × [N = x.cols], n_tiles columns of tiles), blockIdx.y is the group;
// each block loops over its group's rows (the k dimension, a device-side length). The blocks of
// column tile 0 also sum dy's columns for db (each db element has exactly one writer: no atomics,
// deterministic). With dw empty the launch has one column tile and only db is computed.
// With x_idx, packed row r is x's row x_idx[r] (x the table).
template <class T, bool WithDw, int Path>
__global__ void grouped_dw_kernel(PerGroup<T> dw, PerGroup<T> db, MatrixView<const T> dy, MatrixView<const T> x,
                                  const token_t* x_idx, RowGroups g, index_t n_tiles, int* error) {
  check_offsets(g, dy.rows, error);
  const int gi = int(blockIdx.y);
  const RowRange rr = group_rows(g, gi, dy.rows);
  if (rr.hi == rr.lo) return;
  const index_t M = dy.cols, N = x.cols, K = rr.hi - rr.lo;
  const index_t m0 = (index_t(blockIdx.x) / n_tiles) * gemm_bm, n0 = (index_t(blockIdx.x) % n_tiles) * gemm_bn;
  const bool want_db = db.base != nullptr && n0 == 0;
  T acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = T(0);
  T asum = T(0);
  gemm_tile<T, false, false, WithDw, Path>(acc, asum, want_db, dy.data + rr.lo * dy.ld, dy.ld,
                                           x_idx ? x.data : x.data + rr.lo * x.ld, x.ld, M, N, K, m0, n0, RowList{},
                                           x_idx ? RowList{x_idx + rr.lo, x.rows} : RowList{});
  const int t = threadIdx.x, tx = t % 16, ty = t / 16;
  if constexpr (WithDw) {
    T* d = dw.base + dw.at[gi];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const index_t m = m0 + ty + 16 * i;
      if (m >= M) continue;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const index_t n = n0 + tx + 16 * j;
        if (n < N) d[m * N + n] += acc[i][j];
      }
    }
  }
  if (want_db && t < gemm_bm && m0 + t < M) db.base[db.at[gi] + m0 + t] += asum;
}

}  // namespace dev

// ---- launchers --------------------------------------------------------------------------------

template <class T>
void GroupedKernels<T>::linear_forward(const Context& ctx, M y, CM x, const token_t* idx, CPG w, CPG b, RowGroups g) {
  if (g.count == 0 || y.rows == 0 || y.cols == 0) return;
  const dim3 grid(dev::row_tile_slots(y.rows, g.count, dev::gemm_bm), dev::blocks_exact(y.cols, dev::gemm_bn));
  dev::with_gemm_path<T>(ctx, [&](auto path) {
    dev::launch("grouped_linear_forward", ctx, grid, dev::gemm_threads,
                dev::grouped_rows_gemm_kernel<T, true, false, decltype(path)::value>, y, x, idx, w, x.cols, b, g,
                ctx.error);
  });
}
template <class T>
void GroupedKernels<T>::linear_backward_dx(const Context& ctx, M dx, CM dy, CPG w, RowGroups g, bool add) {
  if (g.count == 0 || dy.rows == 0 || dx.cols == 0) return;
  const dim3 grid(dev::row_tile_slots(dy.rows, g.count, dev::gemm_bm), dev::blocks_exact(dx.cols, dev::gemm_bn));
  dev::with_gemm_path<T>(ctx, [&](auto path) {
    // Accumulate = false with no bias stores the product: the overwrite.
    if (add)
      dev::launch("grouped_linear_backward", ctx, grid, dev::gemm_threads,
                  dev::grouped_rows_gemm_kernel<T, false, true, decltype(path)::value>, dx, dy, nullptr, w, dx.cols,
                  CPG{}, g, ctx.error);
    else
      dev::launch("grouped_linear_backward", ctx, grid, dev::gemm_threads,
                  dev::grouped_rows_gemm_kernel<T, false, false, decltype(path)::value>, dx, dy, nullptr, w, dx.cols,
                  CPG{}, g, ctx.error);
  });
}
template <class T>
void GroupedKernels<T>::linear_backward_dw(const Context& ctx, PG dw, PG db, CM dy, CM x, const token_t* idx,
                                           RowGroups g) {
  if (g.count == 0 || dy.cols == 0 || (dw.empty() && db.empty())) return;
  const index_t m_tiles = (dy.cols + dev::gemm_bm - 1) / dev::gemm_bm;
  if (!dw.empty()) {
    if (x.cols == 0) {  // dW has no columns: only db is left
      if (db.empty()) return;
    } else {
      const index_t n_tiles = (x.cols + dev::gemm_bn - 1) / dev::gemm_bn;
      dev::with_gemm_path<T>(ctx, [&](auto path) {
        dev::launch("grouped_linear_backward", ctx, dim3(unsigned(m_tiles * n_tiles), unsigned(g.count)),
                    dev::gemm_threads, dev::grouped_dw_kernel<T, true, decltype(path)::value>, dw, db, dy, x, idx, g,
                    n_tiles, ctx.error);
      });
      return;
    }
  }
  dev::launch("grouped_linear_backward", ctx, dim3(unsigned(m_tiles), unsigned(g.count)), dev::gemm_threads,
              dev::grouped_dw_kernel<T, false, dev::gemm_simt>, dw, db, dy, x, idx, g, index_t(1), ctx.error);
}

}  // namespace mom::cuda

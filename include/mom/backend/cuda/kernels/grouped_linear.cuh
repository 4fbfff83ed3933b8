#pragma once
// The grouped GEMMs (grouped_kernels.hpp: linear_forward, linear_backward_dx, linear_backward_dw): one tiled kernel
// per product on the tile cores of gemm_tile.cuh (SIMT) and gemm_tile_mma.cuh (TF32 / bf16 on mma.sync).
#include <type_traits>

#include "mom/backend/cuda/kernels/gemm_tile.cuh"
#include "mom/backend/cuda/kernels/gemm_tile_mma.cuh"
#include "mom/backend/cuda/kernels/grouped.cuh"

namespace mom::cuda {

namespace dev {

// One output tile of the path: the tile core's results through epi(row in tile, column in tile, value) (with
// Product = false, only asum: the SIMT core). BM: the tensor-core tile's size (the SIMT tile is 64 × 64).
template <class T, bool AKC, bool BKC, bool Product, int Path, int BM = gemm_tile_m<Path>, class Epi>
__device__ void gemm_run(T& asum, bool want_asum, const T* A, index_t lda, const T* B, index_t ldb, index_t M, index_t N,
                         index_t K, index_t m0, index_t n0, RowList arows, RowList brows, Epi&& epi) {
  if constexpr (Path == gemm_simt || !Product) {
    T acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][j] = T(0);
    gemm_tile<T, AKC, BKC, Product>(acc, asum, want_asum, A, lda, B, ldb, M, N, K, m0, n0, arows, brows);
    if constexpr (Product) {
      const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) epi(ty + 16 * i, tx + 16 * j, acc[i][j]);
    }
  } else {
    gemm_tile_mma<AKC, BKC, Path, BM>(asum, want_asum, A, lda, B, ldb, M, N, K, m0, n0, arows, brows, epi);
  }
}

// Row-grouped GEMM (linear forward, dx): blockIdx.x enumerates every group's row tiles
// (find_row_tile; gemm_tile_m<Path> rows), blockIdx.y the column tiles of C (gemm_tile_n<Path>). C rows are group g's rows of c.
// Forward (Accumulate = false): c = a · W_gᵀ + bias_g, W_g [N × K] (KC). dx (Accumulate = true):
// c += a · W_g, W_g [K × N] (not KC). ldw is W_g's row stride. With a_idx, c's row r reads a's row a_idx[r]
// (a the table: the gather fused into the loads); the groups index c's rows.
template <class T, bool BKC, bool Accumulate, int Path>
__global__ void grouped_rows_gemm_kernel(MatrixView<T> c, MatrixView<const T> a, const token_t* a_idx,
                                         PerGroup<const T> w, index_t ldw, PerGroup<const T> bias, RowGroups g,
                                         int* error) {
  constexpr int BM = gemm_tile_m<Path>, BN = gemm_tile_n<Path>;
  check_offsets(g, c.rows, error);
  int gi = 0;
  index_t tile = 0;
  if (!find_row_tile(g, c.rows, BM, blockIdx.x, &gi, &tile)) return;
  const RowRange rr = group_rows(g, gi, c.rows);
  const index_t M = rr.hi - rr.lo, N = c.cols, K = a.cols;
  const index_t m0 = tile * BM, n0 = index_t(blockIdx.y) * BN;
  const RowList arows = a_idx ? RowList{a_idx + rr.lo, a.rows} : RowList{};
  if (a_idx && blockIdx.y == 0 && threadIdx.x < BM && m0 + threadIdx.x < M) {
    const index_t r = rr.lo + m0 + threadIdx.x;
    if (a_idx[r] < 0 || a_idx[r] >= a.rows) report(error, DeviceError::gather_index, r, a_idx[r], a.rows);
  }
  const T* b = bias.base ? bias.base + bias.at[gi] : nullptr;
  T unused = T(0);
  gemm_run<T, true, BKC, true, Path>(unused, false, a_idx ? a.data : a.data + rr.lo * a.ld, a.ld, w.base + w.at[gi],
                                     ldw, M, N, K, m0, n0, arows, RowList{}, [&](int i, int j, T v) {
                                       const index_t m = m0 + i, n = n0 + j;
                                       if (m >= M || n >= N) return;
                                       T* row = c.data + (rr.lo + m) * c.ld;
                                       if constexpr (Accumulate) row[n] += v;
                                       else row[n] = v + (b ? b[n] : T(0));
                                     });
}

// Slice s of S of a group's rows for a split weight gradient: ceil(rows / S) rows rounded up to whole k steps, so the
// last slices can be shorter or empty.
__device__ __forceinline__ RowRange dw_slice(RowRange rr, int s, int S) {
  const index_t chunk = ((rr.hi - rr.lo + S - 1) / S + gemm_bk - 1) / gemm_bk * gemm_bk;
  const index_t lo = min(rr.hi, rr.lo + s * chunk);
  return {lo, min(rr.hi, lo + chunk)};
}

// Per-group reduction GEMM (dW_g += dy_gᵀ x_g, db_g += Σ dy_g): blockIdx.x enumerates the output
// tiles of dW ([M = dy.cols] × [N = x.cols], n_tiles columns of tiles), blockIdx.y is the group;
// each block loops over its group's rows (the k dimension, a device-side length). The blocks of
// column tile 0 also sum dy's columns for db (each db element has exactly one writer: no atomics,
// deterministic). With dw empty the launch has one column tile and only db is computed.
// With x_idx, packed row r is x's row x_idx[r] (x the table). BM: the output tile's size (SIMT: 64).
// Split (split-K, kernels.hpp dw_splits): blockIdx.z is the slice s of gridDim.z = S (dw_slice) and the block stores
// its slice's sums into part (dW_g's at (s·count + g)·M·N, db_g's after all S·count of those at (s·count + g)·M);
// grouped_dw_reduce_kernel adds them up.
template <class T, bool WithDw, int Path, int BM = gemm_tile_m<Path>, bool Split = false>
__global__ void grouped_dw_kernel(PerGroup<T> dw, PerGroup<T> db, MatrixView<const T> dy, MatrixView<const T> x,
                                  const token_t* x_idx, RowGroups g, index_t n_tiles, int* error, T* part) {
  static_assert(Path != gemm_simt || BM == gemm_bm, "the SIMT tile is 64 x 64");
  static_assert(!Split || WithDw, "a split launch computes dW");
  constexpr int BN = BM;
  check_offsets(g, dy.rows, error);
  const int gi = int(blockIdx.y);
  RowRange rr = group_rows(g, gi, dy.rows);
  if constexpr (Split) rr = dw_slice(rr, int(blockIdx.z), int(gridDim.z));
  if (rr.hi == rr.lo) return;
  const index_t M = dy.cols, N = x.cols, K = rr.hi - rr.lo;
  const index_t m0 = (index_t(blockIdx.x) / n_tiles) * BM, n0 = (index_t(blockIdx.x) % n_tiles) * BN;
  const bool want_db = db.base != nullptr && n0 == 0;
  const index_t slot = index_t(blockIdx.z) * g.count + gi;  // Split: this slice's partials of group gi
  T asum = T(0);
  T* d = Split ? part + slot * M * N : WithDw ? dw.base + dw.at[gi] : nullptr;
  gemm_run<T, false, false, WithDw, Path, BM>(asum, want_db, dy.data + rr.lo * dy.ld, dy.ld,
                                          x_idx ? x.data : x.data + rr.lo * x.ld, x.ld, M, N, K, m0, n0, RowList{},
                                          x_idx ? RowList{x_idx + rr.lo, x.rows} : RowList{}, [&](int i, int j, T v) {
                                            const index_t m = m0 + i, n = n0 + j;
                                            if (m >= M || n >= N) return;
                                            if constexpr (Split) d[m * N + n] = v;
                                            else d[m * N + n] += v;
                                          });
  const int t = threadIdx.x;
  if (!want_db || t >= BM || m0 + t >= M) return;
  if constexpr (Split) part[index_t(gridDim.z) * g.count * M * N + slot * M + m0 + t] = asum;
  else db.base[db.at[gi] + m0 + t] += asum;
}

// The split weight gradients' second pass: dW_g += Σ_s part_s and db_g += Σ_s part_s over the S slices in order,
// skipping the slices that had no rows (their blocks wrote nothing). One thread per element of dW_g then db_g
// (blockIdx.y the group); groups without rows are left as they are, as the unsplit kernel leaves them.
template <class T>
__global__ void grouped_dw_reduce_kernel(PerGroup<T> dw, PerGroup<T> db, const T* part, RowGroups g, index_t rows,
                                         index_t M, index_t N, int S) {
  const int gi = int(blockIdx.y);
  const index_t e = index_t(blockIdx.x) * blockDim.x + threadIdx.x, mn = M * N;
  const bool is_db = e >= mn;
  if (e >= mn + (db.base ? M : 0)) return;
  const RowRange rr = group_rows(g, gi, rows);
  if (rr.hi == rr.lo) return;
  const T* p = is_db ? part + index_t(S) * g.count * mn + index_t(gi) * M + (e - mn) : part + index_t(gi) * mn + e;
  const index_t stride = is_db ? index_t(g.count) * M : index_t(g.count) * mn;
  T sum = T(0);
  for (int s = 0; s < S; ++s) {
    const RowRange sl = dw_slice(rr, s, S);
    if (sl.hi > sl.lo) sum += p[s * stride];
  }
  if (is_db) db.base[db.at[gi] + (e - mn)] += sum;
  else dw.base[dw.at[gi] + e] += sum;
}

// Runs f(std::integral_constant<int, path>) with the GEMM path of the backend's precision: the tensor-core paths
// where their kernels were compiled for sm_80 or later (checked once), else the SIMT path.
template <class T, class F>
void with_gemm_path(const Context& ctx, F&& f) {
  if constexpr (std::is_same_v<T, float>) {
    static constexpr auto probe = grouped_rows_gemm_kernel<float, true, false, gemm_bf16>;
    if (ctx.precision != Precision::FP32 && smem_fits<probe>(ctx, 0, 80)) {
      if (ctx.precision == Precision::TF32) return f(std::integral_constant<int, gemm_tf32>{});
      return f(std::integral_constant<int, gemm_bf16>{});
    }
  }
  f(std::integral_constant<int, gemm_simt>{});
}

}  // namespace dev

// ---- launchers --------------------------------------------------------------------------------

template <class T>
void GroupedKernels<T>::linear_forward(const Context& ctx, M y, CM x, const token_t* idx, CPG w, CPG b, RowGroups g) {
  if (g.count == 0 || y.rows == 0 || y.cols == 0) return;
  dev::with_gemm_path<T>(ctx, [&](auto path) {
    constexpr int P = decltype(path)::value;
    const dim3 grid(dev::row_tile_slots(y.rows, g.count, dev::gemm_tile_m<P>), dev::blocks_exact(y.cols, dev::gemm_tile_n<P>));
    dev::launch("grouped_linear_forward", ctx, grid, dev::gemm_threads,
                dev::grouped_rows_gemm_kernel<T, true, false, decltype(path)::value>, y, x, idx, w, x.cols, b, g,
                ctx.error);
  });
}
template <class T>
void GroupedKernels<T>::linear_backward_dx(const Context& ctx, M dx, CM dy, CPG w, RowGroups g, bool add) {
  if (g.count == 0 || dy.rows == 0 || dx.cols == 0) return;
  dev::with_gemm_path<T>(ctx, [&](auto path) {
    constexpr int P = decltype(path)::value;
    const dim3 grid(dev::row_tile_slots(dy.rows, g.count, dev::gemm_tile_m<P>), dev::blocks_exact(dx.cols, dev::gemm_tile_n<P>));
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
  if (!dw.empty()) {
    if (x.cols == 0) {  // dW has no columns: only db is left
      if (db.empty()) return;
    } else {
      dev::with_gemm_path<T>(ctx, [&](auto path) {
        constexpr int P = decltype(path)::value;
        const auto run = [&](auto bm) {
          constexpr int BM = decltype(bm)::value;
          const index_t m_tiles = (dy.cols + BM - 1) / BM, n_tiles = (x.cols + BM - 1) / BM;
          const int S = dw_splits(m_tiles * n_tiles * g.count, dy.rows, g.count, dy.cols, x.cols, sizeof(T),
                                  ctx.workspace_bytes);
          const dim3 grid(unsigned(m_tiles * n_tiles), unsigned(g.count), unsigned(S));
          if (S == 1) {
            dev::launch("grouped_linear_backward", ctx, grid, dev::gemm_threads, dev::grouped_dw_kernel<T, true, P, BM>,
                        dw, db, dy, x, idx, g, n_tiles, ctx.error, nullptr);
            return;
          }
          T* part = static_cast<T*>(ctx.workspace);
          dev::launch("grouped_linear_backward", ctx, grid, dev::gemm_threads,
                      dev::grouped_dw_kernel<T, true, P, BM, true>, dw, db, dy, x, idx, g, n_tiles, ctx.error, part);
          const index_t elems = dy.cols * x.cols + (db.empty() ? 0 : dy.cols);
          dev::launch("grouped_linear_backward", ctx, dim3(dev::blocks_exact(elems, 256), unsigned(g.count)), 256,
                      dev::grouped_dw_reduce_kernel<T>, dw, db, static_cast<const T*>(part), g, dy.rows, dy.cols,
                      x.cols, S);
        };
        constexpr int wide = dev::gemm_tile_m<P>;
        const index_t wide_blocks = ((dy.cols + wide - 1) / wide) * ((x.cols + wide - 1) / wide) * g.count;
        if (P == dev::gemm_simt || wide_blocks >= dw_wide_tile_blocks) run(std::integral_constant<int, wide>{});
        else run(std::integral_constant<int, 64>{});
      });
      return;
    }
  }
  const index_t m_tiles = (dy.cols + dev::gemm_bm - 1) / dev::gemm_bm;
  dev::launch("grouped_linear_backward", ctx, dim3(unsigned(m_tiles), unsigned(g.count)), dev::gemm_threads,
              dev::grouped_dw_kernel<T, false, dev::gemm_simt>, dw, db, dy, x, idx, g, index_t(1), ctx.error, nullptr);
}

}  // namespace mom::cuda

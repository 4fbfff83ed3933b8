#pragma once
// Host-side declarations of the CUDA launchers for the grouped ops (core/groups.hpp), the
// counterparts of backend/cpu/grouped.hpp. Plain C++; the definitions live in kernels/grouped.cuh,
// kernels/grouped_linear.cuh and kernels/grouped_rows.cuh, compiled into mom::cuda by mom_cuda.cu.
//
// The row groups' offsets stay in device memory: every kernel reads them itself (no copy to the
// host, no synchronisation) and its grid is sized from host-known bounds only (the packed matrix's
// row count, the number of groups); blocks or threads beyond the rows actually grouped exit early.
// The offsets are validated on the device (block 0 of every launch): a value outside [0, rows] or
// a decrease is reported as DeviceError::group_offsets at the next sync; the kernels clamp the
// offsets into [0, rows] (and each group's end to at least its start), so bad offsets never make
// them read or write outside the matrices. As for Kernels<T>: no shape checks here (cuda::Backend
// does them), every launcher only enqueues on ctx.stream. PerGroup tables travel as kernel
// parameters by value (2 KB each; two in some kernels: CUDA 12.1+ for > 4 KB of parameters).
#include "mom/backend/cuda/kernels.hpp"
#include "mom/core/groups.hpp"

namespace mom::cuda {

template <class T>
struct GroupedKernels {
  using M = MatrixView<T>;
  using CM = MatrixView<const T>;
  using PG = PerGroup<T>;
  using CPG = PerGroup<const T>;

  // Grouped GEMMs (one tiled kernel core, kernels/grouped_linear.cuh). W_g is [y.cols × x.cols], dense.
  // Float follows ctx.precision: TF32 / BF16 on tensor cores (wmma), FP32 on the CUDA cores.
  // y[r] = W_g x[r] + b_g (b may be empty): grid (row-tile slots: ceil(rows / 64) + count) ×
  // (column tiles); each block finds its (group, row tile) from the device offsets.
  // With idx (not null), y[r] = W_g x[idx[r]] + b_g: x is the table, the gather fused into the tile loads.
  static void linear_forward(const Context& ctx, M y, CM x, const token_t* idx, CPG w, CPG b, RowGroups g);
  // dx[r] += W_gᵀ dy[r] (add), or = (the groups' rows only); same geometry as linear_forward.
  static void linear_backward_dx(const Context& ctx, M dx, CM dy, CPG w, RowGroups g, bool add);
  // dW_g += Σ_r dy[r]ᵀ x[r], db_g += Σ_r dy[r] over the rows r of group g (either may be empty):
  // grid (output tiles) × groups, each block looping over its group's rows. With idx, x[r] is x's row idx[r].
  static void linear_backward_dw(const Context& ctx, PG dw, PG db, CM dy, CM x, const token_t* idx, RowGroups g);

  // LayerNorm with group g's gamma_g / beta_g on its rows (warp per row; binary search for g). With idx, packed row r
  // normalises x's row idx[r] (gathered rows read in place); without, x's row r.
  static void layernorm_forward(const Context& ctx, M out, T* mean, T* rstd, CM x, const token_t* idx, CPG gamma,
                                CPG beta, RowGroups g, T eps);
  // dx may be empty (add: dx += the gradient; else dx = it); dgamma / dbeta may each be empty (column sums per group).
  static void layernorm_backward(const Context& ctx, M dx, PG dgamma, PG dbeta, CM dout, CM x, const token_t* idx,
                                 const T* mean, const T* rstd, CPG gamma, RowGroups g, bool add);

  // The plain row ops restricted to the rows [offsets[0], offsets[count]).
  static void gelu_forward(const Context& ctx, M out, CM x, RowGroups g);
  static void gelu_backward(const Context& ctx, M dx, CM x, CM dout, RowGroups g, bool add);
  static void zero_rows(const Context& ctx, M m, RowGroups g);
  // out = alpha·a + beta·b (add_forward, axpy); out may alias a or b.
  static void axpby(const Context& ctx, M out, T alpha, CM a, T beta, CM b, RowGroups g);
  static void gather_rows(const Context& ctx, M out, CM in, const token_t* idx, RowGroups g);
  // out[r] = in_g[idx[r]], in_g = [in_rows × out.cols] dense at in[g].
  static void gather_rows(const Context& ctx, M out, CPG in, index_t in_rows, const token_t* idx, RowGroups g);
  static void scatter_add_rows(const Context& ctx, M out, CM in, const token_t* idx, const T* weights, RowGroups g);
  // out_g[idx[r]] += in[r], out_g = [out_rows × in.cols] dense at out[g].
  static void scatter_add_rows(const Context& ctx, PG out, index_t out_rows, CM in, const token_t* idx, RowGroups g);
  static void scatter_add_rows_backward(const Context& ctx, M din, T* dweights, CM dout, CM in, const token_t* idx,
                                        const T* weights, RowGroups g, bool add);
};

extern template struct GroupedKernels<float>;
extern template struct GroupedKernels<double>;

}  // namespace mom::cuda

#pragma once
// The grouped row ops (grouped_kernels.hpp): LayerNorm with per-group parameters, GELU, axpby,
// zero_rows, gather / scatter over the grouped rows.
#include "mom/backend/cuda/kernels/grouped.cuh"
#include "mom/backend/cuda/kernels/activation.cuh"

namespace mom::cuda {

namespace dev {

// ---- LayerNorm: one warp per grouped row ----------------------------------------------------------

// Row r of a grouped LayerNorm's input: x's row idx[r] (gathered rows read in place; idx == nullptr: x's own row
// r), or nullptr after reporting an index outside x (the row is skipped).
template <class T>
__device__ const T* norm_row(MatrixView<const T> x, const token_t* idx, index_t r, bool report_it, int* error) {
  if (!idx) return x.data + r * x.ld;
  const token_t k = idx[r];
  if (k < 0 || k >= x.rows) {
    if (report_it) report(error, DeviceError::gather_index, r, k, x.rows);
    return nullptr;
  }
  return x.data + index_t(k) * x.ld;
}

template <class T>
__global__ void grouped_layernorm_forward_kernel(MatrixView<T> out, T* mean, T* rstd, MatrixView<const T> x,
                                                 const token_t* idx, PerGroup<const T> gamma, PerGroup<const T> beta,
                                                 RowGroups g, T eps, int* error) {
  check_offsets(g, out.rows, error);
  const RowRange all = grouped_rows(g, out.rows);
  const index_t r = all.lo + index_t(blockIdx.x) * warps_per_block + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= all.hi) return;
  const int gi = group_of(g, r);
  const T* ga = gamma.base + gamma.at[gi];
  const T* be = beta.base + beta.at[gi];
  const index_t d = x.cols;
  const T* xr = norm_row(x, idx, r, lane == 0, error);
  if (!xr) return;
  T s = T(0);
  for (index_t c = lane; c < d; c += 32) s += xr[c];
  const T mu = warp_sum(s) / T(d);
  T v = T(0);  // two-pass variance, as the CPU op
  for (index_t c = lane; c < d; c += 32) {
    const T dx = xr[c] - mu;
    v += dx * dx;
  }
  const T rs = T(1) / sqrt_(warp_sum(v) / T(d) + eps);
  T* o = out.data + r * out.ld;
  for (index_t c = lane; c < d; c += 32) o[c] = (xr[c] - mu) * rs * ga[c] + be[c];
  if (lane == 0) {
    mean[r] = mu;
    rstd[r] = rs;
  }
}

template <class T>
__global__ void grouped_layernorm_backward_dx_kernel(MatrixView<T> dx, MatrixView<const T> dout, MatrixView<const T> x,
                                                     const token_t* idx, const T* mean, const T* rstd,
                                                     PerGroup<const T> gamma, RowGroups g, bool add, int* error) {
  check_offsets(g, dout.rows, error);
  const RowRange all = grouped_rows(g, dout.rows);
  const index_t r = all.lo + index_t(blockIdx.x) * warps_per_block + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= all.hi) return;
  const T* ga = gamma.base + gamma.at[group_of(g, r)];
  const index_t d = x.cols;
  const T* xr = norm_row(x, idx, r, lane == 0, error);
  if (!xr) return;
  const T* gr = dout.data + r * dout.ld;
  const T mu = mean[r], rs = rstd[r];
  T a = T(0), b = T(0);
  for (index_t c = lane; c < d; c += 32) {
    const T dxhat = gr[c] * ga[c];
    a += dxhat;
    b += dxhat * (xr[c] - mu);
  }
  const T mean_dxhat = warp_sum(a) / T(d);
  const T mean_dxhat_xhat = warp_sum(b) * rs / T(d);
  T* o = dx.data + r * dx.ld;
  for (index_t c = lane; c < d; c += 32) {
    const T v = rs * (gr[c] * ga[c] - mean_dxhat - (xr[c] - mu) * rs * mean_dxhat_xhat);
    o[c] = add ? o[c] + v : v;
  }
}

// dgamma_g += Σ dout∘xhat, dbeta_g += Σ dout over group g's rows: blockIdx.x enumerates every
// group's chunks of column_chunk rows (find_row_tile), blockIdx.y the columns (thread = column);
// chunks of one group meet in atomics.
template <class T>
__global__ void grouped_layernorm_backward_params_kernel(PerGroup<T> dgamma, PerGroup<T> dbeta,
                                                         MatrixView<const T> dout, MatrixView<const T> x,
                                                         const token_t* idx, const T* mean, const T* rstd, RowGroups g,
                                                         int* error) {
  check_offsets(g, dout.rows, error);
  int gi = 0;
  index_t chunk = 0;
  if (!find_row_tile(g, dout.rows, column_chunk, blockIdx.x, &gi, &chunk)) return;
  const index_t c = index_t(blockIdx.y) * blockDim.x + threadIdx.x;
  if (c >= x.cols) return;
  const RowRange rr = group_rows(g, gi, dout.rows);
  const index_t r0 = rr.lo + chunk * column_chunk, r1 = min(rr.hi, r0 + column_chunk);
  T pg = T(0), pb = T(0);
  for (index_t r = r0; r < r1; ++r) {
    const T* xr = norm_row(x, idx, r, c == 0, error);
    if (!xr) continue;
    const T gv = dout.data[r * dout.ld + c];
    pg += gv * (xr[c] - mean[r]) * rstd[r];
    pb += gv;
  }
  if (dgamma.base) atomicAdd(dgamma.base + dgamma.at[gi] + c, pg);
  if (dbeta.base) atomicAdd(dbeta.base + dbeta.at[gi] + c, pb);
}

// ---- row ops over the grouped rows -------------------------------------------------------------
// Flat grid-stride loops over the elements of rows [offsets[0], offsets[count]) (grid from the host
// bound: all rows), or one warp per grouped row where the row's group or a row reduction is needed.

// e = 0 .. (range rows) · cols - 1: element (range.lo + e / cols, e % cols).
#define MOM_GROUPED_ELEMENTS(e, range, cols)                                                                    \
  for (index_t e = index_t(blockIdx.x) * blockDim.x + threadIdx.x, e##_end = ((range).hi - (range).lo) * (cols); \
       e < e##_end; e += index_t(gridDim.x) * blockDim.x)

template <class T>
__global__ void grouped_gelu_forward_kernel(MatrixView<T> out, MatrixView<const T> x, RowGroups g, int* error) {
  check_offsets(g, x.rows, error);
  const RowRange all = grouped_rows(g, x.rows);
  MOM_GROUPED_ELEMENTS(e, all, x.cols) {
    const index_t r = all.lo + e / x.cols, c = e % x.cols;
    const T v = x.data[r * x.ld + c];
    out.data[r * out.ld + c] = T(0.5) * v * (T(1) + tanh_(gelu_k<T> * (v + gelu_c<T> * v * v * v)));
  }
}
template <class T>
__global__ void grouped_gelu_backward_kernel(MatrixView<T> dx, MatrixView<const T> x, MatrixView<const T> dout,
                                             RowGroups g, bool add, int* error) {
  check_offsets(g, x.rows, error);
  const RowRange all = grouped_rows(g, x.rows);
  MOM_GROUPED_ELEMENTS(e, all, x.cols) {
    const index_t r = all.lo + e / x.cols, c = e % x.cols;
    const T v = x.data[r * x.ld + c];
    const T t = tanh_(gelu_k<T> * (v + gelu_c<T> * v * v * v));
    const T dgelu = T(0.5) * (T(1) + t) + T(0.5) * v * (T(1) - t * t) * gelu_k<T> * (T(1) + T(3) * gelu_c<T> * v * v);
    const T grad = dout.data[r * dout.ld + c] * dgelu;
    T& o = dx.data[r * dx.ld + c];
    o = add ? o + grad : grad;
  }
}
// out = alpha·a + beta·b over the grouped rows (out may alias a or b: each element is read once,
// then written by the same thread): add_forward and axpy.
template <class T>
__global__ void grouped_axpby_kernel(MatrixView<T> out, T alpha, MatrixView<const T> a, T beta, MatrixView<const T> b,
                                     RowGroups g, int* error) {
  check_offsets(g, out.rows, error);
  const RowRange all = grouped_rows(g, out.rows);
  MOM_GROUPED_ELEMENTS(e, all, out.cols) {
    const index_t r = all.lo + e / out.cols, c = e % out.cols;
    out.data[r * out.ld + c] = alpha * a.data[r * a.ld + c] + beta * b.data[r * b.ld + c];
  }
}
template <class T>
__global__ void grouped_zero_rows_kernel(MatrixView<T> m, RowGroups g, int* error) {
  check_offsets(g, m.rows, error);
  const RowRange all = grouped_rows(g, m.rows);
  MOM_GROUPED_ELEMENTS(e, all, m.cols) m.data[(all.lo + e / m.cols) * m.ld + e % m.cols] = T(0);
}
template <class T>
__global__ void grouped_gather_rows_kernel(MatrixView<T> out, MatrixView<const T> in, const token_t* idx, RowGroups g,
                                           int* error) {
  check_offsets(g, out.rows, error);
  const RowRange all = grouped_rows(g, out.rows);
  MOM_GROUPED_ELEMENTS(e, all, out.cols) {
    const index_t r = all.lo + e / out.cols, c = e % out.cols;
    const token_t k = idx[r];
    if (k < 0 || k >= in.rows) {
      if (c == 0) report(error, DeviceError::gather_index, r, k, in.rows);
      continue;
    }
    out.data[r * out.ld + c] = in.data[index_t(k) * in.ld + c];
  }
}
template <class T>
__global__ void grouped_scatter_add_rows_kernel(MatrixView<T> out, MatrixView<const T> in, const token_t* idx,
                                                const T* w, RowGroups g, int* error) {
  check_offsets(g, in.rows, error);
  const RowRange all = grouped_rows(g, in.rows);
  MOM_GROUPED_ELEMENTS(e, all, in.cols) {
    const index_t r = all.lo + e / in.cols, c = e % in.cols;
    const token_t k = idx[r];
    if (k < 0 || k >= out.rows) {
      if (c == 0) report(error, DeviceError::scatter_index, r, k, out.rows);
      continue;
    }
    atomicAdd(out.data + index_t(k) * out.ld + c, (w ? w[r] : T(1)) * in.data[r * in.ld + c]);  // indices repeat
  }
}

#undef MOM_GROUPED_ELEMENTS

// Warp per grouped row r (group g): out[r] = in_g[idx[r]].
template <class T>
__global__ void grouped_gather_rows_per_group_kernel(MatrixView<T> out, PerGroup<const T> in, index_t in_rows,
                                                     const token_t* idx, RowGroups g, int* error) {
  check_offsets(g, out.rows, error);
  const RowRange all = grouped_rows(g, out.rows);
  const index_t r = all.lo + index_t(blockIdx.x) * warps_per_block + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= all.hi) return;
  const token_t k = idx[r];
  if (k < 0 || k >= in_rows) {
    if (lane == 0) report(error, DeviceError::gather_index, r, k, in_rows);
    return;
  }
  const T* src = in.base + in.at[group_of(g, r)] + index_t(k) * out.cols;
  T* dst = out.data + r * out.ld;
  for (index_t c = lane; c < out.cols; c += 32) dst[c] = src[c];
}
// Warp per grouped row r (group g): out_g[idx[r]] += in[r] (atomics: indices repeat).
template <class T>
__global__ void grouped_scatter_add_rows_per_group_kernel(PerGroup<T> out, index_t out_rows, MatrixView<const T> in,
                                                          const token_t* idx, RowGroups g, int* error) {
  check_offsets(g, in.rows, error);
  const RowRange all = grouped_rows(g, in.rows);
  const index_t r = all.lo + index_t(blockIdx.x) * warps_per_block + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= all.hi) return;
  const token_t k = idx[r];
  if (k < 0 || k >= out_rows) {
    if (lane == 0) report(error, DeviceError::scatter_index, r, k, out_rows);
    return;
  }
  T* dst = out.base + out.at[group_of(g, r)] + index_t(k) * in.cols;
  const T* src = in.data + r * in.ld;
  for (index_t c = lane; c < in.cols; c += 32) atomicAdd(dst + c, src[c]);
}
// Warp per grouped row i: din[i] += w_i dout[idx_i], dweights[i] += dout[idx_i]·in[i].
template <class T>
__global__ void grouped_scatter_add_rows_backward_kernel(MatrixView<T> din, T* dweights, MatrixView<const T> dout,
                                                         MatrixView<const T> in, const token_t* idx, const T* w,
                                                         RowGroups g, bool add, int* error) {
  check_offsets(g, in.rows, error);
  const RowRange all = grouped_rows(g, in.rows);
  const index_t i = all.lo + index_t(blockIdx.x) * warps_per_block + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (i >= all.hi) return;
  const token_t k = idx[i];
  if (k < 0 || k >= dout.rows) {
    if (lane == 0) report(error, DeviceError::scatter_backward_index, i, k, dout.rows);
    return;
  }
  const T* gr = dout.data + index_t(k) * dout.ld;
  const T wi = w ? w[i] : T(1);
  T acc = T(0);
  for (index_t c = lane; c < in.cols; c += 32) {
    if (din.data) din.data[i * din.ld + c] = (add ? din.data[i * din.ld + c] : T(0)) + wi * gr[c];
    if (dweights) acc += gr[c] * in.data[i * in.ld + c];
  }
  if (dweights) {
    acc = warp_sum(acc);
    if (lane == 0) dweights[i] = (add ? dweights[i] : T(0)) + acc;
  }
}

}  // namespace dev

// ---- launchers --------------------------------------------------------------------------------

template <class T>
void GroupedKernels<T>::layernorm_forward(const Context& ctx, M out, T* mean, T* rstd, CM x, const token_t* idx,
                                          CPG gamma, CPG beta, RowGroups g, T eps) {
  if (g.count == 0) return;
  dev::launch("grouped_layernorm_forward", ctx, dev::warp_rows_blocks(out.rows), dev::threads,
              dev::grouped_layernorm_forward_kernel<T>, out, mean, rstd, x, idx, gamma, beta, g, eps, ctx.error);
}
template <class T>
void GroupedKernels<T>::layernorm_backward(const Context& ctx, M dx, PG dgamma, PG dbeta, CM dout, CM x,
                                           const token_t* idx, const T* mean, const T* rstd, CPG gamma, RowGroups g,
                                           bool add) {
  if (g.count == 0) return;
  if (!dx.empty())
    dev::launch("grouped_layernorm_backward", ctx, dev::warp_rows_blocks(dout.rows), dev::threads,
                dev::grouped_layernorm_backward_dx_kernel<T>, dx, dout, x, idx, mean, rstd, gamma, g, add, ctx.error);
  if (!dgamma.empty() || !dbeta.empty())
    dev::launch("grouped_layernorm_backward", ctx,
                dim3(dev::row_tile_slots(dout.rows, g.count, dev::column_chunk), dev::blocks_exact(x.cols, dev::threads)),
                dev::threads, dev::grouped_layernorm_backward_params_kernel<T>, dgamma, dbeta, dout, x, idx, mean, rstd,
                g, ctx.error);
}

template <class T>
void GroupedKernels<T>::gelu_forward(const Context& ctx, M out, CM x, RowGroups g) {
  if (g.count == 0) return;
  dev::launch("gelu_forward", ctx, dev::blocks_for(x.rows * x.cols), dev::threads, dev::grouped_gelu_forward_kernel<T>,
              out, x, g, ctx.error);
}
template <class T>
void GroupedKernels<T>::gelu_backward(const Context& ctx, M dx, CM x, CM dout, RowGroups g, bool add) {
  if (g.count == 0) return;
  dev::launch("gelu_backward", ctx, dev::blocks_for(x.rows * x.cols), dev::threads,
              dev::grouped_gelu_backward_kernel<T>, dx, x, dout, g, add, ctx.error);
}
template <class T>
void GroupedKernels<T>::axpby(const Context& ctx, M out, T alpha, CM a, T beta, CM b, RowGroups g) {
  if (g.count == 0) return;
  dev::launch("axpby", ctx, dev::blocks_for(out.rows * out.cols), dev::threads, dev::grouped_axpby_kernel<T>, out,
              alpha, a, beta, b, g, ctx.error);
}
template <class T>
void GroupedKernels<T>::zero_rows(const Context& ctx, M m, RowGroups g) {
  if (g.count == 0) return;
  dev::launch("zero_rows", ctx, dev::blocks_for(m.rows * m.cols), dev::threads, dev::grouped_zero_rows_kernel<T>, m, g,
              ctx.error);
}
template <class T>
void GroupedKernels<T>::gather_rows(const Context& ctx, M out, CM in, const token_t* idx, RowGroups g) {
  if (g.count == 0) return;
  dev::launch("gather_rows", ctx, dev::blocks_for(out.rows * out.cols), dev::threads,
              dev::grouped_gather_rows_kernel<T>, out, in, idx, g, ctx.error);
}
template <class T>
void GroupedKernels<T>::gather_rows(const Context& ctx, M out, CPG in, index_t in_rows, const token_t* idx,
                                    RowGroups g) {
  if (g.count == 0) return;
  dev::launch("gather_rows", ctx, dev::warp_rows_blocks(out.rows), dev::threads,
              dev::grouped_gather_rows_per_group_kernel<T>, out, in, in_rows, idx, g, ctx.error);
}
template <class T>
void GroupedKernels<T>::scatter_add_rows(const Context& ctx, M out, CM in, const token_t* idx, const T* weights,
                                         RowGroups g) {
  if (g.count == 0) return;
  dev::launch("scatter_add_rows", ctx, dev::blocks_for(in.rows * in.cols), dev::threads,
              dev::grouped_scatter_add_rows_kernel<T>, out, in, idx, weights, g, ctx.error);
}
template <class T>
void GroupedKernels<T>::scatter_add_rows(const Context& ctx, PG out, index_t out_rows, CM in, const token_t* idx,
                                         RowGroups g) {
  if (g.count == 0) return;
  dev::launch("scatter_add_rows", ctx, dev::warp_rows_blocks(in.rows), dev::threads,
              dev::grouped_scatter_add_rows_per_group_kernel<T>, out, out_rows, in, idx, g, ctx.error);
}
template <class T>
void GroupedKernels<T>::scatter_add_rows_backward(const Context& ctx, M din, T* dweights, CM dout, CM in,
                                                  const token_t* idx, const T* weights, RowGroups g, bool add) {
  if (g.count == 0 || (din.empty() && !dweights)) return;
  dev::launch("scatter_add_rows_backward", ctx, dev::warp_rows_blocks(in.rows), dev::threads,
              dev::grouped_scatter_add_rows_backward_kernel<T>, din, dweights, dout, in, idx, weights, g, add,
              ctx.error);
}

}  // namespace mom::cuda

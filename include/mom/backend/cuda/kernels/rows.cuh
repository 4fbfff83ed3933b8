#pragma once
// Row ops (cpu/embedding.hpp's gather / scatter, cpu/topk.hpp): gather_rows, scatter_add_rows and
// its backward, per-row top-k and softmax.
#include "mom/backend/cuda/kernels/common.cuh"

namespace mom::cuda {

namespace dev {

// ---- gather / scatter -------------------------------------------------------------------------

template <class T>
__global__ void gather_rows_kernel(MatrixView<T> out, MatrixView<const T> in, const token_t* idx, int* error) {
  const index_t d = out.cols;
  MOM_GRID_STRIDE(e, out.rows * d) {
    const index_t i = e / d, c = e % d;
    const token_t k = idx[i];
    if (k < 0 || k >= in.rows) {
      if (c == 0) report(error, DeviceError::gather_index, i, k, in.rows);
      continue;
    }
    out.data[i * out.ld + c] = in.data[index_t(k) * in.ld + c];
  }
}

template <class T>
__global__ void scatter_add_rows_kernel(MatrixView<T> out, MatrixView<const T> in, const token_t* idx, const T* w,
                                        int* error) {
  const index_t d = in.cols;
  MOM_GRID_STRIDE(e, in.rows * d) {
    const index_t i = e / d, c = e % d;
    const token_t k = idx[i];
    if (k < 0 || k >= out.rows) {
      if (c == 0) report(error, DeviceError::scatter_index, i, k, out.rows);
      continue;
    }
    atomicAdd(out.data + index_t(k) * out.ld + c, (w ? w[i] : T(1)) * in.data[i * in.ld + c]);  // indices repeat
  }
}

// Warp per row i: din[i] += w_i dout[idx_i], dweights[i] += dout[idx_i]·in[i] (add; otherwise =).
template <class T>
__global__ void scatter_add_rows_backward_kernel(MatrixView<T> din, T* dweights, MatrixView<const T> dout,
                                                 MatrixView<const T> in, const token_t* idx, const T* w, bool add,
                                                 int* error) {
  const index_t i = index_t(blockIdx.x) * warps_per_block + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (i >= in.rows) return;
  const token_t k = idx[i];
  if (k < 0 || k >= dout.rows) {
    if (lane == 0) report(error, DeviceError::scatter_backward_index, i, k, dout.rows);
    return;
  }
  const T* g = dout.data + index_t(k) * dout.ld;
  const T wi = w ? w[i] : T(1);
  T acc = T(0);
  for (index_t c = lane; c < in.cols; c += 32) {
    if (din.data) din.data[i * din.ld + c] = (add ? din.data[i * din.ld + c] : T(0)) + wi * g[c];
    if (dweights) acc += g[c] * in.data[i * in.ld + c];
  }
  if (dweights) {
    acc = warp_sum(acc);
    if (lane == 0) dweights[i] = (add ? dweights[i] : T(0)) + acc;
  }
}

// ---- top-k and row softmax --------------------------------------------------------------------

// Thread per row: insertion into the sorted output row, as the CPU op (ties keep the lower index).
template <class T>
__global__ void topk_rows_kernel(MatrixView<T> values, MatrixView<token_t> indices, MatrixView<const T> x) {
  MOM_GRID_STRIDE(r, x.rows) {
    topk_insert(x.data + r * x.ld, x.cols, values.cols, values.data + r * values.ld, indices.data + r * indices.ld);
  }
}

template <class T>
__global__ void topk_rows_backward_kernel(MatrixView<T> dx, MatrixView<const T> dvalues,
                                          MatrixView<const token_t> indices, int* error) {
  const index_t k = indices.cols;
  MOM_GRID_STRIDE(e, indices.rows * k) {
    const index_t r = e / k, j = e % k;
    const token_t c = indices.data[r * indices.ld + j];
    if (c < 0 || c >= dx.cols) {
      report(error, DeviceError::topk_backward_index, e, c, dx.cols);
      continue;
    }
    dx.data[r * dx.ld + c] += dvalues.data[r * dvalues.ld + j];  // distinct within a row: no race
  }
}

// Warp per row: y = softmax(scale·x). May alias x (each lane rewrites only what it read).
template <class T>
__global__ void softmax_rows_kernel(MatrixView<T> y, MatrixView<const T> x, T scale) {
  const index_t r = index_t(blockIdx.x) * warps_per_block + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= x.rows) return;
  const T* xr = x.data + r * x.ld;
  T* yr = y.data + r * y.ld;
  const index_t N = x.cols;
  T m;
  if (scale >= T(0)) {
    T v = neg_inf<T>();
    for (index_t c = lane; c < N; c += 32) v = max(v, xr[c]);
    m = warp_max(v) * scale;
  } else {
    T v = std::numeric_limits<T>::infinity();
    for (index_t c = lane; c < N; c += 32) v = min(v, xr[c]);
    m = warp_min(v) * scale;
  }
  T s = T(0);
  for (index_t c = lane; c < N; c += 32) {
    const T e = exp_(xr[c] * scale - m);
    yr[c] = e;
    s += e;
  }
  const T inv = T(1) / warp_sum(s);
  for (index_t c = lane; c < N; c += 32) yr[c] *= inv;
}

template <class T>
__global__ void softmax_rows_backward_kernel(MatrixView<T> dx, MatrixView<const T> dy, MatrixView<const T> y, T scale) {
  const index_t r = index_t(blockIdx.x) * warps_per_block + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= y.rows) return;
  const T* yr = y.data + r * y.ld;
  const T* gr = dy.data + r * dy.ld;
  T dot = T(0);
  for (index_t c = lane; c < y.cols; c += 32) dot += yr[c] * gr[c];
  dot = warp_sum(dot);
  T* o = dx.data + r * dx.ld;
  for (index_t c = lane; c < y.cols; c += 32) o[c] += scale * yr[c] * (gr[c] - dot);
}

}  // namespace dev

// ---- launchers --------------------------------------------------------------------------------

template <class T>
void Kernels<T>::gather_rows(const Context& ctx, M out, CM in, const token_t* idx) {
  dev::launch("gather_rows", ctx, dev::blocks_for(out.rows * out.cols), dev::threads, dev::gather_rows_kernel<T>, out,
              in, idx, ctx.error);
}
template <class T>
void Kernels<T>::scatter_add_rows(const Context& ctx, M out, CM in, const token_t* idx, const T* weights) {
  dev::launch("scatter_add_rows", ctx, dev::blocks_for(in.rows * in.cols), dev::threads,
              dev::scatter_add_rows_kernel<T>, out, in, idx, weights, ctx.error);
}
template <class T>
void Kernels<T>::scatter_add_rows_backward(const Context& ctx, M din, T* dweights, CM dout, CM in, const token_t* idx,
                                           const T* weights, bool add) {
  if (din.empty() && !dweights) return;
  dev::launch("scatter_add_rows_backward", ctx, dev::blocks_exact(in.rows, dev::warps_per_block), dev::threads,
              dev::scatter_add_rows_backward_kernel<T>, din, dweights, dout, in, idx, weights, add, ctx.error);
}

template <class T>
void Kernels<T>::topk_rows(const Context& ctx, M values, MatrixView<token_t> indices, CM x) {
  dev::launch("topk_rows", ctx, dev::blocks_for(x.rows, 128), 128, dev::topk_rows_kernel<T>, values, indices, x);
}
template <class T>
void Kernels<T>::topk_rows_backward(const Context& ctx, M dx, CM dvalues, MatrixView<const token_t> indices) {
  dev::launch("topk_rows_backward", ctx, dev::blocks_for(indices.rows * indices.cols), dev::threads,
              dev::topk_rows_backward_kernel<T>, dx, dvalues, indices, ctx.error);
}
template <class T>
void Kernels<T>::softmax_rows(const Context& ctx, M y, CM x, T scale) {
  dev::launch("softmax_rows", ctx, dev::blocks_exact(x.rows, dev::warps_per_block), dev::threads,
              dev::softmax_rows_kernel<T>, y, x, scale);
}
template <class T>
void Kernels<T>::softmax_rows_backward(const Context& ctx, M dx, CM dy, CM y, T scale) {
  dev::launch("softmax_rows_backward", ctx, dev::blocks_exact(y.rows, dev::warps_per_block), dev::threads,
              dev::softmax_rows_backward_kernel<T>, dx, dy, y, scale);
}

}  // namespace mom::cuda

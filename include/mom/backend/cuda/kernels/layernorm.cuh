#pragma once
// LayerNorm, forward and backward (cpu/layernorm.hpp): one warp per row; parameter gradients as
// column sums. The forward also writes its output as bf16 (layernorm_forward_bf16: norm_ops.hpp's layout).
#include "mom/backend/cuda/kernels/common.cuh"
#include "mom/backend/cuda/kernels/linear.cuh"  // bf16_bits

namespace mom::cuda {

namespace dev {

// ---- layernorm: one warp per row --------------------------------------------------------------

// The output's rows out_ld apart, as T, or (O = std::uint16_t) as the bf16 bits of the same value (rounded as to_bf16
// rounds it).
template <class T, class O>
__global__ void layernorm_forward_kernel(O* out, index_t out_ld, T* mean, T* rstd, MatrixView<const T> x,
                                         const T* gamma, const T* beta, T eps) {
  const index_t r = index_t(blockIdx.x) * warps_per_block + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= x.rows) return;
  const index_t d = x.cols;
  const T* xr = x.data + r * x.ld;
  T s = T(0);
  for (index_t c = lane; c < d; c += 32) s += xr[c];
  const T mu = warp_sum(s) / T(d);
  T v = T(0);  // two-pass variance, as the CPU op (no E[x²] - E[x]² cancellation)
  for (index_t c = lane; c < d; c += 32) {
    const T dx = xr[c] - mu;
    v += dx * dx;
  }
  const T rs = T(1) / sqrt_(warp_sum(v) / T(d) + eps);
  O* o = out + r * out_ld;
  for (index_t c = lane; c < d; c += 32) {
    const T v = (xr[c] - mu) * rs * gamma[c] + beta[c];
    if constexpr (std::is_same_v<O, T>)
      o[c] = v;
    else
      o[c] = bf16_bits(v);
  }
  if (lane == 0) {
    mean[r] = mu;
    rstd[r] = rs;
  }
}

// dx += rstd·(dxhat - mean(dxhat) - xhat·mean(dxhat∘xhat)), dxhat = dout∘gamma (warp per row).
template <class T>
__global__ void layernorm_backward_dx_kernel(MatrixView<T> dx, MatrixView<const T> dout, MatrixView<const T> x,
                                             const T* mean, const T* rstd, const T* gamma) {
  const index_t r = index_t(blockIdx.x) * warps_per_block + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= x.rows) return;
  const index_t d = x.cols;
  const T* xr = x.data + r * x.ld;
  const T* gr = dout.data + r * dout.ld;
  const T mu = mean[r], rs = rstd[r];
  T a = T(0), b = T(0);
  for (index_t c = lane; c < d; c += 32) {
    const T dxhat = gr[c] * gamma[c];
    a += dxhat;
    b += dxhat * (xr[c] - mu);
  }
  const T mean_dxhat = warp_sum(a) / T(d);
  const T mean_dxhat_xhat = warp_sum(b) * rs / T(d);
  T* o = dx.data + r * dx.ld;
  for (index_t c = lane; c < d; c += 32)
    o[c] += rs * (gr[c] * gamma[c] - mean_dxhat - (xr[c] - mu) * rs * mean_dxhat_xhat);
}

// dgamma += Σ_rows dout∘xhat, dbeta += Σ_rows dout: thread = column, chunks of rows, atomics.
template <class T>
__global__ void layernorm_backward_params_kernel(T* dgamma, T* dbeta, MatrixView<const T> dout, MatrixView<const T> x,
                                                 const T* mean, const T* rstd) {
  const index_t c = index_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= x.cols) return;
  T pg = T(0), pb = T(0);
  for (index_t r0 = index_t(blockIdx.y) * column_chunk; r0 < x.rows; r0 += index_t(gridDim.y) * column_chunk)
    for (index_t r = r0, r1 = min(x.rows, r0 + column_chunk); r < r1; ++r) {
      const T g = dout.data[r * dout.ld + c];
      pg += g * (x.data[r * x.ld + c] - mean[r]) * rstd[r];
      pb += g;
    }
  if (dgamma) atomicAdd(dgamma + c, pg);
  if (dbeta) atomicAdd(dbeta + c, pb);
}

}  // namespace dev

// ---- launchers --------------------------------------------------------------------------------

template <class T>
void Kernels<T>::layernorm_forward(const Context& ctx, M out, T* mean, T* rstd, CM x, const T* gamma, const T* beta,
                                   T eps) {
  dev::launch("layernorm_forward", ctx, dev::blocks_exact(x.rows, dev::warps_per_block), dev::threads,
              dev::layernorm_forward_kernel<T, T>, out.data, out.ld, mean, rstd, x, gamma, beta, eps);
}
#if defined(MOM_CUDA_FLOAT_UNIT)  // non-template: defined in mom_cuda.cu alone (kernels/all.cuh)
void layernorm_forward_bf16(const Context& ctx, std::uint16_t* out, index_t out_ld, float* mean, float* rstd,
                            MatrixView<const float> x, const float* gamma, const float* beta, float eps) {
  dev::launch("layernorm_forward_bf16", ctx, dev::blocks_exact(x.rows, dev::warps_per_block), dev::threads,
              dev::layernorm_forward_kernel<float, std::uint16_t>, out, out_ld, mean, rstd, x, gamma, beta, eps);
}
#endif
template <class T>
void Kernels<T>::layernorm_backward(const Context& ctx, M dx, T* dgamma, T* dbeta, CM dout, CM x, const T* mean,
                                    const T* rstd, const T* gamma) {
  if (!dx.empty())
    dev::launch("layernorm_backward", ctx, dev::blocks_exact(x.rows, dev::warps_per_block), dev::threads,
                dev::layernorm_backward_dx_kernel<T>, dx, dout, x, mean, rstd, gamma);
  if (dgamma || dbeta)
    dev::launch("layernorm_backward", ctx, dev::column_grid(x.rows, x.cols), dev::threads,
                dev::layernorm_backward_params_kernel<T>, dgamma, dbeta, dout, x, mean, rstd);
}

}  // namespace mom::cuda

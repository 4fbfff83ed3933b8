#pragma once
// The optimizer (cpu/optim.hpp): the global gradient norm (two-pass, deterministic) and AdamW with
// fused clipping.
#include "mom/backend/cuda/kernels/common.cuh"

namespace mom::cuda {

namespace dev {

// ---- optimizer --------------------------------------------------------------------------------

// Pass 1: partials[block] = Σ g² over the block's grid-stride share (double).
template <class T>
__global__ void sum_squares_kernel(double* partials, const T* g, index_t n) {
  double s = 0;
  MOM_GRID_STRIDE(i, n) s += double(g[i]) * double(g[i]);
  s = block_reduce<double>(s);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}
// Pass 2 (one block): *norm_out = sqrt(Σ partials). Fixed grid: the sum order is deterministic.
template <class T>
__global__ void finish_norm_kernel(T* norm_out, const double* partials, int nparts) {
  double s = 0;
  for (int i = threadIdx.x; i < nparts; i += blockDim.x) s += partials[i];
  s = block_reduce<double>(s);
  if (threadIdx.x == 0) *norm_out = T(sqrt(s));
}

template <class T>
__global__ void adamw_kernel(T* p, const T* g, T* m, T* v, index_t n, T b1, T b2, T eps, T decay, T step_size,
                             T inv_sqrt_bc2, const T* grad_norm, T max_norm) {
  T clip = T(1);  // fused clipping: the norm never leaves the device
  if (grad_norm) {
    const T norm = *grad_norm;
    if (!(norm - norm == T(0))) return;  // inf or NaN: a diverged step is skipped (cpu::adamw_skips)
    if (max_norm > T(0) && norm > max_norm) clip = max_norm / norm;
    if (norm * clip >= sqrt_(max_value<T>())) return;  // g² would overflow v: skipped too (cpu::adamw_skips)
  }
  MOM_GRID_STRIDE(i, n) {
    const T gi = g[i] * clip;
    const T mi = b1 * m[i] + (T(1) - b1) * gi;
    const T vi = b2 * v[i] + (T(1) - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] -= step_size * mi / (sqrt_(vi) * inv_sqrt_bc2 + eps) + decay * p[i];
  }
}

}  // namespace dev

// ---- launchers --------------------------------------------------------------------------------

template <class T>
void Kernels<T>::grad_norm(const Context& ctx, const T* grads, index_t n, T* norm_out) {
  const int nparts = static_cast<int>(
      std::min<index_t>({Context::reduce_blocks, dev::max_stride_blocks, (n + dev::threads - 1) / dev::threads}));
  dev::launch("grad_norm", ctx, static_cast<unsigned>(nparts), dev::threads, dev::sum_squares_kernel<T>, ctx.partials,
              grads, n);
  dev::launch("grad_norm", ctx, 1, 1024, dev::finish_norm_kernel<T>, norm_out, static_cast<const double*>(ctx.partials),
              nparts);
}
template <class T>
void Kernels<T>::adamw_step(const Context& ctx, T* params, const T* grads, T* m, T* v, index_t n, T b1, T b2, T eps,
                            T decay, T step_size, T inv_sqrt_bc2, const T* grad_norm, T max_norm) {
  dev::launch("adamw_step", ctx, dev::blocks_for(n), dev::threads, dev::adamw_kernel<T>, params, grads, m, v, n, b1, b2,
              eps, decay, step_size, inv_sqrt_bc2, grad_norm, max_norm);
}

}  // namespace mom::cuda

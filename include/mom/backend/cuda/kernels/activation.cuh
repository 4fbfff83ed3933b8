#pragma once
// Elementwise ops (cpu/activation.hpp): GELU (tanh form), ReLU, add, axpy, scale.
#include "mom/backend/cuda/kernels/common.cuh"
#include "mom/backend/cuda/kernels/linear.cuh"  // bf16_bits, bf16_float

namespace mom::cuda {

namespace dev {

// ---- elementwise ------------------------------------------------------------------------------

template <class T>
inline constexpr T gelu_k = T(0.7978845608028654);  // sqrt(2 / pi)
template <class T>
inline constexpr T gelu_c = T(0.044715);

template <class T>
__global__ void gelu_forward_kernel(T* out, const T* x, index_t n) {
  MOM_GRID_STRIDE(i, n) {
    const T v = x[i];
    out[i] = T(0.5) * v * (T(1) + tanh_(gelu_k<T> * (v + gelu_c<T> * v * v * v)));
  }
}
// gelu'(v) of the tanh form.
template <class T>
__device__ __forceinline__ T gelu_grad(T v) {
  const T t = tanh_(gelu_k<T> * (v + gelu_c<T> * v * v * v));
  return T(0.5) * (T(1) + t) + T(0.5) * v * (T(1) - t * t) * gelu_k<T> * (T(1) + T(3) * gelu_c<T> * v * v);
}
template <class T>
__global__ void gelu_backward_kernel(T* dx, const T* x, const T* dout, index_t n, bool add) {
  MOM_GRID_STRIDE(i, n) dx[i] = (add ? dx[i] : T(0)) + dout[i] * gelu_grad(x[i]);
}
#if defined(MOM_CUDA_FLOAT_UNIT)  // non-template: defined in mom_cuda.cu alone (kernels/all.cuh)
// dpre = bf16(dact · gelu'(pre)) with pre and dpre in bf16 bits (the MLP's bf16 layout, mlp_ops.hpp): cuBLASLt's
// DGELU epilogue where it refused the product.
__global__ void dgelu_bf16_kernel(std::uint16_t* dpre, const float* dact, const std::uint16_t* pre, index_t n) {
  MOM_GRID_STRIDE(i, n) dpre[i] = bf16_bits(dact[i] * gelu_grad(bf16_float(pre[i])));
}
#endif
template <class T>
__global__ void relu_forward_kernel(T* out, const T* x, index_t n) {
  MOM_GRID_STRIDE(i, n) out[i] = x[i] > T(0) ? x[i] : T(0);
}
template <class T>
__global__ void relu_backward_kernel(T* dx, const T* x, const T* dout, index_t n, bool add) {
  MOM_GRID_STRIDE(i, n) dx[i] = (add ? dx[i] : T(0)) + (x[i] > T(0) ? dout[i] : T(0));
}
template <class T>
__global__ void add_kernel(T* out, const T* a, const T* b, index_t n) {
  MOM_GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}
template <class T>
__global__ void axpy_kernel(T* y, T alpha, const T* x, index_t n) {
  MOM_GRID_STRIDE(i, n) y[i] += alpha * x[i];
}
template <class T>
__global__ void scale_kernel(T* y, T alpha, index_t n) {
  MOM_GRID_STRIDE(i, n) y[i] *= alpha;
}

}  // namespace dev

// ---- launchers --------------------------------------------------------------------------------

template <class T>
void Kernels<T>::gelu_forward(const Context& ctx, T* out, const T* x, index_t n) {
  dev::launch("gelu_forward", ctx, dev::blocks_for(n), dev::threads, dev::gelu_forward_kernel<T>, out, x, n);
}
template <class T>
void Kernels<T>::gelu_backward(const Context& ctx, T* dx, const T* x, const T* dout, index_t n, bool add) {
  dev::launch("gelu_backward", ctx, dev::blocks_for(n), dev::threads, dev::gelu_backward_kernel<T>, dx, x, dout, n, add);
}
template <class T>
void Kernels<T>::relu_forward(const Context& ctx, T* out, const T* x, index_t n) {
  dev::launch("relu_forward", ctx, dev::blocks_for(n), dev::threads, dev::relu_forward_kernel<T>, out, x, n);
}
template <class T>
void Kernels<T>::relu_backward(const Context& ctx, T* dx, const T* x, const T* dout, index_t n, bool add) {
  dev::launch("relu_backward", ctx, dev::blocks_for(n), dev::threads, dev::relu_backward_kernel<T>, dx, x, dout, n, add);
}
template <class T>
void Kernels<T>::add_forward(const Context& ctx, T* out, const T* a, const T* b, index_t n) {
  dev::launch("add_forward", ctx, dev::blocks_for(n), dev::threads, dev::add_kernel<T>, out, a, b, n);
}
template <class T>
void Kernels<T>::axpy(const Context& ctx, T* y, T alpha, const T* x, index_t n) {
  dev::launch("axpy", ctx, dev::blocks_for(n), dev::threads, dev::axpy_kernel<T>, y, alpha, x, n);
}
template <class T>
void Kernels<T>::scale(const Context& ctx, T* y, T alpha, index_t n) {
  dev::launch("scale", ctx, dev::blocks_for(n), dev::threads, dev::scale_kernel<T>, y, alpha, n);
}

#if defined(MOM_CUDA_FLOAT_UNIT)
void dgelu_bf16(const Context& ctx, std::uint16_t* dpre, const float* dact, const std::uint16_t* pre, index_t n) {
  dev::launch("mlp_backward", ctx, dev::blocks_for(n), dev::threads, dev::dgelu_bf16_kernel, dpre, dact, pre, n);
}
#endif

}  // namespace mom::cuda

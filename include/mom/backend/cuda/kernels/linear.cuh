#pragma once
// Memory and linear-layer helpers (the GEMMs themselves run through cuBLAS in ops.hpp): fill,
// the bias broadcast of linear_forward, the column sums of linear_backward's bias gradient, and the
// bf16 staging of a GEMM operand under Precision::BF16 (to_bf16).
#include "mom/backend/cuda/kernels/common.cuh"

namespace mom::cuda {

namespace dev {

// ---- memory / linear ------------------------------------------------------------------------

template <class U>
__global__ void fill_kernel(U* dst, index_t n, U value) {
  MOM_GRID_STRIDE(i, n) dst[i] = value;
}

template <class T>
__global__ void broadcast_rows_kernel(MatrixView<T> y, const T* b) {
  MOM_GRID_STRIDE(e, y.rows * y.cols) {
    const index_t r = e / y.cols, c = e % y.cols;
    y.data[r * y.ld + c] = b[c];
  }
}

template <class T>
__global__ void add_column_sums_kernel(T* acc, MatrixView<const T> m) {
  const index_t c = index_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= m.cols) return;
  T s = T(0);
  for (index_t r0 = index_t(blockIdx.y) * column_chunk; r0 < m.rows; r0 += index_t(gridDim.y) * column_chunk)
    for (index_t r = r0, r1 = min(m.rows, r0 + column_chunk); r < r1; ++r) s += m.data[r * m.ld + c];
  atomicAdd(acc + c, s);
}

// fp32 -> bf16 bits, round to nearest even (as __float2bfloat16_rn): add 0x7fff plus the lowest kept
// bit, then truncate; a NaN is kept a (quiet) NaN instead of rounding into infinity.
__device__ __forceinline__ std::uint16_t bf16_bits(float x) {
  std::uint32_t u;
  memcpy(&u, &x, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}
__global__ void to_bf16_kernel(std::uint16_t* out, index_t out_ld, MatrixView<const float> in) {
  const index_t n = in.rows * in.cols;
  MOM_GRID_STRIDE(i, n) {
    const index_t r = i / in.cols, c = i - r * in.cols;
    out[r * out_ld + c] = bf16_bits(in.data[r * in.ld + c]);
  }
}

}  // namespace dev

// ---- launchers --------------------------------------------------------------------------------

void to_bf16(const Context& ctx, std::uint16_t* out, index_t out_ld, MatrixView<const float> in) {
  const index_t n = in.rows * in.cols;
#if defined(MOM_CUDA_EMULATE)
  if (n > 0) mom_emu_note_staging(static_cast<std::size_t>(n) * sizeof(float));  // a staging copy (budget tests)
#endif
  dev::launch("to_bf16", ctx, dev::blocks_for(n), dev::threads, dev::to_bf16_kernel, out, out_ld, in);
}

template <class U>
void fill(const Context& ctx, U* dst, index_t n, U value) {
  dev::launch("fill", ctx, dev::blocks_for(n), dev::threads, dev::fill_kernel<U>, dst, n, value);
}

template <class T>
void Kernels<T>::broadcast_rows(const Context& ctx, M y, const T* b) {
  dev::launch("linear_forward", ctx, dev::blocks_for(y.rows * y.cols), dev::threads, dev::broadcast_rows_kernel<T>, y, b);
}
template <class T>
void Kernels<T>::add_column_sums(const Context& ctx, T* acc, CM m) {
  dev::launch("linear_backward", ctx, dev::column_grid(m.rows, m.cols), dev::threads, dev::add_column_sums_kernel<T>,
              acc, m);
}

}  // namespace mom::cuda

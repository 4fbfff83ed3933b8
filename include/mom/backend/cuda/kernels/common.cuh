#pragma once
// Shared by every kernel file of the CUDA backend (kernels/*.cuh): launch geometry, launch() (a real
// <<<grid, block>>> launch, or the CPU emulation of emulate.hpp under MOM_CUDA_EMULATE), math by
// overload, warp and block reductions, the block scan, the device-side error report, and the
// grid-stride loop. nvcc only (or the emulation): the kernel files are included once, by mom_cuda.cu,
// which instantiates the launchers for float and double (see kernels.hpp, depth_kernels.hpp,
// grouped_kernels.hpp for the host-side declarations).
//
// Conventions (as the CPU ops): forward ops write their outputs, backward ops accumulate (+=),
// a null pointer for an optional gradient means "not wanted". Views are row-major with a row
// stride (ld). Index errors are reported through Context::error (see kernels.hpp), never by
// reading or writing out of bounds.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

#if defined(MOM_CUDA_EMULATE)
#include "mom/backend/cuda/emulate.hpp"  // the kernels on CPU threads (tests without a GPU)
#else
#include <cuda_runtime.h>
#endif

#include "mom/backend/cuda/check.hpp"
#include "mom/backend/cuda/kernels.hpp"
#include "mom/backend/topk_insert.hpp"

namespace mom::cuda {

namespace dev {

inline constexpr int threads = 256;  // block size of the elementwise and row kernels
inline constexpr int warps_per_block = threads / 32;

#if defined(MOM_CUDA_EMULATE)
inline constexpr index_t max_stride_blocks = 4;  // emulated blocks run one at a time
#else
inline constexpr index_t max_stride_blocks = 65535;
#endif

// Blocks for a grid-stride loop over n items (capped: each thread then handles several).
inline unsigned blocks_for(index_t n, int per_block = threads) {
  const index_t b = (n + per_block - 1) / per_block;
  return static_cast<unsigned>(std::clamp<index_t>(b, 0, max_stride_blocks));
}
// Blocks for kernels that map one block (or warp) to each item: never capped.
inline unsigned blocks_exact(index_t n, int per_block) {
  return static_cast<unsigned>((n + per_block - 1) / per_block);
}

// Enqueues kernel<<<grid, block>>> on the backend's stream and checks the launch.
template <class... Params, class... Args>
void launch(const char* op, const Context& ctx, dim3 grid, dim3 block, void (*kernel)(Params...), Args&&... args) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;
#if defined(MOM_CUDA_EMULATE)
  (void)ctx;
  emulate_launch(grid, block, [kernel, ... a = static_cast<Params>(args)] { kernel(a...); });  // by value: recordable
#else
  kernel<<<grid, block, 0, ctx.stream>>>(static_cast<Params>(args)...);
#endif
  MOM_CUDA_CHECK(cudaGetLastError(), op);
}

#if defined(MOM_CUDA_EMULATE)
inline unsigned char* dynamic_smem() { return reinterpret_cast<unsigned char*>(emu_dynamic_smem.data()); }
#else
__device__ __forceinline__ unsigned char* dynamic_smem() {
  extern __shared__ __align__(128) unsigned char mom_dynamic_smem[];
  return mom_dynamic_smem;
}
#endif

// launch() with dynamic shared memory (raising the kernel's limit above the default 48 KB).
template <class... Params, class... Args>
void launch_smem(const char* op, const Context& ctx, dim3 grid, dim3 block, std::size_t smem,
                 void (*kernel)(Params...), Args&&... args) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;
#if defined(MOM_CUDA_EMULATE)
  (void)ctx;
  emulate_launch(grid, block, [kernel, ... a = static_cast<Params>(args)] { kernel(a...); }, smem);
#else
  MOM_CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
                 op);
  kernel<<<grid, block, smem, ctx.stream>>>(static_cast<Params>(args)...);
#endif
  MOM_CUDA_CHECK(cudaGetLastError(), op);
}

// Whether `kernel` can be launched with `smem` bytes of dynamic shared memory on the context's device (its static
// shared memory plus smem within the device's per-block opt-in limit) and was compiled for min_arch or later (its
// virtual and real architectures: 80 for a kernel whose body is empty below sm_80). Cached per kernel: one process
// is assumed to use GPUs of one architecture. The emulation has no limit.
template <auto kernel>
bool smem_fits(const Context& ctx, std::size_t smem, int min_arch = 0) {
#if defined(MOM_CUDA_EMULATE)
  (void)ctx, (void)smem, (void)min_arch;
  return true;
#else
  static const bool fits = [&] {
    cudaFuncAttributes a{};
    int limit = 0;
    if (cudaFuncGetAttributes(&a, reinterpret_cast<const void*>(kernel)) != cudaSuccess ||
        cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, ctx.device) != cudaSuccess) {
      (void)cudaGetLastError();  // not a launch error: the caller takes its smaller variant
      return false;
    }
    // ptxVersion: the virtual architecture the code was compiled from (cub::PtxVersion reads it so).
    return a.ptxVersion >= min_arch && a.binaryVersion >= min_arch && smem + a.sharedSizeBytes <= std::size_t(limit);
  }();
  return fits;
#endif
}

// Math by overload (the CUDA math API names the float versions expf, tanhf, ...).
__device__ __forceinline__ float exp_(float x) { return expf(x); }
__device__ __forceinline__ double exp_(double x) { return exp(x); }
__device__ __forceinline__ float log_(float x) { return logf(x); }
__device__ __forceinline__ double log_(double x) { return log(x); }
__device__ __forceinline__ float sqrt_(float x) { return sqrtf(x); }
__device__ __forceinline__ double sqrt_(double x) { return sqrt(x); }
__device__ __forceinline__ float tanh_(float x) { return tanhf(x); }
__device__ __forceinline__ double tanh_(double x) { return tanh(x); }
template <class T>
__device__ __forceinline__ T sigmoid_(T a) {
  return T(1) / (T(1) + exp_(-a));
}
template <class T>
__device__ __forceinline__ T neg_inf() {
  return -std::numeric_limits<T>::infinity();
}
template <class T>
__device__ __forceinline__ T max_value() {
  return std::numeric_limits<T>::max();
}

// One row's top-k by insertion, the CPU's own body (backend/topk_insert.hpp): topk_rows' and the softmax router's
// kernels, a thread per row.
using backend_common::topk_insert;

template <class T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <class T>
__device__ __forceinline__ T warp_max(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
template <class T>
__device__ __forceinline__ T warp_min(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum / max over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets
// the result. Safe to call repeatedly (the first barrier protects the shared slots).
template <class T, bool Max = false>
__device__ T block_reduce(T v) {
  __shared__ T part[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = Max ? warp_max(v) : warp_sum(v);
  __syncthreads();
  if (lane == 0) part[warp] = v;
  __syncthreads();
  if (warp == 0) {
    T w = lane < nw ? part[lane] : (Max ? neg_inf<T>() : T(0));
    w = Max ? warp_max(w) : warp_sum(w);
    if (lane == 0) part[0] = w;
  }
  __syncthreads();
  return part[0];
}

// loss_out[0] = coef · (Σ partials[0 .. blocks)) / count, one block: the second pass of a per-block reduction
// (router z-loss, sequence-wise balance loss).
template <class T>
__global__ void partials_mean_kernel(T* loss_out, const double* partials, index_t blocks, index_t count, T coef) {
  double s = 0;
  for (index_t b = threadIdx.x; b < blocks; b += blockDim.x) s += partials[b];
  s = block_reduce<double>(s);
  if (threadIdx.x == 0) loss_out[0] = T(double(coef) * s / double(count));
}

// Records the first device-side index error (see kernels.hpp); later ones are dropped.
__device__ __forceinline__ void report(int* error, DeviceError code, index_t position, index_t value, index_t bound) {
  if (atomicCAS(error, 0, static_cast<int>(code)) == 0) {
    error[1] = static_cast<int>(position);
    error[2] = static_cast<int>(value);
    error[3] = static_cast<int>(bound);
  }
}

// 16-byte vector loads and stores (float4, uint4) of global or shared memory: on a GPU the address must be 16-byte
// aligned (a misaligned one faults, "misaligned address"); the emulation, which would read any address, checks it.
// aligned16: the test, also for a caller choosing between vector and element accesses.
__host__ __device__ __forceinline__ bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }
__device__ __forceinline__ void check_aligned16([[maybe_unused]] const void* p, [[maybe_unused]] const char* what) {
#if defined(MOM_CUDA_EMULATE)
  if (!aligned16(p)) {
    std::fprintf(stderr, "mom CUDA emulation: %s at %p is not 16-byte aligned (thread %u of block %u)\n", what, p,
                 threadIdx.x, blockIdx.x);
    std::abort();
  }
#endif
}
template <class V, class E>
__device__ __forceinline__ V load16(const E* p) {
  static_assert(sizeof(V) == 16);
  check_aligned16(p, "a 16-byte load");
  return *reinterpret_cast<const V*>(p);
}
template <class V, class E>
__device__ __forceinline__ void store16(E* p, const V& v) {
  static_assert(sizeof(V) == 16);
  check_aligned16(p, "a 16-byte store");
  *reinterpret_cast<V*>(p) = v;
}

// p[0..3] += v, each element atomically: one vector atomic (sm_90 and later, global memory) where p is 16-byte
// aligned (the caller knows: aligned), else four scalar ones. The vector atomic is not emulated (MOM_CUDA_EMULATE
// compiles the scalar ones); the sums are the same either way, their order is not fixed in either.
__device__ __forceinline__ void atomic_add4(float* p, float4 v, [[maybe_unused]] bool aligned) {
  if (aligned) check_aligned16(p, "a vector atomic");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (aligned) {
    atomicAdd(reinterpret_cast<float4*>(p), v);
    return;
  }
#endif
  atomicAdd(p, v.x);
  atomicAdd(p + 1, v.y);
  atomicAdd(p + 2, v.z);
  atomicAdd(p + 3, v.w);
}

// A grid-stride loop: thread t of the grid's T threads takes items t, t + T, t + 2T, ... of [0, n) (coalesced).
// Emulated (blocks one after another, a block's threads in turn: emulate.hpp), thread t takes the t-th of T
// contiguous chunks instead, so that the CPU streams through memory rather than touching one item per page
// (an emulated AdamW over GPT-2 small: 4.0 -> 0.36 s). Which thread takes an item changes only the order of the
// terms of a reduction or of atomics; with n <= T (the error tests' sizes) both give thread t item t.
#if defined(MOM_CUDA_EMULATE)
inline index_t emu_chunk_start(index_t n, index_t t) {
  const index_t threads = index_t(gridDim.x) * blockDim.x, chunk = (n + threads - 1) / threads;
  return std::min(n, t * chunk);
}
#define MOM_GRID_STRIDE(i, n)                                                                           \
  for (index_t i = ::mom::cuda::dev::emu_chunk_start((n), index_t(blockIdx.x) * blockDim.x + threadIdx.x), \
               i##_end = ::mom::cuda::dev::emu_chunk_start((n), index_t(blockIdx.x) * blockDim.x + threadIdx.x + 1); \
       i < i##_end; ++i)
#else
#define MOM_GRID_STRIDE(i, n) \
  for (index_t i = index_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += index_t(gridDim.x) * blockDim.x)
#endif

// Column sums (bias gradients, LayerNorm's dgamma / dbeta): thread = column, blockIdx.y strides over
// chunks of column_chunk rows; chunks meet in atomics.
inline constexpr int column_chunk = 64;
inline dim3 column_grid(index_t rows, index_t cols) {
  return dim3(static_cast<unsigned>((cols + threads - 1) / threads),
              static_cast<unsigned>(std::clamp<index_t>((rows + column_chunk - 1) / column_chunk, 1, 65535)));
}

// Exclusive prefix sum of one int per thread over the block (Hillis-Steele in shared memory,
// blockDim.x <= threads); *total receives the block's sum. Every thread must call it.
__device__ inline int block_exclusive_scan(int v, int* total) {
  __shared__ int buf[2][threads];
  const int t = threadIdx.x;
  int in = 0;
  buf[0][t] = v;
  __syncthreads();
  for (int offset = 1; offset < int(blockDim.x); offset <<= 1) {
    const int out = in ^ 1;
    buf[out][t] = buf[in][t] + (t >= offset ? buf[in][t - offset] : 0);
    __syncthreads();
    in = out;
  }
  const int inclusive = buf[in][t];
  *total = buf[in][blockDim.x - 1];
  __syncthreads();  // buf is reused by the next call
  return inclusive - v;
}

}  // namespace dev

}  // namespace mom::cuda

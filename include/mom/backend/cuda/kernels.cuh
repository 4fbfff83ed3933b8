#pragma once
// The CUDA backend's kernels and their launchers (declared in kernels.hpp). nvcc only: included
// once, by mom_cuda.cu, which instantiates them for float and double.
//
// Conventions (as the CPU ops): forward ops write their outputs, backward ops accumulate (+=),
// a null pointer for an optional gradient means "not wanted". Views are row-major with a row
// stride (ld). Index errors are reported through Context::error (see kernels.hpp), never by
// reading or writing out of bounds.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#if defined(MOM_CUDA_EMULATE)
#include <numeric>
#include <vector>

#include "mom/backend/cuda/emulate.hpp"  // the kernels on CPU threads (tests without a GPU)
#else
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>
#include <cuda_runtime.h>
#endif

#include "mom/backend/cuda/check.hpp"
#include "mom/backend/cuda/kernels.hpp"

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
  emulate_launch(grid, block, [&] { kernel(static_cast<Params>(args)...); });
#else
  kernel<<<grid, block, 0, ctx.stream>>>(static_cast<Params>(args)...);
#endif
  MOM_CUDA_CHECK(cudaGetLastError(), op);
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

// Records the first device-side index error (see kernels.hpp); later ones are dropped.
__device__ __forceinline__ void report(int* error, DeviceError code, index_t position, index_t value, index_t bound) {
  if (atomicCAS(error, 0, static_cast<int>(code)) == 0) {
    error[1] = static_cast<int>(position);
    error[2] = static_cast<int>(value);
    error[3] = static_cast<int>(bound);
  }
}

#define MOM_GRID_STRIDE(i, n) \
  for (index_t i = index_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += index_t(gridDim.x) * blockDim.x)

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

// Column sums: thread = column, blockIdx.y strides over chunks of rows; chunks meet in atomics.
inline constexpr int column_chunk = 64;
template <class T>
__global__ void add_column_sums_kernel(T* acc, MatrixView<const T> m) {
  const index_t c = index_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= m.cols) return;
  T s = T(0);
  for (index_t r0 = index_t(blockIdx.y) * column_chunk; r0 < m.rows; r0 += index_t(gridDim.y) * column_chunk)
    for (index_t r = r0, r1 = min(m.rows, r0 + column_chunk); r < r1; ++r) s += m.data[r * m.ld + c];
  atomicAdd(acc + c, s);
}
inline dim3 column_grid(index_t rows, index_t cols) {
  return dim3(static_cast<unsigned>((cols + threads - 1) / threads),
              static_cast<unsigned>(std::clamp<index_t>((rows + column_chunk - 1) / column_chunk, 1, 65535)));
}

// ---- embedding --------------------------------------------------------------------------------

template <class T>
__global__ void embedding_forward_kernel(MatrixView<T> out, const token_t* tokens, MatrixView<const T> wte,
                                         MatrixView<const T> wpe, index_t seq, int* error) {
  const index_t d = out.cols;
  MOM_GRID_STRIDE(e, out.rows * d) {
    const index_t t = e / d, c = e % d;
    const token_t tok = tokens[t];
    if (tok < 0 || tok >= wte.rows) {
      if (c == 0) report(error, DeviceError::embedding_token, t, tok, wte.rows);
      continue;
    }
    out.data[t * out.ld + c] = wte.data[index_t(tok) * wte.ld + c] + wpe.data[(t % seq) * wpe.ld + c];
  }
}

template <class T>
__global__ void embedding_backward_kernel(MatrixView<T> dwte, MatrixView<T> dwpe, MatrixView<const T> dout,
                                          const token_t* tokens, index_t seq, index_t vocab, int* error) {
  const index_t d = dout.cols;
  MOM_GRID_STRIDE(e, dout.rows * d) {
    const index_t t = e / d, c = e % d;
    const T g = dout.data[t * dout.ld + c];
    if (dwte.data) {
      const token_t tok = tokens[t];
      if (tok < 0 || tok >= vocab) {
        if (c == 0) report(error, DeviceError::embedding_backward_token, t, tok, vocab);
      } else {
        atomicAdd(dwte.data + index_t(tok) * dwte.ld + c, g);
      }
    }
    if (dwpe.data) atomicAdd(dwpe.data + (t % seq) * dwpe.ld + c, g);
  }
}

// ---- layernorm: one warp per row --------------------------------------------------------------

template <class T>
__global__ void layernorm_forward_kernel(MatrixView<T> out, T* mean, T* rstd, MatrixView<const T> x, const T* gamma,
                                         const T* beta, T eps) {
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
  T* o = out.data + r * out.ld;
  for (index_t c = lane; c < d; c += 32) o[c] = (xr[c] - mu) * rs * gamma[c] + beta[c];
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
template <class T>
__global__ void gelu_backward_kernel(T* dx, const T* x, const T* dout, index_t n) {
  MOM_GRID_STRIDE(i, n) {
    const T v = x[i];
    const T t = tanh_(gelu_k<T> * (v + gelu_c<T> * v * v * v));
    const T dgelu = T(0.5) * (T(1) + t) + T(0.5) * v * (T(1) - t * t) * gelu_k<T> * (T(1) + T(3) * gelu_c<T> * v * v);
    dx[i] += dout[i] * dgelu;
  }
}
template <class T>
__global__ void relu_forward_kernel(T* out, const T* x, index_t n) {
  MOM_GRID_STRIDE(i, n) out[i] = x[i] > T(0) ? x[i] : T(0);
}
template <class T>
__global__ void relu_backward_kernel(T* dx, const T* x, const T* dout, index_t n) {
  MOM_GRID_STRIDE(i, n) if (x[i] > T(0)) dx[i] += dout[i];
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

// fp32 -> bf16 bits, round to nearest even (as __float2bfloat16_rn): add 0x7fff plus the lowest kept
// bit, then truncate; a NaN is kept a (quiet) NaN instead of rounding into infinity.
__device__ __forceinline__ std::uint16_t bf16_bits(float x) {
  std::uint32_t u;
  memcpy(&u, &x, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}
__global__ void to_bf16_kernel(std::uint16_t* out, MatrixView<const float> in) {
  const index_t n = in.rows * in.cols;
  MOM_GRID_STRIDE(i, n) {
    const index_t r = i / in.cols, c = i - r * in.cols;
    out[i] = bf16_bits(in.data[r * in.ld + c]);
  }
}

// ---- cross-entropy: one block per row ---------------------------------------------------------

// lse[i] = log Σ_j exp(logits[i, j]): each thread keeps an online (max, sum) pair over its strided
// columns (one pass over memory), then the block merges the pairs.
template <class T>
__global__ void cross_entropy_lse_kernel(T* lse, MatrixView<const T> logits, const token_t* targets,
                                         token_t ignore_index, int* error) {
  const index_t i = blockIdx.x;
  const T* row = logits.data + i * logits.ld;
  T m = neg_inf<T>(), s = T(0);
  for (index_t j = threadIdx.x; j < logits.cols; j += blockDim.x) {
    const T v = row[j];
    if (v > m) {
      s = s * exp_(m - v) + T(1);
      m = v;
    } else {
      s += exp_(v - m);
    }
  }
  const T bm = block_reduce<T, true>(m);
  const T bs = block_reduce<T>(m == neg_inf<T>() ? T(0) : s * exp_(m - bm));
  if (threadIdx.x == 0) {
    lse[i] = bm + log_(bs);
    const token_t t = targets[i];
    if (t != ignore_index && (t < 0 || t >= logits.cols))
      report(error, DeviceError::cross_entropy_target, i, t, logits.cols);
  }
}

// loss_out[0] = mean over counted rows of lse[i] - logits[i, t_i] (one block, double sums).
template <class T>
__global__ void cross_entropy_loss_kernel(T* loss_out, const T* lse, MatrixView<const T> logits,
                                          const token_t* targets, token_t ignore_index) {
  double total = 0, count = 0;
  for (index_t i = threadIdx.x; i < logits.rows; i += blockDim.x) {
    const token_t t = targets[i];
    if (t == ignore_index || t < 0 || t >= logits.cols) continue;
    total += double(lse[i]) - double(logits.data[i * logits.ld + t]);
    count += 1;
  }
  total = block_reduce<double>(total);
  count = block_reduce<double>(count);
  if (threadIdx.x == 0) loss_out[0] = count > 0 ? T(total / count) : T(0);
}

// *count = rows with a valid, non-ignored target (one block).
__global__ void count_targets_kernel(int* count, const token_t* targets, index_t n, index_t vocab,
                                     token_t ignore_index) {
  double c = 0;
  for (index_t i = threadIdx.x; i < n; i += blockDim.x) {
    const token_t t = targets[i];
    c += (t != ignore_index && t >= 0 && t < vocab) ? 1.0 : 0.0;
  }
  c = block_reduce<double>(c);
  if (threadIdx.x == 0) *count = static_cast<int>(c);
}

// dlogits = dloss·(softmax - onehot)/count; 0 rows for ignored targets. May alias logits: each
// element is read, then written, by the same thread.
template <class T>
__global__ void cross_entropy_backward_kernel(MatrixView<T> dlogits, MatrixView<const T> logits, const T* lse,
                                              const token_t* targets, T dloss, token_t ignore_index,
                                              const int* count, int* error) {
  const index_t i = blockIdx.x;
  const token_t t = targets[i];
  T* out = dlogits.data + i * dlogits.ld;
  const bool valid = t >= 0 && t < logits.cols;
  if (t == ignore_index || !valid) {
    if (t != ignore_index && threadIdx.x == 0)
      report(error, DeviceError::cross_entropy_target, i, t, logits.cols);
    for (index_t j = threadIdx.x; j < logits.cols; j += blockDim.x) out[j] = T(0);
    return;
  }
  const int n = *count;
  const T s = n > 0 ? dloss / T(n) : T(0);
  const T* in = logits.data + i * logits.ld;
  const T l = lse[i];
  for (index_t j = threadIdx.x; j < logits.cols; j += blockDim.x) {
    const T p = s * exp_(in[j] - l);
    out[j] = j == t ? p - s : p;
  }
}

// ---- causal attention, flash style ------------------------------------------------------------
//
// Head dimension hd is padded to HD (32, 64 or 128): the padded columns load as 0, so every dot
// product and update runs over HD without per-element guards; only stores check c < hd. Tiles
// are BT rows (one thread per row); the shared memory of a block is ≤ 4 tiles of [BT × HD] (32 KB).
// One thread owns one query row (forward, dQ) or one key row (dK, dV); the other side streams
// through shared memory in tiles, and every thread reads the same streamed row at once (a
// broadcast). Own rows sit in shared memory padded to HD + 1 so that thread t's reads of row t hit
// distinct banks. No [S × S] matrix exists anywhere: forward keeps a running (max, sum) per row
// and saves lse; backward recomputes P = exp(s - lse).

template <class T, int HD>
inline constexpr int attention_tile = std::min(64, 8192 / (HD * int(sizeof(T))));

struct HeadLayout {
  index_t seq, heads, d, hd;
  index_t qkv_ld, out_ld;
};

// Loads rows [r0, r0 + BT) of column block col0 (width hd, padded to HD) of a [seq × *] matrix into
// tile[BT][LD]; rows past seq load as 0.
template <class T, int BT, int HD, int LD>
__device__ __forceinline__ void load_tile(T (*tile)[LD], const T* base, index_t ld, index_t r0, index_t seq,
                                          index_t col0, index_t hd) {
  for (int e = threadIdx.x; e < BT * HD; e += blockDim.x) {
    const int rr = e / HD, c = e % HD;
    const index_t r = r0 + rr;
    tile[rr][c] = (r < seq && c < hd) ? base[r * ld + col0 + c] : T(0);
  }
}

template <class T, int HD>
__global__ void attention_forward_kernel(MatrixView<T> out, T* lse, MatrixView<const T> qkv, HeadLayout L, T scale) {
  constexpr int BT = attention_tile<T, HD>;
  __shared__ T sq[BT][HD + 1];
  __shared__ T sk[BT][HD];
  __shared__ T sv[BT][HD];
  const index_t bh = blockIdx.y, b = bh / L.heads, h = bh % L.heads;
  const index_t i0 = index_t(blockIdx.x) * BT, i = i0 + threadIdx.x;
  const T* base = qkv.data + b * L.seq * L.qkv_ld;
  load_tile<T, BT, HD, HD + 1>(sq, base, L.qkv_ld, i0, L.seq, h * L.hd, L.hd);
  T o[HD];
#pragma unroll
  for (int c = 0; c < HD; ++c) o[c] = T(0);
  T m = neg_inf<T>(), l = T(0);
  const index_t last = min(L.seq, i0 + BT) - 1;  // the tile's last query: keys [0, last] matter
  for (index_t j0 = 0; j0 <= last; j0 += BT) {
    __syncthreads();
    load_tile<T, BT, HD, HD>(sk, base, L.qkv_ld, j0, L.seq, L.d + h * L.hd, L.hd);
    load_tile<T, BT, HD, HD>(sv, base, L.qkv_ld, j0, L.seq, 2 * L.d + h * L.hd, L.hd);
    __syncthreads();
    if (i >= L.seq) continue;
    const int jn = static_cast<int>(min(index_t(BT), i - j0 + 1));  // causal: keys j <= i
    for (int jj = 0; jj < jn; ++jj) {
      T s = T(0);
#pragma unroll
      for (int c = 0; c < HD; ++c) s += sq[threadIdx.x][c] * sk[jj][c];
      s *= scale;
      if (s > m) {  // online softmax: rescale what was accumulated under the old max
        const T corr = exp_(m - s);
        l *= corr;
#pragma unroll
        for (int c = 0; c < HD; ++c) o[c] *= corr;
        m = s;
      }
      const T p = exp_(s - m);
      l += p;
#pragma unroll
      for (int c = 0; c < HD; ++c) o[c] += p * sv[jj][c];
    }
  }
  if (i >= L.seq) return;
  const T inv = T(1) / l;
  T* orow = out.data + (b * L.seq + i) * L.out_ld + h * L.hd;
#pragma unroll
  for (int c = 0; c < HD; ++c)
    if (c < L.hd) orow[c] = o[c] * inv;
  lse[bh * L.seq + i] = m + log_(l);
}

// dQ: thread = query i; streams key tiles. dS_ij = P_ij (dO_i·v_j - D_i), D_i = dO_i·O_i;
// dq_i += scale Σ_j dS_ij k_j.
template <class T, int HD>
__global__ void attention_backward_dq_kernel(MatrixView<T> dqkv, MatrixView<const T> dout, MatrixView<const T> out,
                                             const T* lse, MatrixView<const T> qkv, HeadLayout L, T scale,
                                             index_t dqkv_ld, index_t dout_ld) {
  constexpr int BT = attention_tile<T, HD>;
  __shared__ T sq[BT][HD + 1];
  __shared__ T sdo[BT][HD + 1];
  __shared__ T sk[BT][HD];
  __shared__ T sv[BT][HD];
  const index_t bh = blockIdx.y, b = bh / L.heads, h = bh % L.heads;
  const index_t i0 = index_t(blockIdx.x) * BT, i = i0 + threadIdx.x;
  const T* base = qkv.data + b * L.seq * L.qkv_ld;
  load_tile<T, BT, HD, HD + 1>(sq, base, L.qkv_ld, i0, L.seq, h * L.hd, L.hd);
  load_tile<T, BT, HD, HD + 1>(sdo, dout.data + b * L.seq * dout_ld, dout_ld, i0, L.seq, h * L.hd, L.hd);
  __syncthreads();
  T di = T(0), row_lse = T(0);
  if (i < L.seq) {
    const T* orow = out.data + (b * L.seq + i) * L.out_ld + h * L.hd;
    for (index_t c = 0; c < L.hd; ++c) di += sdo[threadIdx.x][c] * orow[c];
    row_lse = lse[bh * L.seq + i];
  }
  T dq[HD];
#pragma unroll
  for (int c = 0; c < HD; ++c) dq[c] = T(0);
  const index_t last = min(L.seq, i0 + BT) - 1;
  for (index_t j0 = 0; j0 <= last; j0 += BT) {
    __syncthreads();
    load_tile<T, BT, HD, HD>(sk, base, L.qkv_ld, j0, L.seq, L.d + h * L.hd, L.hd);
    load_tile<T, BT, HD, HD>(sv, base, L.qkv_ld, j0, L.seq, 2 * L.d + h * L.hd, L.hd);
    __syncthreads();
    if (i >= L.seq) continue;
    const int jn = static_cast<int>(min(index_t(BT), i - j0 + 1));
    for (int jj = 0; jj < jn; ++jj) {
      T s = T(0), dp = T(0);
#pragma unroll
      for (int c = 0; c < HD; ++c) {
        s += sq[threadIdx.x][c] * sk[jj][c];
        dp += sdo[threadIdx.x][c] * sv[jj][c];
      }
      const T p = exp_(s * scale - row_lse);
      const T ds = p * (dp - di);
#pragma unroll
      for (int c = 0; c < HD; ++c) dq[c] += ds * sk[jj][c];
    }
  }
  if (i >= L.seq) return;
  T* drow = dqkv.data + (b * L.seq + i) * dqkv_ld + h * L.hd;
#pragma unroll
  for (int c = 0; c < HD; ++c)
    if (c < L.hd) drow[c] += scale * dq[c];
}

// dK, dV: thread = key j; streams query tiles i >= j. dv_j += Σ_i P_ij dO_i, dk_j += scale Σ_i dS_ij q_i.
template <class T, int HD>
__global__ void attention_backward_dkdv_kernel(MatrixView<T> dqkv, MatrixView<const T> dout, MatrixView<const T> out,
                                               const T* lse, MatrixView<const T> qkv, HeadLayout L, T scale,
                                               index_t dqkv_ld, index_t dout_ld) {
  constexpr int BT = attention_tile<T, HD>;
  __shared__ T sk[BT][HD + 1];
  __shared__ T sv[BT][HD + 1];
  __shared__ T sq[BT][HD];
  __shared__ T sdo[BT][HD];
  __shared__ T slse[BT], sd[BT];
  const index_t bh = blockIdx.y, b = bh / L.heads, h = bh % L.heads;
  const index_t j0 = index_t(blockIdx.x) * BT, j = j0 + threadIdx.x;
  const T* base = qkv.data + b * L.seq * L.qkv_ld;
  const T* dbase = dout.data + b * L.seq * dout_ld;
  load_tile<T, BT, HD, HD + 1>(sk, base, L.qkv_ld, j0, L.seq, L.d + h * L.hd, L.hd);
  load_tile<T, BT, HD, HD + 1>(sv, base, L.qkv_ld, j0, L.seq, 2 * L.d + h * L.hd, L.hd);
  T dk[HD], dv[HD];
#pragma unroll
  for (int c = 0; c < HD; ++c) dk[c] = dv[c] = T(0);
  for (index_t i0 = j0; i0 < L.seq; i0 += BT) {  // query tiles at or after this key tile
    __syncthreads();
    load_tile<T, BT, HD, HD>(sq, base, L.qkv_ld, i0, L.seq, h * L.hd, L.hd);
    load_tile<T, BT, HD, HD>(sdo, dbase, dout_ld, i0, L.seq, h * L.hd, L.hd);
    __syncthreads();
    {  // thread t prepares D and lse of query row i0 + t
      const index_t i = i0 + threadIdx.x;
      T di = T(0), l = T(0);
      if (i < L.seq) {
        const T* orow = out.data + (b * L.seq + i) * L.out_ld + h * L.hd;
        for (index_t c = 0; c < L.hd; ++c) di += sdo[threadIdx.x][c] * orow[c];
        l = lse[bh * L.seq + i];
      }
      sd[threadIdx.x] = di;
      slse[threadIdx.x] = l;
    }
    __syncthreads();
    if (j >= L.seq) continue;
    const int in = static_cast<int>(min(index_t(BT), L.seq - i0));
    for (int ii = 0; ii < in; ++ii) {
      if (i0 + ii < j) continue;  // causal: only queries i >= j see key j
      T s = T(0), dp = T(0);
#pragma unroll
      for (int c = 0; c < HD; ++c) {
        s += sq[ii][c] * sk[threadIdx.x][c];
        dp += sdo[ii][c] * sv[threadIdx.x][c];
      }
      const T p = exp_(s * scale - slse[ii]);
      const T ds = p * (dp - sd[ii]);
#pragma unroll
      for (int c = 0; c < HD; ++c) {
        dv[c] += p * sdo[ii][c];
        dk[c] += ds * sq[ii][c];
      }
    }
  }
  if (j >= L.seq) return;
  T* krow = dqkv.data + (b * L.seq + j) * dqkv_ld + L.d + h * L.hd;
  T* vrow = krow + L.d;
#pragma unroll
  for (int c = 0; c < HD; ++c)
    if (c < L.hd) {
      krow[c] += scale * dk[c];
      vrow[c] += dv[c];
    }
}

// ---- packed and grouped causal attention (routed assembly; cpu/routing.hpp, cpu/grouped.hpp) -----
//
// Packed: query row i is token q_tok[i] (ascending); it attends to the key rows j of the same
// sequence with token k_tok[j] <= q_tok[i] (k_tok null: key row j is token j) — one contiguous key
// range per query, found by binary search. Grouped (core/groups.hpp): the same within each row
// group g = query rows [offsets[g], offsets[g+1]), whose keys are group g's own matrices k[g], v[g]
// (k_tok null: all their kv_rows rows, row t = token t; k_tok given: the rows of g's own row range).
// The packed op is the grouped op with one group (offsets null: queries [0, nq), keys [0, nk)), so
// both run these kernels. The offsets stay in device memory: each thread finds its row's group by
// binary search (the host never learns the group sizes), and the grids are sized from host bounds.
//
// A tile may straddle two sequences or groups: the block walks the tile's groups in row order
// (a group's rows are consecutive), streams the union of that group's rows' ranges from that
// group's matrices, and each thread skips other groups and keys outside its own range. lse is
// [nq × heads] (row i, head h); a query without keys gets lse = -inf and a zero row.

struct PackedLayout {
  index_t nq;  // query rows (grouped: the bound of the offsets)
  index_t nk;  // key rows: packed k.rows; grouped without k_tok kv_rows (per group), with k_tok nq
  index_t seq, heads, hd;
  const token_t* q_tok;
  const token_t* k_tok;    // null: key row j is token j
  const token_t* offsets;  // null: one group (the packed op); else count + 1 row offsets (device)
  int count;               // groups (1 without offsets)
};

// Rows at data, ld apart (one group's key or value matrix, or a gradient of one).
template <class U>
struct RowsAt {
  U* data;
  index_t ld;
  __device__ __forceinline__ U* row(index_t r) const { return data + r * ld; }
};
// The packed op's keys and values (or their gradients): the same matrices for every row.
template <class U>
struct OneKV {
  U* k;
  index_t k_ld;
  U* v;
  index_t v_ld;
  __device__ __forceinline__ RowsAt<U> keys(int) const { return {k, k_ld}; }
  __device__ __forceinline__ RowsAt<U> values(int) const { return {v, v_ld}; }
};
// The grouped op's: group g's at k[g], v[g] (PerGroup tables, kernel parameters), rows ld apart.
template <class U>
struct GroupKV {
  PerGroup<U> k, v;
  index_t ld;
  __device__ __forceinline__ RowsAt<U> keys(int g) const { return {k.base + k.at[std::size_t(g)], ld}; }
  __device__ __forceinline__ RowsAt<U> values(int g) const { return {v.base + v.at[std::size_t(g)], ld}; }
};

__device__ __forceinline__ index_t clamp_rows(index_t r, index_t n) { return r < 0 ? 0 : (r > n ? n : r); }
// Rows [b, e) of group g in a row space of n rows; clamped, so that bad offsets (reported by
// check_offsets) never index out of bounds.
__device__ __forceinline__ void group_rows(const PackedLayout& L, int g, index_t n, index_t& b, index_t& e) {
  if (!L.offsets) {
    b = 0, e = n;
    return;
  }
  b = clamp_rows(L.offsets[g], n);
  e = max(b, clamp_rows(L.offsets[g + 1], n));
}
// The rows [offsets[0], offsets[count]) of all groups.
__device__ __forceinline__ void grouped_span(const PackedLayout& L, index_t n, index_t& b, index_t& e) {
  if (!L.offsets) {
    b = 0, e = n;
    return;
  }
  b = clamp_rows(L.offsets[0], n);
  e = max(b, clamp_rows(L.offsets[L.count], n));
}
// The group of a row r in the span: the last g < count with offsets[g] <= r (skips empty groups).
__device__ __forceinline__ int group_of(const PackedLayout& L, index_t r) {
  if (!L.offsets) return 0;
  int lo = 0, hi = L.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (L.offsets[mid] <= r) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}
// Offsets must be non-decreasing in [0, nq] (the CPU checks this on the host; here the first bad
// entry is reported and the clamping above keeps every access in bounds).
__device__ __forceinline__ void check_offsets(const PackedLayout& L, int* error) {
  for (int g = threadIdx.x; g <= L.count; g += blockDim.x) {
    const index_t o = L.offsets[g];
    if (o < 0 || o > L.nq || (g > 0 && o < L.offsets[g - 1])) report(error, DeviceError::group_offsets, g, o, L.nq);
  }
}

// First index in sorted v[0, n) with v[i] >= x (lower) / v[i] > x (upper).
__device__ __forceinline__ index_t lower_idx(const token_t* v, index_t n, index_t x) {
  index_t lo = 0, hi = n;
  while (lo < hi) {
    const index_t mid = (lo + hi) / 2;
    if (v[mid] < x) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}
__device__ __forceinline__ index_t upper_idx(const token_t* v, index_t n, index_t x) {
  index_t lo = 0, hi = n;
  while (lo < hi) {
    const index_t mid = (lo + hi) / 2;
    if (v[mid] <= x) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}
// Key rows [lo, hi) of group g visible to a query at token t.
__device__ __forceinline__ void packed_key_range(const PackedLayout& L, int g, index_t t, index_t& lo, index_t& hi) {
  const index_t first = (t / L.seq) * L.seq;
  if (!L.k_tok) {
    lo = first, hi = t + 1;
    return;
  }
  index_t b, e;
  group_rows(L, g, L.nk, b, e);
  lo = b + lower_idx(L.k_tok + b, e - b, first);
  hi = b + upper_idx(L.k_tok + b, e - b, t);
}
// Query rows [lo, hi) of group g that see a key at token t.
__device__ __forceinline__ void packed_query_range(const PackedLayout& L, int g, index_t t, index_t& lo, index_t& hi) {
  index_t b, e;
  group_rows(L, g, L.nq, b, e);
  lo = b + lower_idx(L.q_tok + b, e - b, t);
  hi = b + upper_idx(L.q_tok + b, e - b, (t / L.seq) * L.seq + L.seq - 1);
}
// The union [ulo, uhi) of the ranges s_lo[t], s_hi[t] of the tile's threads a <= t < e.
__device__ __forceinline__ void range_union(const index_t* s_lo, const index_t* s_hi, int a, int e, index_t& ulo,
                                            index_t& uhi) {
  ulo = std::numeric_limits<index_t>::max();
  uhi = 0;
  for (int t = a; t < e; ++t)
    if (s_lo[t] < s_hi[t]) {
      ulo = min(ulo, s_lo[t]);
      uhi = max(uhi, s_hi[t]);
    }
  if (uhi == 0) ulo = 0;
}
// The end of the run of equal groups starting at tile row a (a group's rows are consecutive).
template <int BT>
__device__ __forceinline__ int group_run_end(const int* s_g, int a) {
  int e = a + 1;
  while (e < BT && s_g[e] == s_g[a]) ++e;
  return e;
}
// Loads rows [r0, r0 + BT) (rows >= rows load as 0) of column block col0 (width hd, padded to HD).
template <class T, int BT, int HD, int LD>
__device__ __forceinline__ void load_rows(T (*tile)[LD], RowsAt<const T> m, index_t r0, index_t rows, index_t col0,
                                          index_t hd) {
  for (int e = threadIdx.x; e < BT * HD; e += blockDim.x) {
    const int rr = e / HD, c = e % HD;
    const index_t r = r0 + rr;
    tile[rr][c] = (r < rows && c < hd) ? m.row(r)[col0 + c] : T(0);
  }
}

template <class T, int HD, class KV>
__global__ void attention_packed_forward_kernel(MatrixView<T> out, T* lse, MatrixView<const T> q, KV kv,
                                                PackedLayout L, T scale, int* error) {
  constexpr int BT = attention_tile<T, HD>;
  __shared__ T sq[BT][HD + 1];
  __shared__ T sk[BT][HD];
  __shared__ T sv[BT][HD];
  __shared__ index_t s_lo[BT], s_hi[BT];
  __shared__ int s_g[BT];
  const index_t h = blockIdx.y, col0 = h * L.hd;
  const index_t i0 = index_t(blockIdx.x) * BT, i = i0 + threadIdx.x;
  if (L.offsets && blockIdx.x == 0 && h == 0) check_offsets(L, error);
  index_t rb, re;
  grouped_span(L, L.nq, rb, re);
  if (i0 >= re || i0 + BT <= rb) return;  // no row of the tile is in a group (the whole block)
  load_rows<T, BT, HD, HD + 1>(sq, {q.data, q.ld}, i0, re, col0, L.hd);
  int g = -1;
  index_t lo = 0, hi = 0;
  if (i >= rb && i < re) {
    g = group_of(L, i);
    index_t gb, ge;
    group_rows(L, g, L.nq, gb, ge);
    const index_t t = L.q_tok[i];
    if ((i > gb && L.q_tok[i - 1] >= t) || t < 0 || (!L.k_tok && t >= L.nk)) {
      // The position within the group, as the CPU's per-group check reports it.
      if (h == 0) report(error, DeviceError::packed_positions, i - gb, t, L.nk);
    } else {
      packed_key_range(L, g, t, lo, hi);
    }
  }
  s_g[threadIdx.x] = g;
  s_lo[threadIdx.x] = lo;
  s_hi[threadIdx.x] = hi;
  __syncthreads();
  T o[HD];
#pragma unroll
  for (int c = 0; c < HD; ++c) o[c] = T(0);
  T m = neg_inf<T>(), l = T(0);
  for (int a = 0, e = 0; a < BT; a = e) {  // the tile's groups (every thread runs every pass)
    e = group_run_end<BT>(s_g, a);
    const int gg = s_g[a];
    if (gg < 0) continue;
    index_t ulo, uhi;
    range_union(s_lo, s_hi, a, e, ulo, uhi);
    const RowsAt<const T> K = kv.keys(gg), V = kv.values(gg);
    for (index_t j0 = ulo; j0 < uhi; j0 += BT) {
      __syncthreads();
      load_rows<T, BT, HD, HD>(sk, K, j0, uhi, col0, L.hd);
      load_rows<T, BT, HD, HD>(sv, V, j0, uhi, col0, L.hd);
      __syncthreads();
      if (g != gg) continue;
      for (int jj = 0; jj < BT; ++jj) {
        const index_t j = j0 + jj;
        if (j < lo || j >= hi) continue;
        T s = T(0);
#pragma unroll
        for (int c = 0; c < HD; ++c) s += sq[threadIdx.x][c] * sk[jj][c];
        s *= scale;
        if (s > m) {
          const T corr = exp_(m - s);
          l *= corr;
#pragma unroll
          for (int c = 0; c < HD; ++c) o[c] *= corr;
          m = s;
        }
        const T p = exp_(s - m);
        l += p;
#pragma unroll
        for (int c = 0; c < HD; ++c) o[c] += p * sv[jj][c];
      }
    }
  }
  if (g < 0) return;  // rows outside every group are untouched
  const T inv = l > T(0) ? T(1) / l : T(0);
  T* orow = out.data + i * out.ld + col0;
#pragma unroll
  for (int c = 0; c < HD; ++c)
    if (c < L.hd) orow[c] = o[c] * inv;
  lse[i * L.heads + h] = l > T(0) ? m + log_(l) : neg_inf<T>();
}

template <class T, int HD, class KV>
__global__ void attention_packed_backward_dq_kernel(MatrixView<T> dq, MatrixView<const T> dout, MatrixView<const T> out,
                                                    const T* lse, MatrixView<const T> q, KV kv, PackedLayout L,
                                                    T scale) {
  constexpr int BT = attention_tile<T, HD>;
  __shared__ T sq[BT][HD + 1];
  __shared__ T sdo[BT][HD + 1];
  __shared__ T sk[BT][HD];
  __shared__ T sv[BT][HD];
  __shared__ index_t s_lo[BT], s_hi[BT];
  __shared__ int s_g[BT];
  const index_t h = blockIdx.y, col0 = h * L.hd;
  const index_t i0 = index_t(blockIdx.x) * BT, i = i0 + threadIdx.x;
  index_t rb, re;
  grouped_span(L, L.nq, rb, re);
  if (i0 >= re || i0 + BT <= rb) return;
  load_rows<T, BT, HD, HD + 1>(sq, {q.data, q.ld}, i0, re, col0, L.hd);
  load_rows<T, BT, HD, HD + 1>(sdo, {dout.data, dout.ld}, i0, re, col0, L.hd);
  int g = -1;
  index_t lo = 0, hi = 0;
  T di = T(0), row_lse = T(0);
  if (i >= rb && i < re) {
    g = group_of(L, i);
    row_lse = lse[i * L.heads + h];
    if (row_lse != neg_inf<T>()) packed_key_range(L, g, L.q_tok[i], lo, hi);
  }
  s_g[threadIdx.x] = g;
  s_lo[threadIdx.x] = lo;
  s_hi[threadIdx.x] = hi;
  __syncthreads();
  if (g >= 0)
    for (index_t c = 0; c < L.hd; ++c) di += sdo[threadIdx.x][c] * out.data[i * out.ld + col0 + c];
  T acc[HD];
#pragma unroll
  for (int c = 0; c < HD; ++c) acc[c] = T(0);
  for (int a = 0, e = 0; a < BT; a = e) {
    e = group_run_end<BT>(s_g, a);
    const int gg = s_g[a];
    if (gg < 0) continue;
    index_t ulo, uhi;
    range_union(s_lo, s_hi, a, e, ulo, uhi);
    const RowsAt<const T> K = kv.keys(gg), V = kv.values(gg);
    for (index_t j0 = ulo; j0 < uhi; j0 += BT) {
      __syncthreads();
      load_rows<T, BT, HD, HD>(sk, K, j0, uhi, col0, L.hd);
      load_rows<T, BT, HD, HD>(sv, V, j0, uhi, col0, L.hd);
      __syncthreads();
      if (g != gg) continue;
      for (int jj = 0; jj < BT; ++jj) {
        const index_t j = j0 + jj;
        if (j < lo || j >= hi) continue;
        T s = T(0), dp = T(0);
#pragma unroll
        for (int c = 0; c < HD; ++c) {
          s += sq[threadIdx.x][c] * sk[jj][c];
          dp += sdo[threadIdx.x][c] * sv[jj][c];
        }
        const T ds = exp_(s * scale - row_lse) * (dp - di);
#pragma unroll
        for (int c = 0; c < HD; ++c) acc[c] += ds * sk[jj][c];
      }
    }
  }
  if (g < 0 || lo >= hi) return;
  T* drow = dq.data + i * dq.ld + col0;
#pragma unroll
  for (int c = 0; c < HD; ++c)
    if (c < L.hd) drow[c] += scale * acc[c];
}

// One thread per key row. With k_tok the key rows are packed like the queries (grouped: the same
// row groups), so blocks tile them and look the group up per row; without k_tok every group has
// its own keys 0 .. nk, and block x is (group, key tile) = (x / tiles, x % tiles). Different
// groups' gradient rows are disjoint either way, so the accumulation needs no atomics.
template <class T, int HD, class KV, class DKV>
__global__ void attention_packed_backward_dkdv_kernel(DKV dkv, MatrixView<const T> dout, MatrixView<const T> out,
                                                      const T* lse, MatrixView<const T> q, KV kv, PackedLayout L,
                                                      T scale) {
  constexpr int BT = attention_tile<T, HD>;
  __shared__ T sk[BT][HD + 1];
  __shared__ T sv[BT][HD + 1];
  __shared__ T sq[BT][HD];
  __shared__ T sdo[BT][HD];
  __shared__ T slse[BT], sd[BT];
  __shared__ index_t s_lo[BT], s_hi[BT];
  __shared__ int s_g[BT];
  const index_t h = blockIdx.y, col0 = h * L.hd;
  int block_group = -1;  // the block's group (without k_tok)
  index_t j0, rb, re;
  if (L.k_tok) {
    j0 = index_t(blockIdx.x) * BT;
    grouped_span(L, L.nk, rb, re);
  } else {
    const index_t tiles = (L.nk + BT - 1) / BT;
    block_group = static_cast<int>(blockIdx.x / tiles);
    j0 = (index_t(blockIdx.x) % tiles) * BT;
    group_rows(L, block_group, L.nq, rb, re);
    if (rb >= re) return;  // an empty group: its keys get no gradient
    rb = 0, re = L.nk;
  }
  if (j0 >= re || j0 + BT <= rb) return;
  const index_t j = j0 + threadIdx.x;
  int g = -1;
  index_t lo = 0, hi = 0;
  if (j >= rb && j < re) {
    g = block_group >= 0 ? block_group : group_of(L, j);
    packed_query_range(L, g, L.k_tok ? L.k_tok[j] : j, lo, hi);
  }
  s_g[threadIdx.x] = g;
  s_lo[threadIdx.x] = lo;
  s_hi[threadIdx.x] = hi;
  __syncthreads();
  for (int e = threadIdx.x; e < BT * HD; e += blockDim.x) {  // own tile: row rr from its group's matrices
    const int rr = e / HD, c = e % HD, gr = s_g[rr];
    const bool in = gr >= 0 && c < L.hd;
    sk[rr][c] = in ? kv.keys(gr).row(j0 + rr)[col0 + c] : T(0);
    sv[rr][c] = in ? kv.values(gr).row(j0 + rr)[col0 + c] : T(0);
  }
  T gk[HD], gv[HD];
#pragma unroll
  for (int c = 0; c < HD; ++c) gk[c] = gv[c] = T(0);
  for (int a = 0, e = 0; a < BT; a = e) {
    e = group_run_end<BT>(s_g, a);
    if (s_g[a] < 0) continue;
    index_t ulo, uhi;
    range_union(s_lo, s_hi, a, e, ulo, uhi);
    for (index_t i0 = ulo; i0 < uhi; i0 += BT) {
      __syncthreads();
      load_rows<T, BT, HD, HD>(sq, {q.data, q.ld}, i0, uhi, col0, L.hd);
      load_rows<T, BT, HD, HD>(sdo, {dout.data, dout.ld}, i0, uhi, col0, L.hd);
      __syncthreads();
      {  // thread t prepares D and lse of query row i0 + t
        const index_t i = i0 + threadIdx.x;
        T di = T(0), l = neg_inf<T>();
        if (i < uhi) {
          for (index_t c = 0; c < L.hd; ++c) di += sdo[threadIdx.x][c] * out.data[i * out.ld + col0 + c];
          l = lse[i * L.heads + h];
        }
        sd[threadIdx.x] = di;
        slse[threadIdx.x] = l;
      }
      __syncthreads();
      if (g != s_g[a]) continue;
      for (int ii = 0; ii < BT; ++ii) {
        const index_t i = i0 + ii;
        if (i < lo || i >= hi) continue;
        T s = T(0), dp = T(0);
#pragma unroll
        for (int c = 0; c < HD; ++c) {
          s += sq[ii][c] * sk[threadIdx.x][c];
          dp += sdo[ii][c] * sv[threadIdx.x][c];
        }
        const T p = exp_(s * scale - slse[ii]);
        const T ds = p * (dp - sd[ii]);
#pragma unroll
        for (int c = 0; c < HD; ++c) {
          gv[c] += p * sdo[ii][c];
          gk[c] += ds * sq[ii][c];
        }
      }
    }
  }
  if (g < 0 || lo >= hi) return;
  T* krow = dkv.keys(g).row(j) + col0;
  T* vrow = dkv.values(g).row(j) + col0;
#pragma unroll
  for (int c = 0; c < HD; ++c)
    if (c < L.hd) {
      krow[c] += scale * gk[c];
      vrow[c] += gv[c];
    }
}

// ---- router top-K and balance loss (routed assembly; cpu/routing.hpp) -------------------------

// Thread per row: probs = softmax(inv_temp·logits), top-K by insertion (ties to the lower index),
// weights optionally renormalised. Same operation order as the CPU op.
template <class T>
__global__ void route_topk_forward_kernel(MatrixView<T> weights, MatrixView<token_t> picks, MatrixView<T> probs,
                                          MatrixView<const T> logits, T inv_temp, bool renormalise) {
  const index_t E = logits.cols, k = weights.cols;
  MOM_GRID_STRIDE(r, logits.rows) {
    const T* x = logits.data + r * logits.ld;
    T* p = probs.data + r * probs.ld;
    T m = neg_inf<T>();
    for (index_t e = 0; e < E; ++e) m = max(m, x[e] * inv_temp);
    T sum = T(0);
    for (index_t e = 0; e < E; ++e) sum += (p[e] = exp_(x[e] * inv_temp - m));
    for (index_t e = 0; e < E; ++e) p[e] /= sum;
    T* w = weights.data + r * weights.ld;
    token_t* ind = picks.data + r * picks.ld;
    index_t filled = 0;
    for (index_t e = 0; e < E; ++e) {
      const T val = p[e];
      if (filled == k && !(val > w[k - 1])) continue;
      index_t pos = filled < k ? filled++ : k - 1;
      while (pos > 0 && val > w[pos - 1]) {
        w[pos] = w[pos - 1];
        ind[pos] = ind[pos - 1];
        --pos;
      }
      w[pos] = val;
      ind[pos] = static_cast<token_t>(e);
    }
    if (renormalise) {
      T s = T(0);
      for (index_t j = 0; j < k; ++j) s += w[j];
      for (index_t j = 0; j < k; ++j) w[j] /= s;
    }
  }
}

template <class T>
__global__ void route_topk_backward_kernel(MatrixView<T> dlogits, MatrixView<const T> dweights,
                                           MatrixView<const T> weights, MatrixView<const T> probs,
                                           MatrixView<const token_t> picks, T inv_temp, bool renormalise,
                                           const T* dprobs_col) {
  const index_t E = probs.cols, k = picks.cols;
  MOM_GRID_STRIDE(r, probs.rows) {
    const T* p = probs.data + r * probs.ld;
    const T* w = weights.data + r * weights.ld;
    const T* dw = dweights.data + r * dweights.ld;
    const token_t* ind = picks.data + r * picks.ld;
    T S = T(0), dot_w = T(0);
    if (renormalise) {
      for (index_t j = 0; j < k; ++j) S += p[ind[j]];
      for (index_t j = 0; j < k; ++j) dot_w += dw[j] * w[j];
    }
    T dot = T(0);
    if (dprobs_col)
      for (index_t e = 0; e < E; ++e) dot += p[e] * dprobs_col[e];
    for (index_t j = 0; j < k; ++j) dot += p[ind[j]] * (renormalise ? (dw[j] - dot_w) / S : dw[j]);
    T* dl = dlogits.data + r * dlogits.ld;
    for (index_t e = 0; e < E; ++e) {
      T g = dprobs_col ? dprobs_col[e] : T(0);
      for (index_t j = 0; j < k; ++j)
        if (ind[j] == e) g += renormalise ? (dw[j] - dot_w) / S : dw[j];
      dl[e] += inv_temp * p[e] * (g - dot);
    }
  }
}

// Block per class e: P_e = Σ_r probs[r, e]; terms[e] = f_e·P_e/n; dprobs_col[e] = coef·E·f_e/n.
template <class T>
__global__ void balance_terms_kernel(double* terms, T* dprobs_col, MatrixView<const T> probs, const token_t* offsets,
                                     index_t k, T coef) {
  const index_t e = blockIdx.x, n = probs.rows, E = probs.cols;
  double P = 0;
  for (index_t r = threadIdx.x; r < n; r += blockDim.x) P += double(probs.data[r * probs.ld + e]);
  P = block_reduce<double>(P);
  if (threadIdx.x == 0) {
    const double f = double(offsets[e + 1] - offsets[e]) / double(n * k);
    terms[e] = f * P / double(n);
    dprobs_col[e] = T(double(coef) * double(E) * f / double(n));
  }
}
template <class T>
__global__ void balance_sum_kernel(T* loss_out, const double* terms, index_t E, T coef) {
  double s = 0;
  for (index_t e = threadIdx.x; e < E; e += blockDim.x) s += terms[e];
  s = block_reduce<double>(s);
  if (threadIdx.x == 0) loss_out[0] = T(double(coef) * double(E) * s);
}

__global__ void slots_to_rows_kernel(token_t* rows, const token_t* slots, index_t n, index_t k) {
  MOM_GRID_STRIDE(i, n) rows[i] = static_cast<token_t>(slots[i] / k);
}

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

// Warp per row i: din[i] += w_i dout[idx_i], dweights[i] += dout[idx_i]·in[i].
template <class T>
__global__ void scatter_add_rows_backward_kernel(MatrixView<T> din, T* dweights, MatrixView<const T> dout,
                                                 MatrixView<const T> in, const token_t* idx, const T* w, int* error) {
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
    if (din.data) din.data[i * din.ld + c] += wi * g[c];
    if (dweights) acc += g[c] * in.data[i * in.ld + c];
  }
  if (dweights) {
    acc = warp_sum(acc);
    if (lane == 0) dweights[i] += acc;
  }
}

// ---- top-k and row softmax --------------------------------------------------------------------

// Thread per row: insertion into the sorted output row, as the CPU op (ties keep the lower index).
template <class T>
__global__ void topk_rows_kernel(MatrixView<T> values, MatrixView<token_t> indices, MatrixView<const T> x) {
  MOM_GRID_STRIDE(r, x.rows) {
    const T* row = x.data + r * x.ld;
    T* val = values.data + r * values.ld;
    token_t* ind = indices.data + r * indices.ld;
    const index_t k = values.cols;
    index_t filled = 0;
    for (index_t j = 0; j < x.cols; ++j) {
      const T xj = row[j];
      if (filled == k && !(xj > val[k - 1])) continue;
      index_t pos = filled < k ? filled++ : k - 1;
      while (pos > 0 && xj > val[pos - 1]) {
        val[pos] = val[pos - 1];
        ind[pos] = ind[pos - 1];
        --pos;
      }
      val[pos] = xj;
      ind[pos] = static_cast<token_t>(j);
    }
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

// ---- GRU cell pointwise parts (gate order r, z, n; see cpu/gru.hpp) ---------------------------

template <class T>
__global__ void gru_forward_kernel(MatrixView<T> h_out, MatrixView<const T> gates, MatrixView<const T> h) {
  const index_t H = h_out.cols;
  MOM_GRID_STRIDE(e, h_out.rows * H) {
    const index_t i = e / H, j = e % H;
    const T* gi = gates.data + i * gates.ld;
    const T* gh = gi + 3 * H;
    const T r = sigmoid_(gi[j] + gh[j]);
    const T z = sigmoid_(gi[H + j] + gh[H + j]);
    const T nn = tanh_(gi[2 * H + j] + r * gh[2 * H + j]);
    h_out.data[i * h_out.ld + j] = (T(1) - z) * nn + z * h.data[i * h.ld + j];
  }
}

template <class T>
__global__ void gru_backward_kernel(MatrixView<T> scratch, MatrixView<T> dh, MatrixView<const T> dh_out,
                                    MatrixView<const T> gates, MatrixView<const T> h) {
  const index_t H = dh_out.cols;
  MOM_GRID_STRIDE(e, dh_out.rows * H) {
    const index_t i = e / H, j = e % H;
    const T* gi = gates.data + i * gates.ld;
    const T* gh = gi + 3 * H;
    const T g = dh_out.data[i * dh_out.ld + j];
    const T hp = h.data[i * h.ld + j];
    const T r = sigmoid_(gi[j] + gh[j]);
    const T z = sigmoid_(gi[H + j] + gh[H + j]);
    const T nn = tanh_(gi[2 * H + j] + r * gh[2 * H + j]);
    const T dn_pre = g * (T(1) - z) * (T(1) - nn * nn);
    const T dz_pre = g * (hp - nn) * z * (T(1) - z);
    const T dr_pre = dn_pre * gh[2 * H + j] * r * (T(1) - r);
    T* dgi = scratch.data + i * scratch.ld;
    T* dgh = dgi + 3 * H;
    dgi[j] = dr_pre;
    dgh[j] = dr_pre;
    dgi[H + j] = dz_pre;
    dgh[H + j] = dz_pre;
    dgi[2 * H + j] = dn_pre;
    dgh[2 * H + j] = dn_pre * r;
    if (dh.data) dh.data[i * dh.ld + j] += g * z;
  }
}

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
    if (!(norm - norm == T(0))) return;  // inf or NaN: a diverged step is skipped (as the CPU op)
    if (max_norm > T(0) && norm > max_norm) clip = max_norm / norm;
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

// ---- token dispatch ---------------------------------------------------------------------------

// ids[p] = p; counts[modules[p]] += 1 (an id out of range is reported and not counted).
__global__ void module_histogram_kernel(token_t* ids, int* counts, const token_t* modules, index_t n,
                                        index_t n_modules, int* error, DeviceError code) {
  MOM_GRID_STRIDE(p, n) {
    ids[p] = static_cast<token_t>(p);
    const token_t m = modules[p];
    if (m < 0 || m >= n_modules) report(error, code, p, m, n_modules);
    else atomicAdd(counts + m, 1);
  }
}

}  // namespace dev

// ---- launchers --------------------------------------------------------------------------------

void to_bf16(const Context& ctx, std::uint16_t* out, MatrixView<const float> in) {
  const index_t n = in.rows * in.cols;
  dev::launch("to_bf16", ctx, dev::blocks_for(n), dev::threads, dev::to_bf16_kernel, out, in);
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

template <class T>
void Kernels<T>::embedding_forward(const Context& ctx, M out, const token_t* tokens, CM wte, CM wpe, index_t seq) {
  dev::launch("embedding_forward", ctx, dev::blocks_for(out.rows * out.cols), dev::threads,
              dev::embedding_forward_kernel<T>, out, tokens, wte, wpe, seq, ctx.error);
}
template <class T>
void Kernels<T>::embedding_backward(const Context& ctx, M dwte, M dwpe, CM dout, const token_t* tokens, index_t seq,
                                    index_t vocab) {
  if (dwte.empty() && dwpe.empty()) return;
  dev::launch("embedding_backward", ctx, dev::blocks_for(dout.rows * dout.cols), dev::threads,
              dev::embedding_backward_kernel<T>, dwte, dwpe, dout, tokens, seq, vocab, ctx.error);
}

template <class T>
void Kernels<T>::layernorm_forward(const Context& ctx, M out, T* mean, T* rstd, CM x, const T* gamma, const T* beta,
                                   T eps) {
  dev::launch("layernorm_forward", ctx, dev::blocks_exact(x.rows, dev::warps_per_block), dev::threads,
              dev::layernorm_forward_kernel<T>, out, mean, rstd, x, gamma, beta, eps);
}
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

template <class T>
void Kernels<T>::gelu_forward(const Context& ctx, T* out, const T* x, index_t n) {
  dev::launch("gelu_forward", ctx, dev::blocks_for(n), dev::threads, dev::gelu_forward_kernel<T>, out, x, n);
}
template <class T>
void Kernels<T>::gelu_backward(const Context& ctx, T* dx, const T* x, const T* dout, index_t n) {
  dev::launch("gelu_backward", ctx, dev::blocks_for(n), dev::threads, dev::gelu_backward_kernel<T>, dx, x, dout, n);
}
template <class T>
void Kernels<T>::relu_forward(const Context& ctx, T* out, const T* x, index_t n) {
  dev::launch("relu_forward", ctx, dev::blocks_for(n), dev::threads, dev::relu_forward_kernel<T>, out, x, n);
}
template <class T>
void Kernels<T>::relu_backward(const Context& ctx, T* dx, const T* x, const T* dout, index_t n) {
  dev::launch("relu_backward", ctx, dev::blocks_for(n), dev::threads, dev::relu_backward_kernel<T>, dx, x, dout, n);
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

template <class T>
void Kernels<T>::cross_entropy_forward(const Context& ctx, T* loss_out, T* lse, CM logits, const token_t* targets,
                                       token_t ignore_index) {
  dev::launch("cross_entropy_forward", ctx, static_cast<unsigned>(logits.rows), dev::threads,
              dev::cross_entropy_lse_kernel<T>, lse, logits, targets, ignore_index, ctx.error);
  dev::launch("cross_entropy_forward", ctx, 1, 1024, dev::cross_entropy_loss_kernel<T>, loss_out, lse, logits, targets,
              ignore_index);
}
template <class T>
void Kernels<T>::cross_entropy_backward(const Context& ctx, M dlogits, CM logits, const T* lse, const token_t* targets,
                                        T dloss, token_t ignore_index) {
  dev::launch("cross_entropy_backward", ctx, 1, 1024, dev::count_targets_kernel, ctx.count, targets, logits.rows,
              logits.cols, ignore_index);
  dev::launch("cross_entropy_backward", ctx, static_cast<unsigned>(logits.rows), dev::threads,
              dev::cross_entropy_backward_kernel<T>, dlogits, logits, lse, targets, dloss, ignore_index,
              static_cast<const int*>(ctx.count), ctx.error);
}

namespace dev {
// The tensor-core path (attention_tc.cuh, included by mom_cuda.cu): false when it does not apply
// (double, Precision::FP32, head dims other than 64 and 128), and the SIMT kernels run instead.
template <class T>
bool attention_tc_forward(const Context& ctx, MatrixView<T> out, T* lse, MatrixView<const T> qkv, HeadLayout L,
                          index_t batch);
template <class T>
bool attention_tc_backward(const Context& ctx, MatrixView<T> dqkv, MatrixView<const T> dout, MatrixView<const T> out,
                           const T* lse, MatrixView<const T> qkv, HeadLayout L, index_t batch);

template <class T, int HD>
void attention_forward_hd(const Context& ctx, MatrixView<T> out, T* lse, MatrixView<const T> qkv, HeadLayout L,
                          index_t batch) {
  constexpr int BT = attention_tile<T, HD>;
  const dim3 grid(static_cast<unsigned>((L.seq + BT - 1) / BT), static_cast<unsigned>(batch * L.heads));
  launch("attention_forward", ctx, grid, BT, attention_forward_kernel<T, HD>, out, lse, qkv, L,
         T(1) / std::sqrt(T(L.hd)));
}
template <class T, int HD>
void attention_backward_hd(const Context& ctx, MatrixView<T> dqkv, MatrixView<const T> dout, MatrixView<const T> out,
                           const T* lse, MatrixView<const T> qkv, HeadLayout L, index_t batch) {
  constexpr int BT = attention_tile<T, HD>;
  const dim3 grid(static_cast<unsigned>((L.seq + BT - 1) / BT), static_cast<unsigned>(batch * L.heads));
  const T scale = T(1) / std::sqrt(T(L.hd));
  launch("attention_backward", ctx, grid, BT, attention_backward_dq_kernel<T, HD>, dqkv, dout, out, lse, qkv, L, scale,
         dqkv.ld, dout.ld);
  launch("attention_backward", ctx, grid, BT, attention_backward_dkdv_kernel<T, HD>, dqkv, dout, out, lse, qkv, L,
         scale, dqkv.ld, dout.ld);
}
}  // namespace dev

template <class T>
void Kernels<T>::attention_forward(const Context& ctx, M out, T* lse, CM qkv, index_t batch, index_t seq,
                                   index_t heads) {
  const index_t d = qkv.cols / 3, hd = d / heads;
  const dev::HeadLayout L{seq, heads, d, hd, qkv.ld, out.ld};
  if (dev::attention_tc_forward<T>(ctx, out, lse, qkv, L, batch)) return;
  if (hd <= 32) dev::attention_forward_hd<T, 32>(ctx, out, lse, qkv, L, batch);
  else if (hd <= 64) dev::attention_forward_hd<T, 64>(ctx, out, lse, qkv, L, batch);
  else dev::attention_forward_hd<T, 128>(ctx, out, lse, qkv, L, batch);
}
template <class T>
void Kernels<T>::attention_backward(const Context& ctx, M dqkv, CM dout, CM out, const T* lse, CM qkv, index_t batch,
                                    index_t seq, index_t heads) {
  const index_t d = qkv.cols / 3, hd = d / heads;
  const dev::HeadLayout L{seq, heads, d, hd, qkv.ld, out.ld};
  if (dev::attention_tc_backward<T>(ctx, dqkv, dout, out, lse, qkv, L, batch)) return;
  if (hd <= 32) dev::attention_backward_hd<T, 32>(ctx, dqkv, dout, out, lse, qkv, L, batch);
  else if (hd <= 64) dev::attention_backward_hd<T, 64>(ctx, dqkv, dout, out, lse, qkv, L, batch);
  else dev::attention_backward_hd<T, 128>(ctx, dqkv, dout, out, lse, qkv, L, batch);
}

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
                                           const T* weights) {
  if (din.empty() && !dweights) return;
  dev::launch("scatter_add_rows_backward", ctx, dev::blocks_exact(in.rows, dev::warps_per_block), dev::threads,
              dev::scatter_add_rows_backward_kernel<T>, din, dweights, dout, in, idx, weights, ctx.error);
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

template <class T>
void Kernels<T>::gru_pointwise_forward(const Context& ctx, M h_out, CM gates, CM h) {
  dev::launch("gru_cell_forward", ctx, dev::blocks_for(h_out.rows * h_out.cols), dev::threads,
              dev::gru_forward_kernel<T>, h_out, gates, h);
}
template <class T>
void Kernels<T>::gru_pointwise_backward(const Context& ctx, M scratch, M dh, CM dh_out, CM gates, CM h) {
  dev::launch("gru_cell_backward", ctx, dev::blocks_for(dh_out.rows * dh_out.cols), dev::threads,
              dev::gru_backward_kernel<T>, scratch, dh, dh_out, gates, h);
}

template <class T>
void Kernels<T>::route_topk_forward(const Context& ctx, M weights, MatrixView<token_t> picks, M probs, CM logits,
                                    T inv_temp, bool renormalise) {
  dev::launch("route_topk_forward", ctx, dev::blocks_for(logits.rows, 128), 128, dev::route_topk_forward_kernel<T>,
              weights, picks, probs, logits, inv_temp, renormalise);
}
template <class T>
void Kernels<T>::route_topk_backward(const Context& ctx, M dlogits, CM dweights, CM weights, CM probs,
                                     MatrixView<const token_t> picks, T inv_temp, bool renormalise,
                                     const T* dprobs_col) {
  dev::launch("route_topk_backward", ctx, dev::blocks_for(probs.rows, 128), 128, dev::route_topk_backward_kernel<T>,
              dlogits, dweights, weights, probs, picks, inv_temp, renormalise, dprobs_col);
}
template <class T>
void Kernels<T>::balance_loss_forward(const Context& ctx, T* loss_out, T* dprobs_col, CM probs, const token_t* offsets,
                                      index_t k, T coef) {
  dev::launch("balance_loss_forward", ctx, static_cast<unsigned>(probs.cols), dev::threads,
              dev::balance_terms_kernel<T>, ctx.partials, dprobs_col, probs, offsets, k, coef);
  dev::launch("balance_loss_forward", ctx, 1, dev::threads, dev::balance_sum_kernel<T>, loss_out,
              static_cast<const double*>(ctx.partials), probs.cols, coef);
}

namespace dev {
template <class T, int HD, class KV>
void attention_packed_forward_hd(const Context& ctx, const char* op, MatrixView<T> out, T* lse, MatrixView<const T> q,
                                 const KV& kv, const PackedLayout& L) {
  constexpr int BT = attention_tile<T, HD>;
  const dim3 grid(blocks_exact(L.nq, BT), static_cast<unsigned>(L.heads));
  launch(op, ctx, grid, BT, attention_packed_forward_kernel<T, HD, KV>, out, lse, q, kv, L, T(1) / std::sqrt(T(L.hd)),
         ctx.error);
}
template <class T, int HD, class KV, class DKV>
void attention_packed_backward_hd(const Context& ctx, const char* op, MatrixView<T> dq, const DKV& dkv,
                                  MatrixView<const T> dout, MatrixView<const T> out, const T* lse,
                                  MatrixView<const T> q, const KV& kv, const PackedLayout& L) {
  constexpr int BT = attention_tile<T, HD>;
  const T scale = T(1) / std::sqrt(T(L.hd));
  const auto heads = static_cast<unsigned>(L.heads);
  launch(op, ctx, dim3(blocks_exact(L.nq, BT), heads), BT, attention_packed_backward_dq_kernel<T, HD, KV>, dq, dout,
         out, lse, q, kv, L, scale);
  // Key tiles: of the packed key rows (k_tok given), or of every group's own nk keys.
  const unsigned key_tiles = blocks_exact(L.nk, BT);
  const unsigned key_blocks = L.k_tok ? key_tiles : key_tiles * static_cast<unsigned>(L.count);
  launch(op, ctx, dim3(key_blocks, heads), BT, attention_packed_backward_dkdv_kernel<T, HD, KV, DKV>, dkv, dout, out,
         lse, q, kv, L, scale);
}
// The head-dimension instantiations (HD: the padded register/shared-memory width).
template <class T, class KV>
void attention_forward_any(const Context& ctx, const char* op, MatrixView<T> out, T* lse, MatrixView<const T> q,
                           const KV& kv, const PackedLayout& L) {
  if (L.hd <= 32) attention_packed_forward_hd<T, 32>(ctx, op, out, lse, q, kv, L);
  else if (L.hd <= 64) attention_packed_forward_hd<T, 64>(ctx, op, out, lse, q, kv, L);
  else attention_packed_forward_hd<T, 128>(ctx, op, out, lse, q, kv, L);
}
template <class T, class KV, class DKV>
void attention_backward_any(const Context& ctx, const char* op, MatrixView<T> dq, const DKV& dkv,
                            MatrixView<const T> dout, MatrixView<const T> out, const T* lse, MatrixView<const T> q,
                            const KV& kv, const PackedLayout& L) {
  if (L.hd <= 32) attention_packed_backward_hd<T, 32>(ctx, op, dq, dkv, dout, out, lse, q, kv, L);
  else if (L.hd <= 64) attention_packed_backward_hd<T, 64>(ctx, op, dq, dkv, dout, out, lse, q, kv, L);
  else attention_packed_backward_hd<T, 128>(ctx, op, dq, dkv, dout, out, lse, q, kv, L);
}
}  // namespace dev

template <class T>
void Kernels<T>::attention_packed_forward(const Context& ctx, M out, T* lse, CM q, CM k, CM v, const token_t* q_tok,
                                          const token_t* k_tok, index_t seq, index_t heads) {
  const dev::PackedLayout L{q.rows, k.rows, seq, heads, q.cols / heads, q_tok, k_tok, nullptr, 1};
  dev::attention_forward_any<T>(ctx, "attention_packed_forward", out, lse, q,
                                dev::OneKV<const T>{k.data, k.ld, v.data, v.ld}, L);
}
template <class T>
void Kernels<T>::attention_packed_backward(const Context& ctx, M dq, M dk, M dv, CM dout, CM out, const T* lse, CM q,
                                           CM k, CM v, const token_t* q_tok, const token_t* k_tok, index_t seq,
                                           index_t heads) {
  const dev::PackedLayout L{q.rows, k.rows, seq, heads, q.cols / heads, q_tok, k_tok, nullptr, 1};
  dev::attention_backward_any<T>(ctx, "attention_packed_backward", dq, dev::OneKV<T>{dk.data, dk.ld, dv.data, dv.ld},
                                 dout, out, lse, q, dev::OneKV<const T>{k.data, k.ld, v.data, v.ld}, L);
}
template <class T>
void Kernels<T>::attention_grouped_forward(const Context& ctx, M out, T* lse, CM q, PerGroup<const T> k,
                                           PerGroup<const T> v, index_t kv_rows, index_t kv_ld, const token_t* q_tok,
                                           const token_t* k_tok, RowGroups g, index_t seq, index_t heads) {
  const dev::PackedLayout L{q.rows, k_tok ? q.rows : kv_rows, seq, heads, q.cols / heads, q_tok, k_tok, g.offsets,
                            g.count};
  dev::attention_forward_any<T>(ctx, "attention_grouped_forward", out, lse, q, dev::GroupKV<const T>{k, v, kv_ld}, L);
}
template <class T>
void Kernels<T>::attention_grouped_backward(const Context& ctx, M dq, PerGroup<T> dk, PerGroup<T> dv, CM dout, CM out,
                                            const T* lse, CM q, PerGroup<const T> k, PerGroup<const T> v,
                                            index_t kv_rows, index_t kv_ld, const token_t* q_tok, const token_t* k_tok,
                                            RowGroups g, index_t seq, index_t heads) {
  const dev::PackedLayout L{q.rows, k_tok ? q.rows : kv_rows, seq, heads, q.cols / heads, q_tok, k_tok, g.offsets,
                            g.count};
  dev::attention_backward_any<T>(ctx, "attention_grouped_backward", dq, dev::GroupKV<T>{dk, dv, kv_ld}, dout, out, lse,
                                 q, dev::GroupKV<const T>{k, v, kv_ld}, L);
}

void slots_to_rows(const Context& ctx, token_t* rows, const token_t* slots, index_t n, index_t k) {
  dev::launch("group_by_choice", ctx, dev::blocks_for(n), dev::threads, dev::slots_to_rows_kernel, rows, slots, n, k);
}

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

#if defined(MOM_CUDA_EMULATE)
// Emulation: "device" memory is host memory; a stable sort and a scan stand in for CUB.
std::size_t group_by_module_temp_bytes(index_t, index_t) { return 1; }

void group_by_module(const Context& ctx, token_t* sorted_ids, token_t* sorted_modules, token_t* offsets, int* counts,
                     const token_t* modules, index_t n, index_t n_modules, DeviceError code) {
  std::fill(counts, counts + n_modules + 1, 0);
  dev::launch("group_by_module", ctx, dev::blocks_for(n), dev::threads, dev::module_histogram_kernel, ctx.pair_ids,
              counts, modules, n, n_modules, ctx.error, code);
  std::vector<token_t> ids(ctx.pair_ids, ctx.pair_ids + n);
  std::stable_sort(ids.begin(), ids.end(), [&](token_t a, token_t b) { return modules[a] < modules[b]; });
  for (index_t j = 0; j < n; ++j) {
    sorted_ids[j] = ids[static_cast<std::size_t>(j)];
    sorted_modules[j] = modules[ids[static_cast<std::size_t>(j)]];
  }
  std::exclusive_scan(counts, counts + n_modules + 1, offsets, 0);
}
#else
// Not inline: this header is compiled once, into mom_cuda.cu.
std::size_t group_by_module_temp_bytes(index_t n_pairs, index_t n_modules) {
  std::size_t sort_bytes = 0, scan_bytes = 0;
  MOM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, static_cast<const token_t*>(nullptr),
                                                 static_cast<token_t*>(nullptr), static_cast<const token_t*>(nullptr),
                                                 static_cast<token_t*>(nullptr), static_cast<int>(n_pairs)),
                 "group_by_module");
  MOM_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, static_cast<const int*>(nullptr),
                                               static_cast<int*>(nullptr), static_cast<int>(n_modules + 1)),
                 "group_by_module");
  return std::max<std::size_t>({sort_bytes, scan_bytes, 1});
}

void group_by_module(const Context& ctx, token_t* sorted_ids, token_t* sorted_modules, token_t* offsets, int* counts,
                     const token_t* modules, index_t n, index_t n_modules, DeviceError code) {
  MOM_CUDA_CHECK(cudaMemsetAsync(counts, 0, static_cast<std::size_t>(n_modules + 1) * sizeof(int), ctx.stream),
                 "group_by_module");
  dev::launch("group_by_module", ctx, dev::blocks_for(n), dev::threads, dev::module_histogram_kernel, ctx.pair_ids,
              counts, modules, n, n_modules, ctx.error, code);
  std::size_t bytes = ctx.cub_temp_bytes;
  if (n > 0)  // LSD radix sort is stable: causal order survives inside each group
    MOM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(ctx.cub_temp, bytes, modules, sorted_modules,
                                                   static_cast<const token_t*>(ctx.pair_ids), sorted_ids,
                                                   static_cast<int>(n), 0, int(sizeof(token_t) * 8), ctx.stream),
                   "group_by_module");
  bytes = ctx.cub_temp_bytes;
  MOM_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(ctx.cub_temp, bytes, static_cast<const int*>(counts),
                                               reinterpret_cast<int*>(offsets), static_cast<int>(n_modules + 1),
                                               ctx.stream),
                 "group_by_module");
}

#endif  // MOM_CUDA_EMULATE

}  // namespace mom::cuda

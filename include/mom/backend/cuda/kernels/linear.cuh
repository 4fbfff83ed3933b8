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
// bf16 bits -> fp32 (exact).
__device__ __forceinline__ float bf16_float(std::uint16_t b) {
  const std::uint32_t u = std::uint32_t(b) << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
// Eight consecutive columns of a row per thread: with 16-byte aligned rows (vec) two 16-byte loads and one 16-byte
// store, else (and at a row's ragged end) one element at a time. The [rows × cols] block written may exceed `in`:
// what lies outside it is written as zeros (an operand padded to an aligned extent).
inline constexpr index_t bf16_chunk = 8;
#if defined(MOM_CUDA_FLOAT_UNIT)  // non-template: defined in mom_cuda.cu alone (kernels/all.cuh)
// What a staging writes of a value of `in` at column j: the value itself (to_bf16), or a function of it (the
// cross-entropy's gradient, written staged by cross_entropy_backward_bf16).
struct bf16_same {
  __device__ __forceinline__ float operator()(float v, index_t) const { return v; }
};
// Row r's chunk of columns [c0, c0 + bf16_chunk) staged as bf16(f(value, column)); with Sums, its values of `in` also
// added to s[0, bf16_chunk).
template <bool Sums, class F = bf16_same>
__device__ __forceinline__ void to_bf16_chunk(std::uint16_t* out, index_t out_ld, index_t cols, MatrixView<const float> in,
                                              index_t r, index_t c0, bool vec, float* s, F f = {}) {
  const float* src = in.data + r * in.ld + c0;
  std::uint16_t* dst = out + r * out_ld + c0;
  if (vec && r < in.rows && c0 + bf16_chunk <= in.cols) {
    const float4 a = load16<float4>(src), b = load16<float4>(src + 4);
    const auto pair = [&](float lo, float hi, index_t c) {
      return unsigned(bf16_bits(f(lo, c0 + c))) | (unsigned(bf16_bits(f(hi, c0 + c + 1))) << 16);
    };
    uint4 o;
    o.x = pair(a.x, a.y, 0), o.y = pair(a.z, a.w, 2), o.z = pair(b.x, b.y, 4), o.w = pair(b.z, b.w, 6);
    store16(dst, o);
    if constexpr (Sums) {
      s[0] += a.x, s[1] += a.y, s[2] += a.z, s[3] += a.w;
      s[4] += b.x, s[5] += b.y, s[6] += b.z, s[7] += b.w;
    }
  } else {
#pragma unroll
    for (int c = 0; c < int(bf16_chunk); ++c) {  // unrolled: s[] indexed by constants stays in registers
      if (c0 + c >= cols) continue;
      const bool inside = r < in.rows && c0 + c < in.cols;
      dst[c] = inside ? bf16_bits(f(src[c], c0 + c)) : std::uint16_t(0);
      if constexpr (Sums)
        if (inside) s[c] += src[c];
    }
  }
}
__global__ void to_bf16_kernel(std::uint16_t* out, index_t out_ld, index_t rows, index_t cols, MatrixView<const float> in,
                               bool vec) {
  const index_t chunks = (cols + bf16_chunk - 1) / bf16_chunk;
  MOM_GRID_STRIDE(i, rows * chunks) {
    const index_t r = i / chunks;
    to_bf16_chunk<false>(out, out_ld, cols, in, r, (i - r * chunks) * bf16_chunk, vec, nullptr);
  }
}
// The same staging with in's column sums added to acc[0, in.cols) (linear_backward's bias gradient under BF16: dy
// read once for its staging and its sums, instead of again by add_column_sums). A block of `threads` is
// sum_chunk_threads chunks of columns × sum_row_lanes lanes (1-D: lane = thread / sum_chunk_threads) over one chunk
// of column_chunk rows: thread (x, lane) stages chunk x of the rows lane, lane + lanes, ... (a warp's 32 chunks are
// one contiguous 1 KB run of a row), summing each column in registers; the lanes' sums meet in shared memory and
// each column gets one atomic per block and row chunk.
inline constexpr int sum_chunk_threads = 64, sum_row_lanes = threads / sum_chunk_threads;
// The end of a row chunk of the column-sum kernels below: each thread's sums s of its chunk of 8 columns into the
// block's lane rows of part, then one atomic per column of the block (first_col .. + width, below cols) into acc.
__device__ __forceinline__ void add_lane_sums(float (&part)[sum_row_lanes][sum_chunk_threads * bf16_chunk],
                                              const float (&s)[bf16_chunk], float* acc, index_t first_col,
                                              index_t cols) {
  constexpr index_t width = sum_chunk_threads * bf16_chunk;
  const index_t x = threadIdx.x % sum_chunk_threads, lane = threadIdx.x / sum_chunk_threads;
#pragma unroll
  for (int c = 0; c < int(bf16_chunk); ++c) part[lane][x * bf16_chunk + c] = s[c];
  __syncthreads();
  for (index_t j = threadIdx.x; j < width; j += threads)
    if (first_col + j < cols) {
      float t = 0.0f;
      for (int l = 0; l < sum_row_lanes; ++l) t += part[l][j];
      atomicAdd(acc + first_col + j, t);
    }
  __syncthreads();  // part is rewritten for the next row chunk
}
__global__ void to_bf16_sums_kernel(std::uint16_t* out, index_t out_ld, index_t rows, index_t cols,
                                    MatrixView<const float> in, bool vec, float* acc) {
  constexpr index_t width = sum_chunk_threads * bf16_chunk;  // the block's columns
  __shared__ float part[sum_row_lanes][width];
  const index_t x = threadIdx.x % sum_chunk_threads, lane = threadIdx.x / sum_chunk_threads;
  const index_t chunks = (cols + bf16_chunk - 1) / bf16_chunk, ch = index_t(blockIdx.x) * sum_chunk_threads + x;
  const index_t first_col = index_t(blockIdx.x) * width;
  for (index_t rc = blockIdx.y; rc * column_chunk < rows; rc += gridDim.y) {
    float s[bf16_chunk] = {};
    if (ch < chunks)
      for (index_t r = rc * column_chunk + lane, r1 = min(rows, (rc + 1) * column_chunk); r < r1; r += sum_row_lanes)
        to_bf16_chunk<true>(out, out_ld, cols, in, r, ch * bf16_chunk, vec, s);
    add_lane_sums(part, s, acc, first_col, in.cols);
  }
}
// acc[c] += Σ_r m(r, c) over a bf16 matrix [rows × cols], rows ld apart (the MLP's d(pre) under BF16, mlp_ops.hpp):
// to_bf16_sums_kernel's blocks without the staging, one 16-byte load per chunk of 8 where the rows allow it (vec).
__global__ void bf16_column_sums_kernel(float* acc, const std::uint16_t* m, index_t rows, index_t cols, index_t ld,
                                        bool vec) {
  constexpr index_t width = sum_chunk_threads * bf16_chunk;
  __shared__ float part[sum_row_lanes][width];
  const index_t x = threadIdx.x % sum_chunk_threads, lane = threadIdx.x / sum_chunk_threads;
  const index_t first_col = index_t(blockIdx.x) * width, c0 = first_col + x * bf16_chunk;
  for (index_t rc = blockIdx.y; rc * column_chunk < rows; rc += gridDim.y) {
    float s[bf16_chunk] = {};
    if (c0 < cols)
      for (index_t r = rc * column_chunk + lane, r1 = min(rows, (rc + 1) * column_chunk); r < r1; r += sum_row_lanes) {
        const std::uint16_t* row = m + r * ld + c0;
        if (vec && c0 + bf16_chunk <= cols) {
          const uint4 v = load16<uint4>(row);
          const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            s[2 * q] += bf16_float(std::uint16_t(w[q] & 0xffffu));
            s[2 * q + 1] += bf16_float(std::uint16_t(w[q] >> 16));
          }
        } else {
#pragma unroll
          for (int c = 0; c < int(bf16_chunk); ++c)
            if (c0 + c < cols) s[c] += bf16_float(row[c]);
        }
      }
    add_lane_sums(part, s, acc, first_col, cols);
  }
}
#endif  // MOM_CUDA_FLOAT_UNIT

}  // namespace dev

// ---- launchers --------------------------------------------------------------------------------

#if defined(MOM_CUDA_FLOAT_UNIT)
void to_bf16(const Context& ctx, std::uint16_t* out, index_t out_ld, MatrixView<const float> in, index_t rows,
             index_t cols, float* col_sums) {
#if defined(MOM_CUDA_EMULATE)
  const index_t n = in.rows * in.cols;
  if (n > 0) mom_emu_note_staging(static_cast<std::size_t>(n) * sizeof(float));  // a staging copy (budget tests)
#endif
  rows = std::max(rows, in.rows), cols = std::max(cols, in.cols);
  const bool vec = in.ld % 4 == 0 && out_ld % dev::bf16_chunk == 0 && dev::aligned16(in.data) && dev::aligned16(out);
  const index_t chunks = (cols + dev::bf16_chunk - 1) / dev::bf16_chunk;
  if (col_sums) {
    const dim3 grid(dev::blocks_exact(chunks, dev::sum_chunk_threads),
                    static_cast<unsigned>(std::clamp<index_t>((rows + dev::column_chunk - 1) / dev::column_chunk, 1,
                                                              dev::max_stride_blocks)));
    dev::launch("to_bf16", ctx, grid, dev::threads, dev::to_bf16_sums_kernel, out, out_ld, rows, cols, in, vec,
                col_sums);
    return;
  }
  dev::launch("to_bf16", ctx, dev::blocks_for(rows * chunks), dev::threads, dev::to_bf16_kernel, out, out_ld, rows, cols,
              in, vec);
}
void bf16_column_sums(const Context& ctx, float* acc, const std::uint16_t* m, index_t rows, index_t cols, index_t ld) {
  if (rows == 0 || cols == 0) return;
  const bool vec = ld % dev::bf16_chunk == 0 && dev::aligned16(m);
  const index_t chunks = (cols + dev::bf16_chunk - 1) / dev::bf16_chunk;
  const dim3 grid(dev::blocks_exact(chunks, dev::sum_chunk_threads),
                  static_cast<unsigned>(std::clamp<index_t>((rows + dev::column_chunk - 1) / dev::column_chunk, 1,
                                                            dev::max_stride_blocks)));
  dev::launch("bf16_column_sums", ctx, grid, dev::threads, dev::bf16_column_sums_kernel, acc, m, rows, cols, ld, vec);
}
#endif  // MOM_CUDA_FLOAT_UNIT

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

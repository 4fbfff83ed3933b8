#pragma once
// Cross-entropy on logits with an ignore index (cpu/cross_entropy.hpp): one block per row. Its backward also in the
// bf16 staging layout of the LM head's products (ops.hpp, lm_head_loss_backward).
#include "mom/backend/cuda/kernels/common.cuh"
#include "mom/backend/cuda/kernels/linear.cuh"  // to_bf16_chunk (the staging layout)

namespace mom::cuda {

namespace dev {

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

// *count = rows with a valid, non-ignored target (one block). A template (of nothing) so that each unit that launches
// it, the float and the double one (kernels/all.cuh), has its own copy without a second definition.
template <class = void>
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

// dloss / count, the weight of one counted row's gradient (0 when no row counts).
template <class T>
__device__ __forceinline__ T cross_entropy_scale(T dloss, int count) {
  return count > 0 ? dloss / T(count) : T(0);
}
// One element of a counted row's gradient, s·softmax_j − s·[j = t] (s = cross_entropy_scale).
template <class T>
__device__ __forceinline__ T cross_entropy_grad(T logit, T lse, T s, bool target) {
  const T p = s * exp_(logit - lse);
  return target ? p - s : p;
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
  const T s = cross_entropy_scale(dloss, *count);
  const T* in = logits.data + i * logits.ld;
  const T l = lse[i];
  for (index_t j = threadIdx.x; j < logits.cols; j += blockDim.x) out[j] = cross_entropy_grad(in[j], l, s, j == t);
}

#if defined(MOM_CUDA_FLOAT_UNIT)  // non-template: defined in mom_cuda.cu alone (kernels/all.cuh)
// The same gradient written as bf16 bits into rows out_ld apart, `width` columns of them: zeros in [logits.cols,
// width) (the LM head's padded vocabulary) and in ignored rows. Row i is staged as to_bf16 stages it (to_bf16_chunk,
// eight columns per thread and step, 16-byte accesses where the rows are aligned: vec) with the gradient in place of
// the value, so the bits equal cross_entropy_backward followed by to_bf16. Reads logits only: they are not written.
__global__ void cross_entropy_backward_bf16_kernel(std::uint16_t* out, index_t out_ld, index_t width,
                                                   MatrixView<const float> logits, const float* lse,
                                                   const token_t* targets, float dloss, token_t ignore_index,
                                                   const int* count, bool vec, int* error) {
  const index_t i = blockIdx.x;
  const token_t t = targets[i];
  std::uint16_t* row_out = out + i * out_ld;
  const bool counted = t != ignore_index && t >= 0 && t < logits.cols;
  if (!counted && t != ignore_index && threadIdx.x == 0)
    report(error, DeviceError::cross_entropy_target, i, t, logits.cols);
  const float s = counted ? cross_entropy_scale(dloss, *count) : 0.0f, l = counted ? lse[i] : 0.0f;
  // Row i as a one-row view: no columns where the row is ignored (all zeros).
  const MatrixView<const float> row(logits.data + i * logits.ld, 1, counted ? logits.cols : 0, logits.ld);
  const auto grad = [&](float v, index_t j) { return cross_entropy_grad(v, l, s, j == t); };
  for (index_t c0 = index_t(threadIdx.x) * bf16_chunk; c0 < width; c0 += index_t(blockDim.x) * bf16_chunk)
    to_bf16_chunk<false>(row_out, out_ld, width, row, 0, c0, vec, nullptr, grad);
}
#endif  // MOM_CUDA_FLOAT_UNIT

}  // namespace dev

// ---- launchers --------------------------------------------------------------------------------

template <class T>
void Kernels<T>::cross_entropy_forward(const Context& ctx, T* loss_out, T* lse, CM logits, const token_t* targets,
                                       token_t ignore_index) {
  dev::launch("cross_entropy_forward", ctx, static_cast<unsigned>(logits.rows), dev::threads,
              dev::cross_entropy_lse_kernel<T>, lse, logits, targets, ignore_index, ctx.error);
  dev::launch("cross_entropy_forward", ctx, 1, 1024, dev::cross_entropy_loss_kernel<T>, loss_out, lse, logits, targets,
              ignore_index);
}
// ctx.count = the rows whose target counts (count_targets_kernel): the divisor of either backward's gradient.
inline void count_targets(const Context& ctx, const token_t* targets, index_t rows, index_t vocab, token_t ignore_index) {
  dev::launch("cross_entropy_backward", ctx, 1, 1024, dev::count_targets_kernel<>, ctx.count, targets, rows, vocab,
              ignore_index);
}
template <class T>
void Kernels<T>::cross_entropy_backward(const Context& ctx, M dlogits, CM logits, const T* lse, const token_t* targets,
                                        T dloss, token_t ignore_index) {
  count_targets(ctx, targets, logits.rows, logits.cols, ignore_index);
  dev::launch("cross_entropy_backward", ctx, static_cast<unsigned>(logits.rows), dev::threads,
              dev::cross_entropy_backward_kernel<T>, dlogits, logits, lse, targets, dloss, ignore_index,
              static_cast<const int*>(ctx.count), ctx.error);
}

#if defined(MOM_CUDA_FLOAT_UNIT)
void cross_entropy_backward_bf16(const Context& ctx, std::uint16_t* out, index_t out_ld, index_t width,
                                 MatrixView<const float> logits, const float* lse, const token_t* targets, float dloss,
                                 token_t ignore_index) {
  width = std::max(width, logits.cols);
  const bool vec = logits.ld % 4 == 0 && out_ld % dev::bf16_chunk == 0 && dev::aligned16(logits.data) &&
                   dev::aligned16(out);
  count_targets(ctx, targets, logits.rows, logits.cols, ignore_index);
  dev::launch("cross_entropy_backward", ctx, static_cast<unsigned>(logits.rows), dev::threads,
              dev::cross_entropy_backward_bf16_kernel, out, out_ld, width, logits, lse, targets, dloss, ignore_index,
              static_cast<const int*>(ctx.count), vec, ctx.error);
}
#endif  // MOM_CUDA_FLOAT_UNIT

}  // namespace mom::cuda

#pragma once
// Cross-entropy on logits with an ignore index (cpu/cross_entropy.hpp): one block per row.
#include "mom/backend/cuda/kernels/common.cuh"

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
template <class T>
void Kernels<T>::cross_entropy_backward(const Context& ctx, M dlogits, CM logits, const T* lse, const token_t* targets,
                                        T dloss, token_t ignore_index) {
  dev::launch("cross_entropy_backward", ctx, 1, 1024, dev::count_targets_kernel<>, ctx.count, targets, logits.rows,
              logits.cols, ignore_index);
  dev::launch("cross_entropy_backward", ctx, static_cast<unsigned>(logits.rows), dev::threads,
              dev::cross_entropy_backward_kernel<T>, dlogits, logits, lse, targets, dloss, ignore_index,
              static_cast<const int*>(ctx.count), ctx.error);
}

}  // namespace mom::cuda

#pragma once
// The depth-routing kernels and their launchers (declared in depth_kernels.hpp), ported from the CPU
// ops of backend/cpu/depth.hpp (depth branch, commit dc98a76). nvcc only (or the emulation):
// included once, by mom_cuda.cu; the helpers (launch, block_reduce, block_exclusive_scan, report) are
// common.cuh's.
#include "mom/backend/cuda/depth_kernels.hpp"
#include "mom/backend/cuda/kernels/common.cuh"

namespace mom::cuda {

namespace dev {

// Expert choice per sequence (MoD eq. (1)), one block per sequence b. Position p is selected iff
// fewer than C positions beat it (higher score, or equal score and earlier): rank(p) < C, the same
// order as the CPU's nth_element with ties to the earlier position. The block then walks the
// sequence in chunks of blockDim positions and writes each chunk's selected positions at the running
// offset plus their exclusive prefix count, so the output is ascending in position. O(seq²) compares
// per sequence (seq <= context).
template <class T>
__global__ void select_topc_kernel(token_t* idx, const T* scores, index_t seq, index_t C) {
  const index_t b = blockIdx.x;
  const T* s = scores + b * seq;
  token_t* out = idx + b * C;
  index_t written = 0;
  for (index_t base = 0; base < seq; base += blockDim.x) {
    const index_t p = base + threadIdx.x;
    int selected = 0;
    if (p < seq) {
      const T sp = s[p];
      index_t rank = 0;
      for (index_t q = 0; q < seq && rank < C; ++q) rank += (s[q] > sp || (s[q] == sp && q < p)) ? 1 : 0;
      selected = rank < C ? 1 : 0;
    }
    int chunk_total = 0;
    const int before = block_exclusive_scan(selected, &chunk_total);
    if (selected) out[written + before] = token_t(b * seq + p);
    written += chunk_total;
  }
}

template <class T>
__global__ void selection_mask_kernel(T* mask, index_t n, const token_t* idx, index_t n_idx, int* error) {
  MOM_GRID_STRIDE(i, n_idx) {
    const token_t k = idx[i];
    if (k < 0 || k >= n) {
      report(error, DeviceError::selection_index, i, k, n);
      continue;
    }
    mask[k] = T(1);
  }
}

// Layer-skip decision (MoM eq. (9)) with early exit; one block walks the tokens in chunks, as
// select_topc_kernel does, so idx comes out ascending and *count stays on the device.
template <class T>
__global__ void skip_select_kernel(token_t* idx, token_t* count, token_t* alive, const T* logits, index_t n) {
  index_t written = 0;
  for (index_t base = 0; base < n; base += blockDim.x) {
    const index_t i = base + threadIdx.x;
    int run = 0;
    if (i < n) {
      run = logits[i] > T(0) && (alive == nullptr || alive[i] != 0) ? 1 : 0;
      if (alive) alive[i] = token_t(run);
    }
    int chunk_total = 0;
    const int before = block_exclusive_scan(run, &chunk_total);
    if (run) idx[written + before] = token_t(i);
    written += chunk_total;
  }
  if (threadIdx.x == 0) *count = token_t(written);
}

template <class T>
__global__ void sigmoid_forward_kernel(T* out, const T* x, index_t n) {
  MOM_GRID_STRIDE(i, n) out[i] = sigmoid_(x[i]);
}
template <class T>
__global__ void sigmoid_backward_kernel(T* dx, const T* out, const T* dout, index_t n) {
  MOM_GRID_STRIDE(i, n) dx[i] += dout[i] * out[i] * (T(1) - out[i]);
}

// loss = (1/n) Σ softplus(l) - t·l, summed in double by one block (stable: softplus(l) =
// max(l, 0) + log1p(e^{-|l|})); out[1] = agreeing decisions.
template <class T>
__global__ void bce_logits_forward_kernel(T* out, const T* logits, const T* targets, index_t n) {
  double loss = 0, correct = 0;
  for (index_t i = threadIdx.x; i < n; i += blockDim.x) {
    const double l = double(logits[i]), t = double(targets[i]);
    loss += max(l, 0.0) + log1p(exp(-fabs(l))) - t * l;
    correct += (l > 0) == (t > 0.5) ? 1 : 0;
  }
  loss = block_reduce<double>(loss);
  correct = block_reduce<double>(correct);
  if (threadIdx.x == 0) {
    out[0] = n > 0 ? T(loss / double(n)) : T(0);
    out[1] = T(correct);
  }
}
template <class T>
__global__ void bce_logits_backward_kernel(T* dlogits, const T* logits, const T* targets, T scale, index_t n) {
  MOM_GRID_STRIDE(i, n) dlogits[i] += scale * (sigmoid_(logits[i]) - targets[i]);
}

template <class T>
__global__ void depth_choice_rows_kernel(T* decision, T* coef, const token_t* picks, const T* weights, index_t n,
                                         index_t r) {
  MOM_GRID_STRIDE(t, n) {
    decision[t] = picks[t] >= r ? T(1) : T(-1);
    coef[t] = picks[t] == r ? weights[t] : T(1);
  }
}
template <class T>
__global__ void depth_choice_rows_backward_kernel(T* dweights, const T* dcoef, const token_t* picks, index_t n,
                                                  index_t r) {
  MOM_GRID_STRIDE(t, n) if (picks[t] == r) dweights[t] += dcoef[t];
}

}  // namespace dev

// ---- launchers --------------------------------------------------------------------------------

template <class T>
void DepthKernels<T>::select_topc_per_sequence(const Context& ctx, token_t* idx, const T* scores, index_t batch,
                                               index_t seq, index_t C) {
  if (C == 0) return;
  dev::launch("select_topc_per_sequence", ctx, dim3(unsigned(batch)), dev::threads, dev::select_topc_kernel<T>, idx,
              scores, seq, C);
}
template <class T>
void DepthKernels<T>::selection_mask(const Context& ctx, T* mask, index_t n, const token_t* idx, index_t n_idx) {
  if (n > 0) fill<T>(ctx, mask, n, T(0));
  dev::launch("selection_mask", ctx, dev::blocks_for(n_idx), dev::threads, dev::selection_mask_kernel<T>, mask, n, idx,
              n_idx, ctx.error);
}
template <class T>
void DepthKernels<T>::skip_select(const Context& ctx, token_t* idx, token_t* count, token_t* alive, const T* logits,
                                  index_t n) {
  dev::launch("skip_select", ctx, dim3(1), dev::threads, dev::skip_select_kernel<T>, idx, count, alive, logits, n);
}
template <class T>
void DepthKernels<T>::depth_choice_rows(const Context& ctx, T* decision, T* coef, const token_t* picks, const T* weights,
                                        index_t n, index_t r) {
  dev::launch("depth_choice_rows", ctx, dev::blocks_for(n), dev::threads, dev::depth_choice_rows_kernel<T>, decision,
              coef, picks, weights, n, r);
}
template <class T>
void DepthKernels<T>::depth_choice_rows_backward(const Context& ctx, T* dweights, const T* dcoef, const token_t* picks,
                                                 index_t n, index_t r) {
  dev::launch("depth_choice_rows_backward", ctx, dev::blocks_for(n), dev::threads,
              dev::depth_choice_rows_backward_kernel<T>, dweights, dcoef, picks, n, r);
}
template <class T>
void DepthKernels<T>::sigmoid_forward(const Context& ctx, T* out, const T* x, index_t n) {
  dev::launch("sigmoid_forward", ctx, dev::blocks_for(n), dev::threads, dev::sigmoid_forward_kernel<T>, out, x, n);
}
template <class T>
void DepthKernels<T>::sigmoid_backward(const Context& ctx, T* dx, const T* out, const T* dout, index_t n) {
  dev::launch("sigmoid_backward", ctx, dev::blocks_for(n), dev::threads, dev::sigmoid_backward_kernel<T>, dx, out, dout,
              n);
}
template <class T>
void DepthKernels<T>::bce_logits_forward(const Context& ctx, T* out, const T* logits, const T* targets, index_t n) {
  dev::launch("bce_logits_forward", ctx, dim3(1), dev::threads, dev::bce_logits_forward_kernel<T>, out, logits, targets,
              n);
}
template <class T>
void DepthKernels<T>::bce_logits_backward(const Context& ctx, T* dlogits, const T* logits, const T* targets, T scale,
                                          index_t n) {
  dev::launch("bce_logits_backward", ctx, dev::blocks_for(n), dev::threads, dev::bce_logits_backward_kernel<T>, dlogits,
              logits, targets, scale, n);
}

}  // namespace mom::cuda

#pragma once
// Host-side declarations of the CUDA launchers for the depth-routing ops (Mixture-of-Depths,
// layer-skip, early-exit), the counterparts of backend/cpu/depth.hpp (depth branch, commit dc98a76):
// per-sequence top-C selection, the 0/1 selection mask, the skip decision with its early-exit
// state, the logistic gate, and binary cross-entropy on logits. Plain C++; the definitions live in
// kernels/depth.cuh, compiled into mom::cuda by mom_cuda.cu. As for Kernels<T>: no shape checks
// here (cuda::Backend does them), every launcher only enqueues on ctx.stream.
#include "mom/backend/cuda/kernels.hpp"

namespace mom::cuda {

template <class T>
struct DepthKernels {
  // idx[b·C + j], j < C: the C largest of scores[b·seq .. b·seq + seq) as flat indices b·seq + p,
  // ascending in p; ties go to the earlier position. One block per sequence.
  static void select_topc_per_sequence(const Context& ctx, token_t* idx, const T* scores, index_t batch, index_t seq,
                                       index_t C);
  // mask[i] = 1 for i in idx[0 .. n_idx), 0 elsewhere; an index outside [0, n) is reported as
  // DeviceError::selection_index (and skipped).
  static void selection_mask(const Context& ctx, T* mask, index_t n, const token_t* idx, index_t n_idx);
  // The tokens i with logits[i] > 0 (and alive[i] != 0 when alive is given) in ascending order in
  // idx[0 .. count), *count their number (left in device memory), alive[i] updated to "ran".
  static void skip_select(const Context& ctx, token_t* idx, token_t* count, token_t* alive, const T* logits, index_t n);
  // Token-choice Mixture-of-Recursions' per-recursion decision and update factor (cpu/depth.hpp).
  static void depth_choice_rows(const Context& ctx, T* decision, T* coef, const token_t* picks, const T* weights,
                                index_t n, index_t r);
  static void depth_choice_rows_backward(const Context& ctx, T* dweights, const T* dcoef, const token_t* picks, index_t n,
                                         index_t r);
  static void sigmoid_forward(const Context& ctx, T* out, const T* x, index_t n);
  static void sigmoid_backward(const Context& ctx, T* dx, const T* out, const T* dout, index_t n);
  // out[0] = mean BCE on logits, out[1] = number of decisions (l > 0) agreeing with (t > ½).
  static void bce_logits_forward(const Context& ctx, T* out, const T* logits, const T* targets, index_t n);
  static void bce_logits_backward(const Context& ctx, T* dlogits, const T* logits, const T* targets, T scale,
                                  index_t n);
};

extern template struct DepthKernels<float>;
extern template struct DepthKernels<double>;

}  // namespace mom::cuda

#pragma once
// Expert-choice routing (cpu/expert_choice.hpp): expert e takes the `capacity` rows of largest probs[:, e], ties
// to the lower row. A thread per (row, expert) counts the rows ranked before its own (a row is taken when fewer
// than `capacity` are): the same selection as the CPU op, without a sort.
#include "mom/backend/cuda/kernels/common.cuh"

namespace mom::cuda {

namespace dev {

template <class T>
__global__ void expert_choice_forward_kernel(MatrixView<T> weights, MatrixView<token_t> picks, MatrixView<const T> probs,
                                             index_t capacity) {
  const index_t n = probs.rows, E = probs.cols;
  MOM_GRID_STRIDE(i, n * E) {
    const index_t r = i / E, e = i % E;
    const T v = probs.data[r * probs.ld + e];
    index_t rank = 0;
    for (index_t q = 0; q < n && rank < capacity; ++q) {
      const T u = probs.data[q * probs.ld + e];
      rank += (u > v || (u == v && q < r)) ? 1 : 0;
    }
    const bool taken = rank < capacity;
    picks.data[r * picks.ld + e] = taken ? token_t(e) : token_t(E);
    weights.data[r * weights.ld + e] = taken ? v : T(0);
  }
}

template <class T>
__global__ void expert_choice_backward_kernel(MatrixView<T> dprobs, MatrixView<const T> dweights,
                                              MatrixView<const token_t> picks) {
  const index_t E = picks.cols;
  MOM_GRID_STRIDE(i, picks.rows * E) {
    const index_t r = i / E, e = i % E;
    if (picks.data[r * picks.ld + e] == e) dprobs.data[r * dprobs.ld + e] += dweights.data[r * dweights.ld + e];
  }
}

}  // namespace dev

template <class T>
void Kernels<T>::expert_choice_forward(const Context& ctx, M weights, MatrixView<token_t> picks, CM probs,
                                       index_t capacity) {
  dev::launch("expert_choice_forward", ctx, dev::blocks_for(probs.rows * probs.cols, 128), 128,
              dev::expert_choice_forward_kernel<T>, weights, picks, probs, capacity);
}
template <class T>
void Kernels<T>::expert_choice_backward(const Context& ctx, M dprobs, CM dweights, MatrixView<const token_t> picks) {
  dev::launch("expert_choice_backward", ctx, dev::blocks_for(picks.rows * picks.cols, 128), 128,
              dev::expert_choice_backward_kernel<T>, dprobs, dweights, picks);
}

}  // namespace mom::cuda

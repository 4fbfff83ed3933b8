#pragma once
// Affinity routing (DeepSeekMoE; cpu/affinity.hpp): biased top-K over sigmoid affinities with optional
// group-limited routing, its backward, the expert loads, the bias's sign update. A thread per row; the selection
// and its backward run the CPU ops' own row bodies (backend/affinity_row.hpp), the rest the same operation order
// as the CPU ops (so both agree to rounding).
#include "mom/backend/affinity_row.hpp"
#include "mom/backend/cuda/kernels/common.cuh"

namespace mom::cuda {

namespace dev {

template <class T>
__global__ void affinity_topk_forward_kernel(MatrixView<T> weights, MatrixView<token_t> picks, MatrixView<T> probs,
                                             MatrixView<const T> scores, const T* bias, index_t shared, index_t groups,
                                             index_t top_groups, bool renormalise, T scale) {
  const index_t E = scores.cols, K = weights.cols;
  MOM_GRID_STRIDE(r, scores.rows) {  // one row: backend/affinity_row.hpp, the CPU op's body too
    backend_common::affinity_select_row(scores.data + r * scores.ld, bias, E, groups, top_groups, shared, K, renormalise,
                                        scale, weights.data + r * weights.ld, picks.data + r * picks.ld,
                                        probs.data != nullptr ? probs.data + r * probs.ld : nullptr);
  }
}

template <class T>
__global__ void affinity_topk_backward_kernel(MatrixView<T> dscores, MatrixView<const T> dweights,
                                              MatrixView<const T> scores, MatrixView<const token_t> picks,
                                              index_t shared, bool renormalise, T scale, const T* dprobs_col) {
  const index_t E = scores.cols, K = picks.cols;
  MOM_GRID_STRIDE(r, scores.rows) {
    backend_common::affinity_select_row_backward(scores.data + r * scores.ld, dweights.data + r * dweights.ld,
                                                 picks.data + r * picks.ld, E, K, shared, renormalise, scale, dprobs_col,
                                                 dscores.data + r * dscores.ld);
  }
}

template <class T>
__global__ void expert_load_add_kernel(T* load, const token_t* offsets, index_t classes) {
  MOM_GRID_STRIDE(c, classes) load[c] += T(offsets[c + 1] - offsets[c]);
}

// One thread: the mean over E loads, then every bias (E is a router's expert count: small).
template <class T>
__global__ void bias_balance_update_kernel(T* bias, const T* load, index_t E, T rate) {
  MOM_GRID_STRIDE(i, 1) {
    T mean = T(0);
    for (index_t e = 0; e < E; ++e) mean += load[e];
    mean /= T(E);
    for (index_t e = 0; e < E; ++e) bias[e] += rate * T((mean > load[e]) - (mean < load[e]));
  }
}

// DeepSeek-V3's sequence-wise balance loss (cpu/affinity.hpp, sequence_balance_forward). First a thread per
// (sequence, expert): f_{b,i} from the sequence's routed picks; then a thread per row: its gradient and its
// share Σ_i f_i s'_{t,i} / T of the loss, summed per block into partials, then one block sums them.
template <class T>
__global__ void sequence_balance_freq_kernel(MatrixView<T> freq, MatrixView<const token_t> picks, index_t shared,
                                             index_t seq) {
  const index_t E = freq.cols, K = picks.cols, kr = K - shared;
  MOM_GRID_STRIDE(bi, freq.rows * E) {
    const index_t b = bi / E, i = bi % E;
    index_t count = 0;
    for (index_t t = b * seq; t < (b + 1) * seq; ++t)
      for (index_t j = shared; j < K; ++j) count += picks.data[t * picks.ld + j] - shared == i ? 1 : 0;
    freq.data[b * freq.ld + i] = T(count) * T(E) / T(kr * seq);
  }
}
template <class T>
__global__ void sequence_balance_rows_kernel(double* partials, MatrixView<T> dscores, MatrixView<const T> freq,
                                             MatrixView<const T> scores, index_t seq, T coef) {
  const index_t n = scores.rows, E = scores.cols, batch = n / seq;
  double acc = 0;
  MOM_GRID_STRIDE(t, n) {
    const T* s = scores.data + t * scores.ld;
    const T* f = freq.data + (t / seq) * freq.ld;
    T A = T(0), dot = T(0);
    for (index_t e = 0; e < E; ++e) A += s[e];
    for (index_t e = 0; e < E; ++e) dot += f[e] * s[e] / A;
    const T c = coef / T(batch * seq) / A;
    for (index_t e = 0; e < E; ++e) dscores.data[t * dscores.ld + e] = c * (f[e] - dot);
    acc += double(dot) / double(seq);
  }
  acc = block_reduce<double>(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

}  // namespace dev

template <class T>
void Kernels<T>::affinity_topk_forward(const Context& ctx, M weights, MatrixView<token_t> picks, M probs, CM scores,
                                       const T* bias, index_t shared, index_t groups, index_t top_groups,
                                       bool renormalise, T scale) {
  dev::launch("affinity_topk_forward", ctx, dev::blocks_for(scores.rows, 128), 128,
              dev::affinity_topk_forward_kernel<T>, weights, picks, probs, scores, bias, shared, groups, top_groups,
              renormalise, scale);
}
template <class T>
void Kernels<T>::affinity_topk_backward(const Context& ctx, M dscores, CM dweights, CM scores,
                                        MatrixView<const token_t> picks, index_t shared, bool renormalise, T scale,
                                        const T* dprobs_col) {
  dev::launch("affinity_topk_backward", ctx, dev::blocks_for(scores.rows, 128), 128,
              dev::affinity_topk_backward_kernel<T>, dscores, dweights, scores, picks, shared, renormalise, scale,
              dprobs_col);
}
template <class T>
void Kernels<T>::expert_load_add(const Context& ctx, T* load, const token_t* offsets, index_t classes) {
  dev::launch("expert_load_add", ctx, dev::blocks_for(classes, 128), 128, dev::expert_load_add_kernel<T>, load, offsets,
              classes);
}
template <class T>
void Kernels<T>::bias_balance_update(const Context& ctx, T* bias, const T* load, index_t E, T rate) {
  dev::launch("bias_balance_update", ctx, 1, 1, dev::bias_balance_update_kernel<T>, bias, load, E, rate);
}

template <class T>
void Kernels<T>::sequence_balance_forward(const Context& ctx, T* loss_out, M dscores, M freq, CM scores,
                                          MatrixView<const token_t> picks, index_t shared, index_t seq, T coef) {
  dev::launch("sequence_balance_forward", ctx, dev::blocks_for(freq.rows * freq.cols), dev::threads,
              dev::sequence_balance_freq_kernel<T>, freq, picks, shared, seq);
  const unsigned blocks = std::min<unsigned>(dev::blocks_for(scores.rows), unsigned(Context::reduce_blocks));
  dev::launch("sequence_balance_forward", ctx, blocks, dev::threads, dev::sequence_balance_rows_kernel<T>, ctx.partials,
              dscores, CM(freq), scores, seq, coef);
  dev::launch("sequence_balance_forward", ctx, 1, dev::threads, dev::partials_mean_kernel<T>, loss_out,
              static_cast<const double*>(ctx.partials), index_t(blocks), scores.rows / seq, coef);
}

}  // namespace mom::cuda

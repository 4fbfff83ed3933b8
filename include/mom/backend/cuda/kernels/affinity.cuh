#pragma once
// Affinity routing (DeepSeekMoE; cpu/affinity.hpp): biased top-K over sigmoid affinities with optional
// group-limited routing, its backward, the expert loads, the bias's sign update. Thread per row, the same
// operation order as the CPU ops (so both agree to rounding).
#include "mom/backend/cuda/kernels/common.cuh"

namespace mom::cuda {

namespace dev {

template <class T>
__device__ std::uint64_t affinity_groups(const T* s, const T* bias, index_t E, index_t groups, index_t top_groups) {
  if (groups <= 1) return ~std::uint64_t(0);
  const index_t per = E / groups;
  T score[64];
  for (index_t g = 0; g < groups; ++g) {
    T a = s[g * per] + bias[g * per], b = a;
    bool second = false;
    for (index_t e = g * per + 1; e < (g + 1) * per; ++e) {
      const T v = s[e] + bias[e];
      if (v > a) b = a, a = v, second = true;
      else if (!second || v > b) b = v, second = true;
    }
    score[g] = per > 1 ? a + b : a;
  }
  std::uint64_t keep = 0;
  for (index_t m = 0; m < top_groups; ++m) {
    index_t best = -1;
    for (index_t g = 0; g < groups; ++g)
      if (!(keep >> g & 1) && (best < 0 || score[g] > score[best])) best = g;
    keep |= std::uint64_t(1) << best;
  }
  return keep;
}

template <class T>
__global__ void affinity_topk_forward_kernel(MatrixView<T> weights, MatrixView<token_t> picks, MatrixView<T> probs,
                                             MatrixView<const T> scores, const T* bias, index_t shared, index_t groups,
                                             index_t top_groups, bool renormalise, T scale) {
  const index_t E = scores.cols, K = weights.cols, k = K - shared;
  MOM_GRID_STRIDE(r, scores.rows) {
    const T* s = scores.data + r * scores.ld;
    T* w = weights.data + r * weights.ld;
    token_t* ind = picks.data + r * picks.ld;
    for (index_t j = 0; j < shared; ++j) w[j] = T(1), ind[j] = token_t(j);
    const std::uint64_t keep = affinity_groups(s, bias, E, groups, top_groups);
    const index_t per = groups > 1 ? E / groups : E;
    T* key = w + shared;
    token_t* at = ind + shared;
    index_t filled = 0;
    for (index_t e = 0; e < E; ++e) {
      if (!(keep >> (e / per) & 1)) continue;
      const T v = s[e] + bias[e];
      if (filled == k && !(v > key[k - 1])) continue;
      index_t pos = filled < k ? filled++ : k - 1;
      while (pos > 0 && v > key[pos - 1]) {
        key[pos] = key[pos - 1];
        at[pos] = at[pos - 1];
        --pos;
      }
      key[pos] = v;
      at[pos] = token_t(e);
    }
    T sum = T(0);
    for (index_t j = 0; j < k; ++j) sum += s[at[j]];
    for (index_t j = 0; j < k; ++j) {
      key[j] = renormalise ? scale * s[at[j]] / sum : scale * s[at[j]];
      at[j] = token_t(shared + at[j]);
    }
    if (probs.data != nullptr) {
      T all = T(0);
      for (index_t e = 0; e < E; ++e) all += s[e];
      for (index_t e = 0; e < E; ++e) probs.data[r * probs.ld + e] = s[e] / all;
    }
  }
}

template <class T>
__global__ void affinity_topk_backward_kernel(MatrixView<T> dscores, MatrixView<const T> dweights,
                                              MatrixView<const T> scores, MatrixView<const token_t> picks,
                                              index_t shared, bool renormalise, T scale, const T* dprobs_col) {
  const index_t E = scores.cols, K = picks.cols;
  MOM_GRID_STRIDE(r, scores.rows) {
    const T* s = scores.data + r * scores.ld;
    const T* dw = dweights.data + r * dweights.ld;
    const token_t* ind = picks.data + r * picks.ld;
    T* ds = dscores.data + r * dscores.ld;
    if (renormalise) {
      T S = T(0), dot = T(0);
      for (index_t j = shared; j < K; ++j) S += s[ind[j] - shared];
      for (index_t j = shared; j < K; ++j) dot += dw[j] * scale * s[ind[j] - shared] / S;
      for (index_t j = shared; j < K; ++j) ds[ind[j] - shared] += (scale * dw[j] - dot) / S;
    } else {
      for (index_t j = shared; j < K; ++j) ds[ind[j] - shared] += scale * dw[j];
    }
    if (dprobs_col != nullptr) {
      T A = T(0), dot = T(0);
      for (index_t e = 0; e < E; ++e) A += s[e];
      for (index_t e = 0; e < E; ++e) dot += dprobs_col[e] * s[e] / A;
      for (index_t e = 0; e < E; ++e) ds[e] += (dprobs_col[e] - dot) / A;
    }
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

#pragma once
// Routing and token dispatch (routed assembly; cpu/routing.hpp, cpu/dispatch.hpp): the router's
// softmax top-K and its backward, the balance loss, and the grouping of (token, choice) pairs by
// module (group_by_module: a histogram, then CUB's radix sort and scan; group_by_choice's slot
// to row map).
#if defined(MOM_CUDA_EMULATE)
#include <numeric>
#include <vector>
#else
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>
#endif

#include "mom/backend/cuda/kernels/common.cuh"

namespace mom::cuda {

namespace dev {

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
    topk_insert(static_cast<const T*>(p), E, k, w, ind);
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

// Selection entropy regularisers (cpu/routing.hpp, selection_entropy_forward), in three kernels over chunks of a
// sequence's rows (one block a chunk, so that one long "sequence", ModuleFormer's whole batch, spreads over the GPU:
// the single block per sequence this replaces took 24 ms of a moduleformer8 step on an H200, bench/RESULTS.md):
//   1. block (c, b), thread per row: the softmax rows of chunk c of sequence b into dlogits (and Σ s log s); thread
//      per class: the chunk's column sums; both into part[(b·chunks + c)·(C + 1) + ·] (doubles);
//   2. block b, thread per class: p[e] = Σ_c column sums / seq, Σ p log p, and the marginal term's gradient weight
//      g[e], written over chunk 0's column sum e; the sequence's weighted loss terms into partials[b];
//   3. thread per row: dlogits_t = s_t ⊙ (g + cond_coef·log s_t / n − ⟨s_t, ·⟩).
template <class T>
__global__ void entropy_softmax_kernel(double* part, MatrixView<T> dlogits, MatrixView<const T> logits, index_t seq,
                                       index_t rows, index_t chunks, T cond_coef) {
  const index_t c = blockIdx.x, b = blockIdx.y, C = logits.cols, r0 = b * seq;
  const index_t t0 = c * rows, t1 = t0 + rows < seq ? t0 + rows : seq;
  double cond = 0;
  for (index_t t = t0 + index_t(threadIdx.x); t < t1; t += blockDim.x) {
    const T* z = logits.data + (r0 + t) * logits.ld;
    T* s = dlogits.data + (r0 + t) * dlogits.ld;
    T m = z[0];
    for (index_t e = 1; e < C; ++e) m = z[e] > m ? z[e] : m;
    T sum = 0;
    for (index_t e = 0; e < C; ++e) sum += (s[e] = exp(z[e] - m));
    const T inv = T(1) / sum;
    for (index_t e = 0; e < C; ++e) {
      s[e] *= inv;
      if (cond_coef != T(0)) cond += double(s[e]) * double(log(s[e] > T(0) ? s[e] : T(1e-30)));
    }
  }
  __syncthreads();
  double* out = part + (b * chunks + c) * (C + 1);
  for (index_t e = threadIdx.x; e < C; e += blockDim.x) {
    double col = 0;
    for (index_t t = t0; t < t1; ++t) col += double(dlogits.data[(r0 + t) * dlogits.ld + e]);
    out[e] = col;
  }
  cond = block_reduce<double>(cond);
  if (threadIdx.x == 0) out[C] = cond;
}
template <class T>
__global__ void entropy_marginal_kernel(double* partials, double* part, index_t batch, index_t seq, index_t chunks,
                                        index_t C, T coef, T cond_coef) {
  const index_t b = blockIdx.x, n = batch * seq;
  double* first = part + b * chunks * (C + 1);
  double marg = 0, cond = 0;
  for (index_t e = threadIdx.x; e < C; e += blockDim.x) {
    double col = 0;
    for (index_t c = 0; c < chunks; ++c) col += first[c * (C + 1) + e];
    const T pe = T(col / double(seq));
    const T log_p = log(pe > T(0) ? pe : T(1e-30));
    marg += double(pe) * double(log_p);
    first[e] = double(coef * (log_p + T(1)) / T(n));  // g[e]: only this thread reads or writes column e of b
  }
  for (index_t c = threadIdx.x; c < chunks; c += blockDim.x) cond += first[c * (C + 1) + C];
  const double total = block_reduce<double>(double(coef) * marg / double(batch) + double(cond_coef) * cond / double(n));
  if (threadIdx.x == 0) partials[b] = total;
}
template <class T>
__global__ void entropy_gradient_kernel(MatrixView<T> dlogits, const double* part, index_t seq, index_t chunks,
                                        index_t n, T cond_coef) {
  const index_t C = dlogits.cols;
  MOM_GRID_STRIDE(r, n) {
    const double* g = part + (r / seq) * chunks * (C + 1);
    T* s = dlogits.data + r * dlogits.ld;
    T dot = 0;
    for (index_t e = 0; e < C; ++e) dot += s[e] * (T(g[e]) + cond_coef * log(s[e] > T(0) ? s[e] : T(1e-30)) / T(n));
    for (index_t e = 0; e < C; ++e) s[e] *= T(g[e]) + cond_coef * log(s[e] > T(0) ? s[e] : T(1e-30)) / T(n) - dot;
  }
}
template <class T>
__global__ void selection_entropy_sum_kernel(T* loss_out, const double* partials, index_t batch) {
  double s = 0;
  for (index_t b = threadIdx.x; b < batch; b += blockDim.x) s += partials[b];
  s = block_reduce<double>(s);
  if (threadIdx.x == 0) loss_out[0] = T(s);
}

// The router z-loss (cpu/routing.hpp, router_z_loss_forward): thread per row (grid-stride), the row's
// lse² summed per block into partials, then one block sums them and scales by coef / n.
template <class T>
__global__ void router_z_loss_kernel(double* partials, MatrixView<T> dlogits, MatrixView<const T> logits, T inv_temp,
                                     T coef) {
  const index_t n = logits.rows, C = logits.cols;
  double acc = 0;
  MOM_GRID_STRIDE(r, n) {
    const T* z = logits.data + r * logits.ld;
    T* g = dlogits.data + r * dlogits.ld;
    T m = z[0] * inv_temp;
    for (index_t e = 1; e < C; ++e) m = z[e] * inv_temp > m ? z[e] * inv_temp : m;
    T sum = 0;
    for (index_t e = 0; e < C; ++e) sum += (g[e] = exp(z[e] * inv_temp - m));
    const T lse = m + log(sum), scale = coef * T(2) * lse / T(n) * inv_temp / sum;
    for (index_t e = 0; e < C; ++e) g[e] *= scale;
    acc += double(lse) * double(lse);
  }
  acc = block_reduce<double>(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

#if defined(MOM_CUDA_FLOAT_UNIT)  // non-template: defined in mom_cuda.cu alone (kernels/all.cuh), as the launchers below
__global__ void slots_to_rows_kernel(token_t* rows, const token_t* slots, index_t n, index_t k) {
  MOM_GRID_STRIDE(i, n) rows[i] = static_cast<token_t>(slots[i] / k);
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
#endif  // MOM_CUDA_FLOAT_UNIT

}  // namespace dev

// ---- launchers --------------------------------------------------------------------------------

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

template <class T>
void Kernels<T>::selection_entropy_forward(const Context& ctx, T* loss_out, M dlogits, CM logits, index_t batch,
                                           index_t seq, T coef, T cond_coef) {
  // Chunks of at least 64 rows, as many as the scratch holds (at least one: entropy_partials has room for every
  // sequence of reduce_blocks at entropy_classes).
  const index_t C = logits.cols, n = batch * seq;
  const index_t chunks = std::clamp<index_t>(std::min((seq + 63) / 64, Context::entropy_partials / (batch * (C + 1))),
                                             1, std::max<index_t>(seq, 1));
  const index_t rows = (seq + chunks - 1) / chunks;
  dev::launch("selection_entropy_forward", ctx, dim3(unsigned(chunks), unsigned(batch)), dev::threads,
              dev::entropy_softmax_kernel<T>, ctx.entropy, dlogits, logits, seq, rows, chunks, cond_coef);
  dev::launch("selection_entropy_forward", ctx, static_cast<unsigned>(batch), dev::threads,
              dev::entropy_marginal_kernel<T>, ctx.partials, ctx.entropy, batch, seq, chunks, C, coef, cond_coef);
  dev::launch("selection_entropy_forward", ctx, dev::blocks_for(n), dev::threads, dev::entropy_gradient_kernel<T>,
              dlogits, static_cast<const double*>(ctx.entropy), seq, chunks, n, cond_coef);
  dev::launch("selection_entropy_forward", ctx, 1, dev::threads, dev::selection_entropy_sum_kernel<T>, loss_out,
              static_cast<const double*>(ctx.partials), batch);
}

template <class T>
void Kernels<T>::router_z_loss_forward(const Context& ctx, T* loss_out, M dlogits, CM logits, T inv_temp, T coef) {
  const unsigned blocks = std::min<unsigned>(dev::blocks_for(logits.rows), unsigned(Context::reduce_blocks));
  dev::launch("router_z_loss_forward", ctx, blocks, dev::threads, dev::router_z_loss_kernel<T>, ctx.partials, dlogits,
              logits, inv_temp, coef);
  dev::launch("router_z_loss_forward", ctx, 1, dev::threads, dev::partials_mean_kernel<T>, loss_out,
              static_cast<const double*>(ctx.partials), index_t(blocks), logits.rows, coef);
}

#if defined(MOM_CUDA_FLOAT_UNIT)
void slots_to_rows(const Context& ctx, token_t* rows, const token_t* slots, index_t n, index_t k) {
  dev::launch("group_by_choice", ctx, dev::blocks_for(n), dev::threads, dev::slots_to_rows_kernel, rows, slots, n, k);
}

#if defined(MOM_CUDA_EMULATE)
// Emulation: "device" memory is host memory; a stable sort and a scan stand in for CUB.
std::size_t group_by_module_temp_bytes(index_t, index_t) { return 1; }

// Stream-ordered as on a GPU: while a stream is captured (a CUDA graph) the whole of it is recorded, to run when
// the graph is launched.
void group_by_module(const Context& ctx, token_t* sorted_ids, token_t* sorted_modules, token_t* offsets, int* counts,
                     const token_t* modules, index_t n, index_t n_modules, DeviceError code) {
  const auto run = [&ctx, sorted_ids, sorted_modules, offsets, counts, modules, n, n_modules, code] {
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
  };
  ::mom_emu_enqueue(run);
}
#else
// Not inline: defined in mom_cuda.cu alone.
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
#endif  // MOM_CUDA_FLOAT_UNIT

}  // namespace mom::cuda

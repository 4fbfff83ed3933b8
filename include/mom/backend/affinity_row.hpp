#pragma once
// One row of affinity routing (DeepSeekMoE, arXiv 2401.06066; DeepSeek-V3, arXiv 2412.19437 §2.1.2), written once
// for both backends: the CPU's ops (cpu/affinity.hpp: rows over OpenMP threads) and the CUDA kernels
// (kernels/affinity.cuh: a thread per row), so both pick the same experts in the same order and compute the same
// weights. cpu/affinity.hpp documents the ops.
#include <cstdint>

#include "mom/backend/host_device.hpp"
#include "mom/backend/topk_insert.hpp"
#include "mom/core/tensor.hpp"

namespace mom::backend_common {

// Group-limited routing (V3 §2.1.2): the routed experts in `groups` equal groups, each scored by the sum of its two
// largest biased affinities (its one when a group holds a single expert); a bit per group kept among the
// `top_groups` best (ties to the lower group). All groups when groups <= 1.
template <class T>
MOM_HOST_DEVICE inline std::uint64_t affinity_groups(const T* s, const T* bias, index_t E, index_t groups,
                                                     index_t top_groups) {
  if (groups <= 1) return ~std::uint64_t(0);
  const index_t per = E / groups;
  T score[64];
  for (index_t g = 0; g < groups; ++g) {
    T a = s[g * per] + bias[g * per], b = a;  // two largest
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

// Row s [E] of affinities: the first `shared` slots of w / ind the shared experts (weight 1, classes 0 ..), then the
// K − shared routed experts of the kept groups with the largest s + bias (descending, an earlier expert wins a tie)
// as classes shared + e, weighted scale · s_e / Σ_picked s (renormalise) or scale · s_e; probs (nullptr: not
// wanted) [E] = s_e / Σ_all s.
template <class T>
MOM_HOST_DEVICE inline void affinity_select_row(const T* s, const T* bias, index_t E, index_t groups, index_t top_groups,
                                                index_t shared, index_t K, bool renormalise, T scale, T* w,
                                                token_t* ind, T* probs) {
  const index_t k = K - shared;
  for (index_t j = 0; j < shared; ++j) w[j] = T(1), ind[j] = token_t(j);
  const std::uint64_t keep = affinity_groups(s, bias, E, groups, top_groups);
  const index_t per = groups > 1 ? E / groups : E;
  T* key = w + shared;  // the biased scores while selecting, then the weights
  token_t* at = ind + shared;
  index_t filled = 0;
  for (index_t e = 0; e < E; ++e)  // the kept groups' experts by biased score (topk_insert.hpp's insertion)
    if (keep >> (e / per) & 1) topk_offer(s[e] + bias[e], token_t(e), k, filled, key, at);
  T sum = T(0);
  for (index_t j = 0; j < k; ++j) sum += s[at[j]];
  for (index_t j = 0; j < k; ++j) {
    key[j] = renormalise ? scale * s[at[j]] / sum : scale * s[at[j]];
    at[j] = token_t(shared + at[j]);
  }
  if (probs != nullptr) {
    T all = T(0);
    for (index_t e = 0; e < E; ++e) all += s[e];
    for (index_t e = 0; e < E; ++e) probs[e] = s[e] / all;
  }
}

// Its backward for one row: ds [E] += d/ds of Σ_{j >= shared} dw[j] · w[j] (+ Σ_e dprobs_col[e] · probs[e] when
// dprobs_col is not nullptr). The bias gets no gradient: it only selects.
template <class T>
MOM_HOST_DEVICE inline void affinity_select_row_backward(const T* s, const T* dw, const token_t* ind, index_t E,
                                                         index_t K, index_t shared, bool renormalise, T scale,
                                                         const T* dprobs_col, T* ds) {
  if (renormalise) {  // w_j = c·s_j / S: ds_j = (c·dw_j − Σ_i dw_i w_i) / S
    T S = T(0), dot = T(0);
    for (index_t j = shared; j < K; ++j) S += s[ind[j] - shared];
    for (index_t j = shared; j < K; ++j) dot += dw[j] * scale * s[ind[j] - shared] / S;
    for (index_t j = shared; j < K; ++j) ds[ind[j] - shared] += (scale * dw[j] - dot) / S;
  } else {
    for (index_t j = shared; j < K; ++j) ds[ind[j] - shared] += scale * dw[j];
  }
  if (dprobs_col != nullptr) {  // p_e = s_e / A: ds_e = (dp_e − Σ_i dp_i p_i) / A
    T A = T(0), dot = T(0);
    for (index_t e = 0; e < E; ++e) A += s[e];
    for (index_t e = 0; e < E; ++e) dot += dprobs_col[e] * s[e] / A;
    for (index_t e = 0; e < E; ++e) ds[e] += (dprobs_col[e] - dot) / A;
  }
}

}  // namespace mom::backend_common

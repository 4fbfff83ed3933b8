#pragma once
// Affinity routing (DeepSeekMoE, arXiv 2401.06066; DeepSeek-V3, arXiv 2412.19437 §2.1.2): top-K selection
// on sigmoid affinities plus a per-expert bias that only decides WHICH experts a token gets, never their
// gate weights; optional group-limited routing; the expert loads that drive the bias; the bias's sign
// update (auxiliary-loss-free balancing, V3 eq. (16)).
//
// Conventions as everywhere in mom::cpu: forward ops write their outputs, backward ops accumulate (+=).
#include <algorithm>
#include <cstdint>
#include <span>

#include "mom/backend/shape_checks.hpp"
#include "mom/core/check.hpp"
#include "mom/core/tensor.hpp"

namespace mom::cpu {

namespace detail {
// Group-limited routing (V3 §2.1.2): the routed experts in `groups` equal groups, each scored by the sum of
// its two largest biased affinities (its one when a group holds a single expert); a bit per group kept
// among the `top_groups` best (ties to the lower group). All groups when groups <= 1.
template <class T>
std::uint64_t affinity_groups(const T* s, const T* bias, index_t E, index_t groups, index_t top_groups) {
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
}  // namespace detail

// scores [n × E]: the routed experts' affinities σ(logits). Per row, with K = weights.cols and the first
// `shared` slots the always-on experts:
//   slots j < shared:   picks j, weight 1 (shared experts, classes 0 .. shared-1)
//   slots shared .. K-1: the K - shared routed experts with the largest scores + bias (descending, ties to
//                       the lower index; only experts of the chosen groups), as classes shared + e; weight
//                       scale · s_e / Σ_{picked} s (renormalise) or scale · s_e.
// probs [n × E] (may be empty): s_e / Σ_all s, the normalised affinities a balance loss reads.
template <class T>
void affinity_topk_forward(MatrixView<T> weights, MatrixView<token_t> picks, MatrixView<T> probs,
                           MatrixView<const T> scores, std::span<const T> bias, index_t shared, index_t groups,
                           index_t top_groups, bool renormalise, T scale) {
  checks::affinity_topk_forward_shapes<T>(weights, picks, probs, scores, ssize(bias), shared, groups, top_groups);
  const index_t n = scores.rows, E = scores.cols, K = weights.cols, k = K - shared;
#pragma omp parallel for schedule(static) if (n * E > (1 << 15))
  for (index_t r = 0; r < n; ++r) {
    const T* s = scores.row(r);
    T* w = weights.row(r);
    token_t* ind = picks.row(r);
    for (index_t j = 0; j < shared; ++j) w[j] = T(1), ind[j] = token_t(j);
    const std::uint64_t keep = detail::affinity_groups(s, bias.data(), E, groups, top_groups);
    const index_t per = groups > 1 ? E / groups : E;
    T* key = w + shared;  // the biased scores while selecting, then the weights
    token_t* at = ind + shared;
    index_t filled = 0;
    for (index_t e = 0; e < E; ++e) {  // insertion top-k, earlier index wins a tie
      if (!(keep >> (e / per) & 1)) continue;
      const T v = s[e] + bias[std::size_t(e)];
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
    if (!probs.empty()) {
      T all = T(0);
      for (index_t e = 0; e < E; ++e) all += s[e];
      for (index_t e = 0; e < E; ++e) probs(r, e) = s[e] / all;
    }
  }
}

// Backward of affinity_topk_forward: dscores += d/dscores of Σ_{r, j >= shared} dweights[r,j] · weights[r,j]
// + Σ_{r,e} dprobs_col[e] · probs[r,e] (dprobs_col may be empty: a per-column gradient shared by the rows,
// the balance loss's). The bias gets no gradient: it only selects.
template <class T>
void affinity_topk_backward(MatrixView<T> dscores, MatrixView<const T> dweights, MatrixView<const T> scores,
                            MatrixView<const token_t> picks, index_t shared, bool renormalise, T scale,
                            std::span<const T> dprobs_col) {
  checks::affinity_topk_backward_shapes<T>(dscores, dweights, scores, picks, shared, ssize(dprobs_col));
  const index_t n = scores.rows, E = scores.cols, K = picks.cols;
#pragma omp parallel for schedule(static) if (n * E > (1 << 15))
  for (index_t r = 0; r < n; ++r) {
    const T* s = scores.row(r);
    const T* dw = dweights.row(r);
    const token_t* ind = picks.row(r);
    T* ds = dscores.row(r);
    if (renormalise) {  // w_j = c·s_j / S: ds_j = (c·dw_j − Σ_i dw_i w_i) / S
      T S = T(0), dot = T(0);
      for (index_t j = shared; j < K; ++j) S += s[ind[j] - shared];
      for (index_t j = shared; j < K; ++j) dot += dw[j] * scale * s[ind[j] - shared] / S;
      for (index_t j = shared; j < K; ++j) ds[ind[j] - shared] += (scale * dw[j] - dot) / S;
    } else {
      for (index_t j = shared; j < K; ++j) ds[ind[j] - shared] += scale * dw[j];
    }
    if (!dprobs_col.empty()) {  // p_e = s_e / A: ds_e = (dp_e − Σ_i dp_i p_i) / A
      T A = T(0), dot = T(0);
      for (index_t e = 0; e < E; ++e) A += s[e];
      for (index_t e = 0; e < E; ++e) dot += dprobs_col[std::size_t(e)] * s[e] / A;
      for (index_t e = 0; e < E; ++e) ds[e] += (dprobs_col[std::size_t(e)] - dot) / A;
    }
  }
}

// DeepSeek-V3's complementary sequence-wise balance loss (arXiv 2412.19437 eqs. (17)–(20)), over the rows
// taken as sequences of `seq` consecutive rows (B = rows / seq of them), the routed experts' affinities
// scores [rows × N_r] and each row's K picks (the first `shared` slots are the shared experts, the other
// k_r = K − shared are routed classes shared .. shared + N_r − 1):
//   f_{b,i} = N_r / (k_r T) · #{t ∈ b : i picked},  s'_{t,i} = s_{t,i} / Σ_j s_{t,j},  P_{b,i} = (1/T) Σ_{t ∈ b} s'_{t,i}
//   loss = coef / B · Σ_b Σ_i f_{b,i} P_{b,i}
// f is a count (no gradient, as in Switch). Writes loss_out[0] and the loss's gradient with respect to the
// affinities, dscores[t,j] = coef / (B T) · (f_{b,j} − Σ_i f_{b,i} s'_{t,i}) / Σ_i s_{t,i}; freq [B × N_r]
// receives f.
template <class T>
void sequence_balance_forward(std::span<T> loss_out, MatrixView<T> dscores, MatrixView<T> freq,
                              MatrixView<const T> scores, MatrixView<const token_t> picks, index_t shared, index_t seq,
                              T coef) {
  checks::sequence_balance_shapes<T>(ssize(loss_out), dscores, freq, scores, picks, shared, seq);
  const index_t E = scores.cols, K = picks.cols, kr = K - shared, batch = scores.rows / seq;
  double loss = 0;
#pragma omp parallel for schedule(static) reduction(+ : loss) if (scores.rows * E > (1 << 15))
  for (index_t b = 0; b < batch; ++b) {
    T* f = freq.row(b);
    std::fill(f, f + E, T(0));
    for (index_t t = b * seq; t < (b + 1) * seq; ++t)
      for (index_t j = shared; j < K; ++j) f[picks.row(t)[j] - shared] += T(E) / T(kr * seq);
    for (index_t t = b * seq; t < (b + 1) * seq; ++t) {
      const T* s = scores.row(t);
      T A = T(0), dot = T(0);
      for (index_t e = 0; e < E; ++e) A += s[e];
      for (index_t e = 0; e < E; ++e) dot += f[e] * s[e] / A;
      loss += double(dot) / double(seq);
      const T c = coef / T(batch * seq) / A;
      for (index_t e = 0; e < E; ++e) dscores.row(t)[e] = c * (f[e] - dot);
    }
  }
  loss_out[0] = T(double(coef) * loss / double(batch));
}

// load[c] += offsets[c+1] − offsets[c]: the rows each class received in one selection (group_picks' offsets).
template <class T>
void expert_load_add(std::span<T> load, std::span<const token_t> offsets) {
  MOM_CHECK(offsets.size() == load.size() + 1, "expert_load_add: ", offsets.size(), " offsets for ", load.size(),
            " classes (needs classes + 1)");
  for (std::size_t c = 0; c < load.size(); ++c) load[c] += T(offsets[c + 1] - offsets[c]);
}

// The auxiliary-loss-free balancing update (V3 eq. (16)): bias_e += rate · sign(mean(load) − load_e), an
// overloaded expert's bias down, an underloaded one's up (sign 0: unchanged).
template <class T>
void bias_balance_update(std::span<T> bias, std::span<const T> load, T rate) {
  MOM_CHECK(bias.size() == load.size() && !bias.empty(), "bias_balance_update: ", bias.size(), " biases for ",
            load.size(), " loads");
  T mean = T(0);
  for (const T l : load) mean += l;
  mean /= T(load.size());
  for (std::size_t e = 0; e < bias.size(); ++e)
    bias[e] += rate * T((mean > load[e]) - (mean < load[e]));
}

}  // namespace mom::cpu

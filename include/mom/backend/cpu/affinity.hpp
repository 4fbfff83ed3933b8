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

#include "mom/backend/affinity_row.hpp"
#include "mom/backend/shape_checks.hpp"
#include "mom/core/check.hpp"
#include "mom/core/tensor.hpp"

namespace mom::cpu {

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
  const index_t n = scores.rows, E = scores.cols, K = weights.cols;
#pragma omp parallel for schedule(static) if (n * E > (1 << 15))
  for (index_t r = 0; r < n; ++r)  // one row: backend/affinity_row.hpp, the CUDA kernel's body too
    backend_common::affinity_select_row(scores.row(r), bias.data(), E, groups, top_groups, shared, K, renormalise, scale,
                                        weights.row(r), picks.row(r), probs.empty() ? nullptr : probs.row(r));
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
  for (index_t r = 0; r < n; ++r)
    backend_common::affinity_select_row_backward(scores.row(r), dweights.row(r), picks.row(r), E, K, shared, renormalise,
                                                 scale, dprobs_col.empty() ? nullptr : dprobs_col.data(), dscores.row(r));
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

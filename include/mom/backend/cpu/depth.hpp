#pragma once
// Ops of the depth-routed assemblies (Mixture-of-Depths, layer-skip, early-exit; assembly/depth.hpp):
// expert-choice selection of the top-C tokens of every sequence, the per-token skip decision with its
// early-exit state, the 0/1 selection mask, the logistic gate, and binary cross-entropy on logits
// (the causal-sampling losses of the MoD paper, §3.5).
//
// Conventions as everywhere in mom::cpu: forward ops write their outputs, backward ops accumulate
// (+=). Index lists are token_t flat token indices b·seq + position (the batch offset included),
// ascending. Every op is a plain per-row (or per-sequence) map or a reduction, so the CUDA port is
// one kernel each: select_topc_per_sequence = one block per sequence (bitonic sort of seq scores,
// or CUB segmented radix sort + a sort of the C winners); skip_select = CUB DeviceSelect::Flagged
// with the count left on the device; bce_logits_forward = one block reduction.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <span>
#include <vector>

#include "mom/backend/cpu/parallel.hpp"
#include "mom/backend/shape_checks.hpp"
#include "mom/core/check.hpp"
#include "mom/core/tensor.hpp"

namespace mom::cpu {

// Expert choice per sequence (MoD eq. (1)): of each sequence's `seq` scores (scores is [batch·seq],
// row-major by sequence) the C = idx.size() / batch largest, as flat indices b·seq + position in
// ascending order (so the selected tokens keep their causal order), written to idx[b·C .. b·C+C).
// Ties go to the earlier position (deterministic). C = 0 writes nothing; C = seq selects all.
template <class T>
void select_topc_per_sequence(std::span<token_t> idx, std::span<const T> scores, index_t batch, index_t seq) {
  checks::select_topc_shapes(ssize(idx), ssize(scores), batch, seq);
  const index_t C = ssize(idx) / batch;
  if (C == 0) return;
#pragma omp parallel for schedule(static) if (batch > 1 && batch * seq > (1 << 12))
  for (index_t b = 0; b < batch; ++b) {
    thread_local std::vector<token_t> order;  // grows once to the longest sequence seen
    order.resize(static_cast<std::size_t>(seq));
    std::iota(order.begin(), order.end(), token_t(0));
    const T* s = scores.data() + b * seq;
    auto higher = [s](token_t a, token_t c) { return s[a] > s[c] || (s[a] == s[c] && a < c); };
    if (C < seq) std::nth_element(order.begin(), order.begin() + (C - 1), order.end(), higher);
    std::sort(order.begin(), order.begin() + C);  // the C winners, by position
    token_t* out = idx.data() + b * C;
    for (index_t j = 0; j < C; ++j) out[j] = token_t(b * seq + order[std::size_t(j)]);
  }
}

// mask[i] = 1 for i in idx, 0 elsewhere (the top-C membership targets of the causal losses).
template <class T>
void selection_mask(std::span<T> mask, std::span<const token_t> idx) {
  std::fill(mask.begin(), mask.end(), T(0));
  for (index_t i = 0; i < ssize(idx); ++i) {
    MOM_CHECK(idx[i] >= 0 && idx[i] < ssize(mask), "selection_mask: idx[", i, "] = ", idx[i], " is out of range [0, ",
              mask.size(), ")");
    mask[std::size_t(idx[i])] = T(1);
  }
}

// Layer-skip decision (MoM eq. (9)): token i runs the layer iff logits[i] > 0 (gate σ > ½) and, with
// early exit (alive non-empty), it has run every earlier layer: alive[i] != 0 on entry. Writes the
// running tokens to idx[0 .. count) ascending, count[0] = their number, and (early exit) alive[i] =
// whether token i ran, so a token that skipped once stays skipped. idx has room for every token.
template <class T>
void skip_select(std::span<token_t> idx, std::span<token_t> count, std::span<token_t> alive, std::span<const T> logits) {
  checks::skip_select_shapes(ssize(idx), ssize(count), ssize(alive), ssize(logits));
  token_t m = 0;
  for (index_t i = 0; i < ssize(logits); ++i) {
    const bool run = logits[std::size_t(i)] > T(0) && (alive.empty() || alive[std::size_t(i)] != 0);
    if (run) idx[std::size_t(m++)] = token_t(i);
    if (!alive.empty()) alive[std::size_t(i)] = run ? 1 : 0;
  }
  count[0] = m;
}

// Token-choice Mixture-of-Recursions (assembly/recursion.hpp): from each token's chosen depth (picks[t]: the
// last recursion it runs, 0-based) and its gate weight, recursion r's run decision, decision[t] = +1 iff
// picks[t] >= r else −1 (skip_select's input), and the factor on its block update, coef[t] = weights[t] at
// its last recursion (picks[t] == r), 1 before it. Backward: dweights[t] += dcoef[t] where picks[t] == r.
template <class T>
void depth_choice_rows(std::span<T> decision, std::span<T> coef, std::span<const token_t> picks,
                       std::span<const T> weights, index_t r) {
  checks::depth_choice_shapes(ssize(decision), ssize(coef), ssize(picks), ssize(weights));
  for (std::size_t t = 0; t < picks.size(); ++t) {
    decision[t] = picks[t] >= r ? T(1) : T(-1);
    coef[t] = picks[t] == r ? weights[t] : T(1);
  }
}
template <class T>
void depth_choice_rows_backward(std::span<T> dweights, std::span<const T> dcoef, std::span<const token_t> picks,
                                index_t r) {
  checks::depth_choice_shapes(ssize(dweights), ssize(dcoef), ssize(picks), ssize(dweights));
  for (std::size_t t = 0; t < picks.size(); ++t)
    if (picks[t] == r) dweights[t] += dcoef[t];
}

// out = σ(x) = 1 / (1 + e^{-x}) elementwise; backward: dx += dout · out (1 - out). The forward takes libm's exp
// per element (about 4 ns): a selection's n·K scores (16384 for σ-MoE's at moeut8's shape) are split over the
// threads from sigmoid_parallel_min elements on. Elementwise, so the bits do not depend on the split.
inline constexpr index_t sigmoid_parallel_min = 1 << 12;
template <class T>
void sigmoid_forward(std::span<T> out, std::span<const T> x) {
  MOM_CHECK(out.size() == x.size(), "sigmoid_forward: out has ", out.size(), " elements, x ", x.size());
  const index_t n = ssize(x);
#pragma omp parallel for schedule(static) if (n >= sigmoid_parallel_min)
  for (index_t i = 0; i < n; ++i) out[std::size_t(i)] = T(1) / (T(1) + std::exp(-x[std::size_t(i)]));
}
template <class T>
void sigmoid_backward(std::span<T> dx, std::span<const T> out, std::span<const T> dout) {
  MOM_CHECK(dx.size() == out.size() && dout.size() == out.size(), "sigmoid_backward: dx ", dx.size(), ", out ",
            out.size(), ", dout ", dout.size(), " elements disagree");
  for (std::size_t i = 0; i < out.size(); ++i) dx[i] += dout[i] * out[i] * (T(1) - out[i]);
}

// Binary cross-entropy on logits against 0/1 targets, mean over the n entries:
//   loss = (1/n) Σ_i [ softplus(l_i) - t_i l_i ]           (= -t log σ(l) - (1-t) log(1-σ(l)))
// out[0] = loss, out[1] = number of entries whose decision l_i > 0 agrees with t_i > ½ (the
// prediction accuracy's numerator). Stable for large |l|.
template <class T>
void bce_logits_forward(std::span<T> out, std::span<const T> logits, std::span<const T> targets) {
  checks::bce_logits_shapes("bce_logits_forward", ssize(out), ssize(logits), ssize(targets));
  const index_t n = ssize(logits);
  double loss = 0, correct = 0;
  for (index_t i = 0; i < n; ++i) {
    const double l = double(logits[std::size_t(i)]), t = double(targets[std::size_t(i)]);
    loss += std::max(l, 0.0) + std::log1p(std::exp(-std::abs(l))) - t * l;
    correct += (l > 0) == (t > 0.5) ? 1 : 0;
  }
  out[0] = n > 0 ? T(loss / double(n)) : T(0);
  out[1] = T(correct);
}
// dlogits += scale · (σ(l) - t)   (scale = coefficient / n for the mean above).
template <class T>
void bce_logits_backward(std::span<T> dlogits, std::span<const T> logits, std::span<const T> targets, T scale) {
  checks::bce_logits_shapes("bce_logits_backward", 2, ssize(logits), ssize(targets));
  MOM_CHECK(dlogits.size() == logits.size(), "bce_logits_backward: dlogits has ", dlogits.size(), " elements, logits ",
            logits.size());
  for (std::size_t i = 0; i < logits.size(); ++i)
    dlogits[i] += scale * (T(1) / (T(1) + std::exp(-logits[i])) - targets[i]);
}

}  // namespace mom::cpu

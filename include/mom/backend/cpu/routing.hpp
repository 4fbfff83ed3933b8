#pragma once
// Ops of routed assembly (Mixture-of-Modules, §3.2-§3.3): the router's softmax/top-K with
// renormalised weights, the Switch-style balance loss, the stable counting sort that groups
// (token, pick) slots by module, and causal attention over packed (gathered) queries and keys.
//
// Conventions as everywhere in mom::cpu: forward ops write their outputs, backward ops
// accumulate (+=). Integer index lists are token_t.
#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <vector>

#include "mom/backend/cpu/attention.hpp"
#include "mom/backend/cpu/gemm.hpp"
#include "mom/backend/cpu/parallel.hpp"
#include "mom/backend/cpu/topk.hpp"
#include "mom/backend/shape_checks.hpp"
#include "mom/core/check.hpp"
#include "mom/core/tensor.hpp"

namespace mom::cpu {

inline constexpr index_t kPackedBlock = 64;  // query rows per score block (as kAttentionBlock)

// probs = softmax(inv_temp · logits) per row (may alias logits); picks/values = top-K of probs
// (descending, ties to the lower index, as topk_rows); weights = the K values, renormalised to
// sum to 1 per row when renormalise (the authors' code), else the raw probabilities.
template <class T>
void route_topk_forward(MatrixView<T> weights, MatrixView<token_t> picks, MatrixView<T> probs, MatrixView<const T> logits,
                        T inv_temp, bool renormalise) {
  const index_t n = logits.rows, E = logits.cols, k = weights.cols;
  checks::route_topk_forward_shapes<T>(weights, picks, probs, logits);
#pragma omp parallel for schedule(static) if (n * E > (1 << 15))
  for (index_t r = 0; r < n; ++r) {
    const T* x = logits.row(r);
    T* p = probs.row(r);
    T m = -std::numeric_limits<T>::infinity();
    for (index_t e = 0; e < E; ++e) m = std::max(m, x[e] * inv_temp);
    T sum = 0;
    for (index_t e = 0; e < E; ++e) sum += (p[e] = std::exp(x[e] * inv_temp - m));
    for (index_t e = 0; e < E; ++e) p[e] /= sum;
    T* w = weights.row(r);
    token_t* ind = picks.row(r);
    detail::topk_insert(static_cast<const T*>(p), E, k, w, ind);  // topk.hpp: an earlier index wins a tie
    if (renormalise) {
      T s = 0;
      for (index_t j = 0; j < k; ++j) s += w[j];
      for (index_t j = 0; j < k; ++j) w[j] /= s;
    }
  }
}

// Backward of route_topk_forward (+ the balance loss): dlogits += d/dlogits of
//   Σ_{r,j} dweights[r,j] · weights[r,j]  +  Σ_{r,e} dprobs_col[e] · probs[r,e]
// dprobs_col (may be empty) is a per-column gradient shared by all rows (the balance loss).
template <class T>
void route_topk_backward(MatrixView<T> dlogits, MatrixView<const T> dweights, MatrixView<const T> weights,
                         MatrixView<const T> probs, MatrixView<const token_t> picks, T inv_temp, bool renormalise,
                         std::span<const T> dprobs_col) {
  const index_t n = probs.rows, E = probs.cols, k = picks.cols;
  checks::route_topk_backward_shapes<T>(dlogits, dweights, weights, probs, picks, dprobs_col);
#pragma omp parallel for schedule(static) if (n * E > (1 << 15))
  for (index_t r = 0; r < n; ++r) {
    const T* p = probs.row(r);
    const T* w = weights.row(r);
    const T* dw = dweights.row(r);
    const token_t* ind = picks.row(r);
    // d/d(picked prob v_j): renormalised w_j = v_j / S gives dv_j = (dw_j - Σ_k dw_k w_k) / S.
    T S = 0, dot_w = 0;
    if (renormalise) {
      for (index_t j = 0; j < k; ++j) S += p[ind[j]];
      for (index_t j = 0; j < k; ++j) dot_w += dw[j] * w[j];
    }
    auto dv = [&](index_t j) { return renormalise ? (dw[j] - dot_w) / S : dw[j]; };
    // Softmax backward with dprobs[e] = c[e] + Σ_j [ind_j == e] dv_j.
    T dot = 0;
    if (!dprobs_col.empty())
      for (index_t e = 0; e < E; ++e) dot += p[e] * dprobs_col[e];
    for (index_t j = 0; j < k; ++j) dot += p[ind[j]] * dv(j);
    T* dl = dlogits.row(r);
    for (index_t e = 0; e < E; ++e) {
      T g = dprobs_col.empty() ? T(0) : dprobs_col[e];
      for (index_t j = 0; j < k; ++j)
        if (ind[j] == e) g += dv(j);
      dl[e] += inv_temp * p[e] * (g - dot);
    }
  }
}

// Stable counting sort of the n×K (token, pick) slots by chosen class (0..E-1): class e's slots
// are rows offsets[e] .. offsets[e+1]-1 of row_token (their token, ascending: causal order) and
// row_slot (their slot r*K + j in picks). offsets has E+1 entries.
inline void group_by_choice(std::span<token_t> row_token, std::span<token_t> row_slot, std::span<token_t> offsets,
                            MatrixView<const token_t> picks, index_t E) {
  checks::group_by_choice_shapes(row_token, row_slot, offsets, picks, E);
  const index_t n = picks.rows, k = picks.cols;
  std::fill(offsets.begin(), offsets.end(), token_t(0));
  for (index_t r = 0; r < n; ++r)
    for (index_t j = 0; j < k; ++j) {
      const token_t e = picks(r, j);
      MOM_CHECK(e >= 0 && e < E, "group_by_choice: picks(", r, ",", j, ") = ", e, " is out of range [0, ", E, ")");
      ++offsets[e + 1];
    }
  for (index_t e = 0; e < E; ++e) offsets[e + 1] += offsets[e];
  // Place slots using offsets[e] as the running cursor, then shift back.
  for (index_t r = 0; r < n; ++r)
    for (index_t j = 0; j < k; ++j) {
      const token_t at = offsets[picks(r, j)]++;
      row_token[at] = static_cast<token_t>(r);
      row_slot[at] = static_cast<token_t>(r * k + j);
    }
  for (index_t e = E; e > 0; --e) offsets[e] = offsets[e - 1];
  offsets[0] = 0;
}

// Switch-Transformer load balancing (Fedus et al. 2022, eq. (4)) over E classes with K picks:
//   loss = coef · E · Σ_e f_e · P_e,   f_e = (slots routed to e) / (n·K),   P_e = mean_r probs[r, e]
// Writes loss_out[0] and dprobs_col[e] = d loss / d probs[r, e] = coef · E · f_e / n (f is a count:
// no gradient, as in Switch).
template <class T>
void balance_loss_forward(std::span<T> loss_out, std::span<T> dprobs_col, MatrixView<const T> probs,
                          std::span<const token_t> offsets, index_t k, T coef) {
  checks::balance_loss_forward_shapes<T>(loss_out, dprobs_col, probs, offsets);
  const index_t n = probs.rows, E = probs.cols;
  T loss = 0;
  for (index_t e = 0; e < E; ++e) {
    const T f = T(offsets[e + 1] - offsets[e]) / T(n * k);
    T P = 0;
    for (index_t r = 0; r < n; ++r) P += probs(r, e);
    loss += f * P / T(n);
    dprobs_col[e] = coef * T(E) * f / T(n);
  }
  loss_out[0] = coef * T(E) * loss;
}

// Selection entropy regularisers over the softmax s_x = softmax(logits_x) of B sequences of seq rows of
// logits [B·seq × C] (n = B·seq rows):
//   loss = coef · (1/B) Σ_b Σ_e p_b[e] log p_b[e]  +  cond_coef · (1/n) Σ_x Σ_e s_x[e] log s_x[e],
//   p_b = (1/seq) Σ_t s_{b,t}
// the first term the negative entropy of each sequence's mean selection, the second the mean negative
// entropy of the rows' own selections. Its users:
//   MoEUT's balancing within each sequence (arXiv 2405.16039, eq. (4)): (coef, cond_coef) = (γ, 0)
//   ModuleFormer's mutual-information loss over the batch (arXiv 2306.04640, eq. (7): −H(m) + H(m|x)):
//     B = 1, seq = n, (γ, −γ); its load concentration (eq. (8): H(m)): B = 1, (−γ, 0)
// Writes loss_out[0] and its gradient dlogits = d loss / d logits [n × C] (a local loss: the caller adds
// dlogits into its logit gradient in backward). With g_e = coef·(log p_b[e] + 1)/n + cond_coef·(log s_x[e]
// + 1)/n = d loss / d s_x[e], the softmax backward gives dlogits_x = s_x ⊙ (g − ⟨s_x, g⟩) (the +1s cancel).
template <class T>
void selection_entropy_forward(std::span<T> loss_out, MatrixView<T> dlogits, MatrixView<const T> logits,
                               index_t batch, index_t seq, T coef, T cond_coef = T(0)) {
  checks::selection_entropy_shapes<T>(loss_out, dlogits, logits, batch, seq);
  const index_t C = logits.cols, n = batch * seq;
  const T tiny = std::numeric_limits<T>::min();
  T total = 0;
#pragma omp parallel for schedule(static) reduction(+ : total) if (batch > 1 && batch * seq * C > (1 << 13))
  for (index_t b = 0; b < batch; ++b) {
    thread_local std::vector<T> p;  // grows once to the widest selection
    p.assign(std::size_t(C), T(0));
    // with cond_coef: log s of the sequence's rows, taken once (both passes read them); grows once
    thread_local std::vector<T> log_s;
    if (cond_coef != T(0) && log_s.size() < std::size_t(seq * C)) log_s.resize(std::size_t(seq * C));
    T cond = 0;
    for (index_t t = 0; t < seq; ++t) {  // softmax rows into dlogits, their mean into p
      const index_t r = b * seq + t;
      const T* z = logits.row(r);
      T* s = dlogits.row(r);
      T m = z[0];
      for (index_t e = 1; e < C; ++e) m = std::max(m, z[e]);
      T sum = 0;
      if (C >= 16) {  // s = exp(z - m) vectorised (attention.hpp); fewer columns than a vector: one exp each
        std::copy_n(z, C, s);
        sum = detail::exp_affine(s, C, T(1), m);
      } else {
        for (index_t e = 0; e < C; ++e) sum += (s[e] = std::exp(z[e] - m));
      }
      const T inv = T(1) / sum;
      for (index_t e = 0; e < C; ++e) p[std::size_t(e)] += (s[e] *= inv);
      if (cond_coef != T(0)) {
        T* ls = log_s.data() + t * C;
        for (index_t e = 0; e < C; ++e) cond += s[e] * (ls[e] = std::log(std::max(s[e], tiny)));
      }
    }
    T neg_entropy = 0;
    for (index_t e = 0; e < C; ++e) {
      T& pe = p[std::size_t(e)];
      pe /= T(seq);
      const T log_p = std::log(std::max(pe, tiny));
      neg_entropy += pe * log_p;
      pe = coef * (log_p + T(1)) / T(n);  // p now holds the marginal term's g
    }
    total += coef * neg_entropy / T(batch) + cond_coef * cond / T(n);
    for (index_t t = 0; t < seq; ++t) {
      T* s = dlogits.row(b * seq + t);
      T dot = 0;
      if (cond_coef == T(0)) {
        for (index_t e = 0; e < C; ++e) dot += s[e] * p[std::size_t(e)];
        for (index_t e = 0; e < C; ++e) s[e] *= p[std::size_t(e)] - dot;
      } else {  // g_e = p_e + cond_coef · log s_e / n, in log_s's row
        T* ge = log_s.data() + t * C;
        for (index_t e = 0; e < C; ++e) ge[e] = p[std::size_t(e)] + cond_coef * ge[e] / T(n);
        for (index_t e = 0; e < C; ++e) dot += s[e] * ge[e];
        for (index_t e = 0; e < C; ++e) s[e] *= ge[e] - dot;
      }
    }
  }
  loss_out[0] = total;
}

// The router z-loss (ST-MoE, Zoph et al. 2022, arXiv 2202.08906, eq. (5)) of n rows of logits (scaled by
// inv_temp, as the router's softmax reads them): loss_out[0] = coef · (1/n) Σ_r (log Σ_e exp(inv_temp·z_re))²,
// and its gradient written into dlogits: d/dz_re = coef · 2·lse_r / n · inv_temp · softmax_re (a local
// loss, as selection_entropy_forward: the caller adds dlogits into its logit gradient in backward).
template <class T>
void router_z_loss_forward(std::span<T> loss_out, MatrixView<T> dlogits, MatrixView<const T> logits, T inv_temp,
                           T coef) {
  checks::router_z_loss_shapes<T>(loss_out, dlogits, logits);
  const index_t n = logits.rows, C = logits.cols;
  double total = 0;
#pragma omp parallel for schedule(static) reduction(+ : total) if (n * C > (1 << 14))
  for (index_t r = 0; r < n; ++r) {
    const T* z = logits.row(r);
    T* g = dlogits.row(r);
    T m = z[0] * inv_temp;
    for (index_t e = 1; e < C; ++e) m = std::max(m, z[e] * inv_temp);
    T sum = 0;
    for (index_t e = 0; e < C; ++e) sum += (g[e] = std::exp(z[e] * inv_temp - m));
    const T lse = m + std::log(sum), scale = coef * T(2) * lse / T(n) * inv_temp / sum;
    for (index_t e = 0; e < C; ++e) g[e] *= scale;
    total += double(lse) * double(lse);
  }
  loss_out[0] = T(double(coef) * total / double(n));
}

namespace detail {
// First index i in sorted [first, last) with v[i] >= x (lower) / v[i] > x (upper).
inline index_t lower_index(std::span<const token_t> v, token_t x) {
  return std::lower_bound(v.begin(), v.end(), x) - v.begin();
}
inline index_t upper_index(std::span<const token_t> v, token_t x) {
  return std::upper_bound(v.begin(), v.end(), x) - v.begin();
}
// Key ranges; an empty key list stands for the identity list 0, 1, ..., n-1.
inline index_t key_lower(std::span<const token_t> k_tok, token_t x) { return k_tok.empty() ? x : lower_index(k_tok, x); }
inline index_t key_upper(std::span<const token_t> k_tok, token_t x) { return k_tok.empty() ? x + 1 : upper_index(k_tok, x); }
template <class T>
void check_packed(const char* op, MatrixView<const T> q, MatrixView<const T> k, MatrixView<const T> v,
                  std::span<const token_t> q_tok, std::span<const token_t> k_tok, index_t seq, index_t heads) {
  checks::packed_attention_shapes<T>(op, q, k, v, q_tok, k_tok, seq, heads);
  for (index_t i = 0; i < ssize(q_tok); ++i)
    MOM_CHECK(q_tok[i] >= 0 && (i == 0 || q_tok[i] > q_tok[i - 1]) && (!k_tok.empty() || q_tok[i] < k.rows), op,
              ": query positions must be ascending and in range; q_tok[", i, "] = ", q_tok[i]);
}
}  // namespace detail

// Causal attention of packed queries against packed keys. Query row i is the token with flat
// index q_tok[i] (sequence q_tok[i] / seq); it attends to the key rows j whose token k_tok[j] is
// in the same sequence and k_tok[j] <= q_tok[i]. q_tok and k_tok are ascending (as
// group_by_choice makes them), so those keys are one contiguous range, found by binary search.
// An empty k_tok means the keys are all tokens: key row j is token j (k.rows = batch·seq).
// out [nq × d]; lse [nq × heads] (row i, head h; -inf when a query has no key: out row 0).
// Scale 1/sqrt(hd).
//
// As attention_forward: one task per (sequence, head) (tasks touch disjoint rows / columns, so
// they run in parallel), and within a task query rows go in blocks of kAttentionBlock whose
// scores against their key range are one dense cpu::gemm; keys beyond a row's range are masked.
namespace detail {
// The packed rows of sequence b: queries [q0, q1), keys from k0.
struct PackedTask {
  index_t q0, q1, k0;
};
inline PackedTask packed_task(std::span<const token_t> q_tok, std::span<const token_t> k_tok, index_t b, index_t seq) {
  const token_t first = token_t(b * seq), last = token_t(b * seq + seq - 1);
  return {lower_index(q_tok, first), upper_index(q_tok, last), key_lower(k_tok, first)};
}
// End of the query block starting at packed row i0: at most kPackedBlock rows, and (for sparse
// queries, e.g. a module that got 40% of the tokens) no query more than kPackedBlock positions
// after the first, so the masked part of the [rows × keys] score block stays at most about
// half a diagonal block, as in dense attention, instead of growing with the rows' spread.
inline index_t packed_block_end(std::span<const token_t> q_tok, index_t i0, index_t q1) {
  const index_t i1 = std::min(q1, i0 + kPackedBlock);
  const auto first = q_tok.begin() + i0 + 1, last = q_tok.begin() + i1;
  return std::lower_bound(first, last, token_t(q_tok[i0] + kPackedBlock)) - q_tok.begin();
}
// This thread's [kPackedBlock × seq] score scratch number Slot. A key range lies inside one
// sequence, so seq bounds it; sizing by seq (not by the task's range) makes every thread's
// buffer reach its final size on its first task: no allocation after the first step.
struct PackedAttentionScratch;
template <class T, int Slot>
T* packed_block_scratch(index_t seq) {
  return thread_scratch<T, PackedAttentionScratch, Slot>(static_cast<std::size_t>(kPackedBlock * seq));
}
// Sizes the scratch of every OpenMP thread now (a thread that gets no task in the first step
// would otherwise allocate in a later one).
template <class T>
void reserve_packed_scratch(index_t seq) {
#pragma omp parallel
  {
    packed_block_scratch<T, 0>(seq);
    packed_block_scratch<T, 1>(seq);
  }
}
}  // namespace detail

template <class T>
void attention_packed_forward(MatrixView<T> out, std::span<T> lse, MatrixView<const T> q, MatrixView<const T> k,
                              MatrixView<const T> v, std::span<const token_t> q_tok, std::span<const token_t> k_tok,
                              index_t seq, index_t heads) {
  detail::check_packed<T>("attention_packed_forward", q, k, v, q_tok, k_tok, seq, heads);
  checks::attention_packed_forward_out_shapes<T>(out, lse, q, heads);
  const index_t nq = q.rows, hd = q.cols / heads;
  if (nq == 0) return;
  const index_t n_seq = q_tok[nq - 1] / seq + 1;
  const T scale = T(1) / std::sqrt(T(hd));
  detail::reserve_packed_scratch<T>(seq);
#pragma omp parallel for schedule(dynamic) if (n_seq * heads > 1 && nq * hd * 64 > (1 << 14))
  for (index_t bh = 0; bh < n_seq * heads; ++bh) {
    const index_t b = bh / heads, h = bh % heads;
    const auto task = detail::packed_task(q_tok, k_tok, b, seq);
    const auto qh = q.col_block(h * hd, hd), kh = k.col_block(h * hd, hd), vh = v.col_block(h * hd, hd);
    const auto oh = out.col_block(h * hd, hd);
    for (index_t i0 = task.q0, i1 = 0; i0 < task.q1; i0 = i1) {
      i1 = detail::packed_block_end(q_tok, i0, task.q1);
      const index_t rows = i1 - i0;
      const index_t keys = detail::key_upper(k_tok, q_tok[i1 - 1]) - task.k0;
      if (keys <= 0) {  // no query of the block has a key
        for (index_t i = i0; i < i1; ++i) std::fill_n(oh.row(i), hd, T(0)), lse[i * heads + h] = -std::numeric_limits<T>::infinity();
        continue;
      }
      const MatrixView<T> p(detail::packed_block_scratch<T, 0>(seq), rows, keys);
      gemm<T>(p, qh.row_block(i0, rows), Trans::N, kh.row_block(task.k0, keys), Trans::T);
      for (index_t r = 0; r < rows; ++r) {
        const index_t i = i0 + r, valid = detail::key_upper(k_tok, q_tok[i]) - task.k0;
        T* s = p.row(r);
        if (valid <= 0) {
          std::fill_n(s, keys, T(0));
          lse[i * heads + h] = -std::numeric_limits<T>::infinity();
          continue;
        }
        // The valid scores: max, exp and sum vectorised, as in attention_forward.
        auto sv = detail::score_row(s, valid - 1);
        const T m = sv.maxCoeff() * scale;  // scale > 0
        const T sum = detail::exp_affine(s, valid, scale, m);
        sv /= sum;
        std::fill(s + valid, s + keys, T(0));  // causal mask
        lse[i * heads + h] = m + std::log(sum);
      }
      gemm<T>(oh.row_block(i0, rows), MatrixView<const T>(p), Trans::N, vh.row_block(task.k0, keys), Trans::N);
    }
  }
}

// Backward of attention_packed_forward: dq, dk, dv += (each may be a column block of a wider
// matrix). With P recomputed from lse: dV = Pᵀ dO, dP = dO Vᵀ, dS = P ∘ (dP - rowsum(dO ∘ O)),
// dQ = scale dS K, dK = scale dSᵀ Q.
template <class T>
void attention_packed_backward(MatrixView<T> dq, MatrixView<T> dk, MatrixView<T> dv, MatrixView<const T> dout,
                               MatrixView<const T> out, std::span<const T> lse, MatrixView<const T> q,
                               MatrixView<const T> k, MatrixView<const T> v, std::span<const token_t> q_tok,
                               std::span<const token_t> k_tok, index_t seq, index_t heads) {
  detail::check_packed<T>("attention_packed_backward", q, k, v, q_tok, k_tok, seq, heads);
  checks::attention_packed_backward_grad_shapes<T>(dq, dk, dv, dout, out, lse, q, k, v, heads);
  const index_t nq = q.rows, hd = q.cols / heads;
  if (nq == 0) return;
  const index_t n_seq = q_tok[nq - 1] / seq + 1;
  const T scale = T(1) / std::sqrt(T(hd));
  detail::reserve_packed_scratch<T>(seq);
#pragma omp parallel for schedule(dynamic) if (n_seq * heads > 1 && nq * hd * 64 > (1 << 14))
  for (index_t bh = 0; bh < n_seq * heads; ++bh) {
    const index_t b = bh / heads, h = bh % heads;
    const auto task = detail::packed_task(q_tok, k_tok, b, seq);
    const auto qh = q.col_block(h * hd, hd), kh = k.col_block(h * hd, hd), vh = v.col_block(h * hd, hd);
    const auto oh = out.col_block(h * hd, hd), dOh = dout.col_block(h * hd, hd);
    const auto dqh = dq.col_block(h * hd, hd), dkh = dk.col_block(h * hd, hd), dvh = dv.col_block(h * hd, hd);
    for (index_t i0 = task.q0, i1 = 0; i0 < task.q1; i0 = i1) {
      i1 = detail::packed_block_end(q_tok, i0, task.q1);
      const index_t rows = i1 - i0;
      const index_t keys = detail::key_upper(k_tok, q_tok[i1 - 1]) - task.k0;
      if (keys <= 0) continue;
      const MatrixView<T> p(detail::packed_block_scratch<T, 0>(seq), rows, keys);
      const MatrixView<T> ds(detail::packed_block_scratch<T, 1>(seq), rows, keys);
      gemm<T>(p, qh.row_block(i0, rows), Trans::N, kh.row_block(task.k0, keys), Trans::T);
      for (index_t r = 0; r < rows; ++r) {
        const index_t i = i0 + r, valid = std::max<index_t>(0, detail::key_upper(k_tok, q_tok[i]) - task.k0);
        T* s = p.row(r);
        const T l = lse[i * heads + h];
        if (valid > 0) detail::exp_affine(s, valid, scale, l);
        std::fill(s + valid, s + keys, T(0));
      }
      gemm<T>(dvh.row_block(task.k0, keys), MatrixView<const T>(p), Trans::T, dOh.row_block(i0, rows), Trans::N, T(1), T(1));
      gemm<T>(ds, dOh.row_block(i0, rows), Trans::N, vh.row_block(task.k0, keys), Trans::T);
      for (index_t r = 0; r < rows; ++r) {
        const index_t i = i0 + r;
        T di = 0;  // Σ_j P_ij dP_ij = dO_i · O_i
        for (index_t c = 0; c < hd; ++c) di += dOh(i, c) * oh(i, c);
        auto g = detail::score_row(ds.row(r), keys - 1);
        g = scale * detail::score_row(p.row(r), keys - 1) * (g - di);  // 0 where P is masked
      }
      gemm<T>(dqh.row_block(i0, rows), MatrixView<const T>(ds), Trans::N, kh.row_block(task.k0, keys), Trans::N, T(1), T(1));
      gemm<T>(dkh.row_block(task.k0, keys), MatrixView<const T>(ds), Trans::T, qh.row_block(i0, rows), Trans::N, T(1), T(1));
    }
  }
}

}  // namespace mom::cpu

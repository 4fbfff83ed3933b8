#pragma once
// Argument (shape) checks shared by the CPU ops (backend/cpu/*.hpp) and the CUDA backend
// (backend/cuda/ops.hpp, routed_ops.hpp): one function per op, so both backends throw the same mom::Error with
// the same message for the same bad call. Host-only, no Eigen, no CUDA. Checks that only one backend
// needs (the CPU's host-side index scans, the CUDA kernels' head-dimension limit, ...) stay with it.
// T is given explicitly at every call (checks::layernorm_forward_shapes<T>(...)).
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "mom/core/check.hpp"
#include "mom/core/groups.hpp"
#include "mom/core/tensor.hpp"

namespace mom::checks {

template <class T>
using CM = MatrixView<const T>;
template <class T>
using CS = std::span<const T>;
using Tok = std::span<const token_t>;

// ---- linear ------------------------------------------------------------------
template <class T>
void linear_forward_shapes(CM<T> y, CM<T> x, CM<T> w, CS<T> b) {
  MOM_CHECK(x.cols == w.cols, "linear_forward: x ", shape(x), " and w ", shape(w), " disagree on in_features");
  MOM_CHECK(y.rows == x.rows && y.cols == w.rows, "linear_forward: y ", shape(y), " must be [", x.rows, "x", w.rows,
            "] for x ", shape(x), " and w ", shape(w));
  MOM_CHECK(b.empty() || ssize(b) == w.rows, "linear_forward: bias has ", b.size(), " elements, w ", shape(w), " has ",
            w.rows, " outputs");
}
template <class T>
void linear_backward_shapes(CM<T> dx, CM<T> dw, CS<T> db, CM<T> dy, CM<T> x, CM<T> w) {
  MOM_CHECK(x.cols == w.cols, "linear_backward: x ", shape(x), " and w ", shape(w), " disagree on in_features");
  MOM_CHECK(dy.rows == x.rows && dy.cols == w.rows, "linear_backward: dy ", shape(dy), " must be [", x.rows, "x", w.rows,
            "] for x ", shape(x), " and w ", shape(w));
  MOM_CHECK(dx.empty() || (dx.rows == x.rows && dx.cols == x.cols), "linear_backward: dx ", shape(dx),
            " must match x ", shape(x));
  MOM_CHECK(dw.empty() || (dw.rows == w.rows && dw.cols == w.cols), "linear_backward: dw ", shape(dw),
            " must match w ", shape(w));
  MOM_CHECK(db.empty() || ssize(db) == w.rows, "linear_backward: db has ", db.size(), " elements, w ", shape(w), " has ",
            w.rows, " outputs");
}

// ---- embedding (the token ids themselves are range-checked by each backend) ----
// An empty wpe: no position embedding (a RoPE model, Dims::positions).
template <class T>
void embedding_tables_shapes(const char* op, CM<T> rows, Tok tokens, CM<T> wte, CM<T> wpe) {
  MOM_CHECK(ssize(tokens) == rows.rows, op, ": ", tokens.size(), " tokens for ", shape(rows), " rows");
  MOM_CHECK(wte.cols == rows.cols && (wpe.empty() || wpe.cols == rows.cols), op, ": wte ", shape(wte), ", wpe ",
            shape(wpe), " and out ", shape(rows), " disagree on d_model");
}
template <class T>
void embedding_shapes(const char* op, CM<T> rows, Tok tokens, CM<T> wte, CM<T> wpe, index_t seq) {
  embedding_tables_shapes<T>(op, rows, tokens, wte, wpe);
  MOM_CHECK(seq > 0 && rows.rows % seq == 0, op, ": seq = ", seq, " does not divide the ", rows.rows, " rows");
  MOM_CHECK(wpe.empty() || seq <= wpe.rows, op, ": seq = ", seq, " exceeds the context ", wpe.rows, " of wpe ",
            shape(wpe));
}
// Rows at positions of their own (a decode step's): one position per row.
template <class T>
void embedding_at_shapes(const char* op, CM<T> rows, Tok tokens, CM<T> wte, CM<T> wpe, index_t positions) {
  embedding_tables_shapes<T>(op, rows, tokens, wte, wpe);
  MOM_CHECK(positions == rows.rows, op, ": ", positions, " positions for ", shape(rows), " rows");
}

// ---- layernorm ---------------------------------------------------------------
template <class T>
void layernorm_forward_shapes(CM<T> out, CS<T> mean, CS<T> rstd, CM<T> x, CS<T> gamma, CS<T> beta) {
  MOM_CHECK(out.rows == x.rows && out.cols == x.cols, "layernorm_forward: out ", shape(out), " must match x ", shape(x));
  MOM_CHECK(ssize(mean) == x.rows && ssize(rstd) == x.rows, "layernorm_forward: mean/rstd have ", mean.size(), "/",
            rstd.size(), " elements for x ", shape(x));
  MOM_CHECK(ssize(gamma) == x.cols && ssize(beta) == x.cols, "layernorm_forward: gamma/beta have ", gamma.size(), "/",
            beta.size(), " elements for x ", shape(x));
}
// A LayerNorm over gathered rows: `rows` [r × d] (its output or its output's gradient) normalises x's rows
// idx[0 .. r); the indices' range is checked where they are read.
template <class T>
void gathered_norm_shapes(const char* op, const char* name, CM<T> rows, CM<T> x, std::span<const token_t> idx) {
  MOM_CHECK(rows.cols == x.cols, op, ": ", name, " ", shape(rows), " must have x ", shape(x), "'s ", x.cols, " columns");
  MOM_CHECK(ssize(idx) == rows.rows, op, ": ", idx.size(), " row indices for ", name, " ", shape(rows));
}
template <class T>
void layernorm_backward_shapes(CM<T> dx, CS<T> dgamma, CS<T> dbeta, CM<T> dout, CM<T> x, CS<T> mean, CS<T> rstd,
                               CS<T> gamma) {
  MOM_CHECK(dout.rows == x.rows && dout.cols == x.cols, "layernorm_backward: dout ", shape(dout), " must match x ",
            shape(x));
  MOM_CHECK(dx.empty() || (dx.rows == x.rows && dx.cols == x.cols), "layernorm_backward: dx ", shape(dx),
            " must match x ", shape(x));
  MOM_CHECK(ssize(mean) == x.rows && ssize(rstd) == x.rows, "layernorm_backward: mean/rstd have ", mean.size(), "/",
            rstd.size(), " elements for x ", shape(x));
  MOM_CHECK(ssize(gamma) == x.cols, "layernorm_backward: gamma has ", gamma.size(), " elements for x ", shape(x));
  MOM_CHECK(dgamma.empty() || ssize(dgamma) == x.cols, "layernorm_backward: dgamma has ", dgamma.size(),
            " elements for x ", shape(x));
  MOM_CHECK(dbeta.empty() || ssize(dbeta) == x.cols, "layernorm_backward: dbeta has ", dbeta.size(),
            " elements for x ", shape(x));
}

// ---- cross entropy (targets are range-checked by each backend) -----------------
template <class T>
void cross_entropy_forward_shapes(CS<T> loss_out, CS<T> lse, CM<T> logits, Tok targets) {
  MOM_CHECK(loss_out.size() == 1, "cross_entropy_forward: loss_out has ", loss_out.size(), " elements, expected 1");
  MOM_CHECK(ssize(lse) == logits.rows && ssize(targets) == logits.rows, "cross_entropy_forward: logits ",
            shape(logits), " with ", lse.size(), " lse and ", targets.size(), " targets");
  MOM_CHECK(logits.cols > 0, "cross_entropy_forward: logits ", shape(logits), " has no classes");
}
template <class T>
void cross_entropy_backward_shapes(CM<T> dlogits, CM<T> logits, CS<T> lse, Tok targets) {
  MOM_CHECK(dlogits.rows == logits.rows && dlogits.cols == logits.cols, "cross_entropy_backward: dlogits ",
            shape(dlogits), " must match logits ", shape(logits));
  MOM_CHECK(ssize(lse) == logits.rows && ssize(targets) == logits.rows, "cross_entropy_backward: logits ",
            shape(logits), " with ", lse.size(), " lse and ", targets.size(), " targets");
}

// ---- causal attention (qkv [B*S × 3d]) --------------------------------------------
// qkv and out of a packed attention op (softmax or stick-breaking).
// kv_heads (stick-breaking's grouped / multi-query form; not given: = heads): qkv [n × (heads + 2·kv_heads)·hd]
// = [q | k | v], out [n × heads·hd]; a given kv_heads must divide heads (0 and negatives do not).
template <class T>
void attention_qkv_shapes(const char* op, CM<T> qkv, CM<T> out, index_t batch, index_t seq, index_t heads,
                          std::optional<index_t> kv_heads = std::nullopt) {
  MOM_CHECK(batch > 0 && seq > 0 && heads > 0, op, ": batch ", batch, ", seq ", seq, ", heads ", heads,
            " must be positive");
  MOM_CHECK(qkv.rows == batch * seq, op, ": qkv ", shape(qkv), " must have batch*seq = ", batch, "*", seq, " rows");
  if (!kv_heads || *kv_heads == heads) {
    MOM_CHECK(qkv.cols % 3 == 0, op, ": qkv ", shape(qkv), " must have 3*d columns [q | k | v]");
    const index_t d = qkv.cols / 3;
    MOM_CHECK(d % heads == 0, op, ": d = ", d, " (qkv ", shape(qkv), ") is not divisible by heads = ", heads);
    MOM_CHECK(out.rows == qkv.rows && out.cols == d, op, ": out ", shape(out), " must be [", qkv.rows, "x", d,
              "] for qkv ", shape(qkv));
    return;
  }
  MOM_CHECK(*kv_heads > 0 && heads % *kv_heads == 0, op, ": kv_heads = ", *kv_heads, " does not divide heads = ",
            heads);
  const index_t width = heads + 2 * *kv_heads;
  MOM_CHECK(qkv.cols % width == 0, op, ": qkv ", shape(qkv), " must have (heads + 2*kv_heads)*head_dim = ", width,
            "*head_dim columns [q | k | v]");
  const index_t hd = qkv.cols / width;
  MOM_CHECK(out.rows == qkv.rows && out.cols == heads * hd, op, ": out ", shape(out), " must be [", qkv.rows, "x",
            heads * hd, "] for qkv ", shape(qkv), " (", heads, " query heads of ", hd, ")");
}
// The softmax attention's saved lse [batch·heads·seq].
template <class T>
void attention_lse_shapes(const char* op, CS<T> lse, index_t batch, index_t seq, index_t heads) {
  MOM_CHECK(ssize(lse) == batch * heads * seq, op, ": lse has ", lse.size(), " elements, expected batch*heads*seq = ",
            batch * heads * seq);
}
template <class T>
void attention_shapes(const char* op, CM<T> qkv, CM<T> out, CS<T> lse, index_t batch, index_t seq, index_t heads) {
  attention_qkv_shapes<T>(op, qkv, out, batch, seq, heads);
  attention_lse_shapes<T>(op, lse, batch, seq, heads);
}
// A packed attention backward's gradients, after its forward shapes (op: "attention_backward", ...).
template <class T>
void attention_backward_grad_shapes(const char* op, CM<T> dqkv, CM<T> dout, CM<T> out, CM<T> qkv) {
  MOM_CHECK(dqkv.rows == qkv.rows && dqkv.cols == qkv.cols, op, ": dqkv ", shape(dqkv), " must match qkv ", shape(qkv));
  MOM_CHECK(dout.rows == out.rows && dout.cols == out.cols, op, ": dout ", shape(dout), " must match out ", shape(out));
}

// ---- rotary position embedding (x [rows × heads·head_dim], rotated in place) -----------------
// n_positions: the explicit positions / flat token indices given (-1: none, positions from the row).
template <class T>
void rope_shapes(const char* op, CM<T> x, index_t n_positions, index_t seq, index_t head_dim, T base) {
  MOM_CHECK(head_dim > 0 && head_dim % 2 == 0, op, ": head_dim = ", head_dim, " must be even and > 0");
  MOM_CHECK(x.cols % head_dim == 0, op, ": x ", shape(x), " is not a whole number of heads of head_dim = ", head_dim);
  MOM_CHECK(seq > 0, op, ": seq = ", seq, " must be > 0");
  MOM_CHECK(n_positions < 0 || n_positions == x.rows, op, ": ", n_positions, " positions for x ", shape(x));
  MOM_CHECK(base > T(0), op, ": base = ", base, " must be > 0");
}

// ---- GRU cell --------------------------------------------------------------------
template <class T>
void gru_shapes(const char* op, index_t n, index_t H, CM<T> gates, CM<T> x, CM<T> h, CM<T> w_ih, CM<T> w_hh,
                index_t b_ih, index_t b_hh) {
  MOM_CHECK(w_ih.rows == 3 * H && w_hh.rows == 3 * H && w_hh.cols == H, op, ": w_ih ", shape(w_ih), " and w_hh ",
            shape(w_hh), " must be [3Hx", x.cols, "] and [3HxH] for hidden size H = ", H);
  MOM_CHECK(w_ih.cols == x.cols, op, ": x ", shape(x), " and w_ih ", shape(w_ih), " disagree on input size");
  MOM_CHECK(x.rows == n && h.rows == n && h.cols == H, op, ": x ", shape(x), " and h ", shape(h), " must have ", n,
            " rows and h ", H, " columns");
  MOM_CHECK(gates.rows == n && gates.cols == 6 * H, op, ": gates ", shape(gates), " must be [", n, "x", 6 * H, "]");
  MOM_CHECK(b_ih == 3 * H && b_hh == 3 * H, op, ": b_ih / b_hh have ", b_ih, " / ", b_hh, " elements, expected 3H = ",
            3 * H);
}
// gru_cell_backward's scratch and dh, after gru_shapes.
template <class T>
void gru_backward_extra_shapes(index_t n, index_t H, CM<T> scratch, CM<T> dh, CM<T> h) {
  MOM_CHECK(scratch.rows == n && scratch.cols == 6 * H, "gru_cell_backward: scratch ", shape(scratch), " must be [", n,
            "x", 6 * H, "]");
  MOM_CHECK(dh.empty() || (dh.rows == n && dh.cols == H), "gru_cell_backward: dh ", shape(dh), " must match h ",
            shape(h));
}

// ---- routed assembly -----------------------------------------------------------------
template <class T>
void route_topk_forward_shapes(CM<T> weights, MatrixView<const token_t> picks, CM<T> probs, CM<T> logits) {
  const index_t n = logits.rows, E = logits.cols, k = weights.cols;
  MOM_CHECK(k >= 1 && k <= E, "route_topk_forward: K = ", k, " must be in [1, ", E, "] for logits ", shape(logits));
  MOM_CHECK(probs.rows == n && probs.cols == E && weights.rows == n && picks.rows == n && picks.cols == k,
            "route_topk_forward: probs ", shape(probs), ", weights ", shape(weights), ", picks ", shape(picks),
            " disagree with logits ", shape(logits));
}
template <class T>
void route_topk_backward_shapes(CM<T> dlogits, CM<T> dweights, CM<T> weights, CM<T> probs,
                                MatrixView<const token_t> picks, CS<T> dprobs_col) {
  const index_t n = probs.rows, E = probs.cols, k = picks.cols;
  MOM_CHECK(dlogits.rows == n && dlogits.cols == E && dweights.rows == n && dweights.cols == k &&
                weights.rows == n && weights.cols == k && picks.rows == n,
            "route_topk_backward: dlogits ", shape(dlogits), ", dweights ", shape(dweights), ", weights ",
            shape(weights), ", picks ", shape(picks), " disagree with probs ", shape(probs));
  MOM_CHECK(dprobs_col.empty() || ssize(dprobs_col) == E, "route_topk_backward: dprobs_col has ", dprobs_col.size(),
            " elements, expected ", E);
}
// Affinity routing (cpu/affinity.hpp): K = shared + k slots over E routed experts in `groups` groups.
template <class T>
void affinity_topk_forward_shapes(CM<T> weights, MatrixView<const token_t> picks, CM<T> probs, CM<T> scores,
                                  index_t bias, index_t shared, index_t groups, index_t top_groups) {
  const index_t n = scores.rows, E = scores.cols, k = weights.cols - shared;
  MOM_CHECK(groups >= 1 && groups <= 64 && E % groups == 0 && top_groups >= 1 && top_groups <= groups,
            "affinity_topk_forward: ", E, " experts in ", groups, " groups, ", top_groups,
            " kept: groups must divide the experts, be at most 64, and keep 1 to all of them");
  MOM_CHECK(shared >= 0 && k >= 1 && k <= E / groups * top_groups, "affinity_topk_forward: ", weights.cols,
            " slots with ", shared, " shared experts leave k = ", k, " routed picks; it must be in [1, ",
            E / groups * top_groups, "] (the experts of the kept groups)");
  MOM_CHECK(bias == E && weights.rows == n && picks.rows == n && picks.cols == weights.cols &&
                (probs.empty() || (probs.rows == n && probs.cols == E)),
            "affinity_topk_forward: bias ", bias, ", weights ", shape(weights), ", picks ", shape(picks), ", probs ",
            shape(probs), " disagree with scores ", shape(scores));
}
template <class T>
void affinity_topk_backward_shapes(CM<T> dscores, CM<T> dweights, CM<T> scores, MatrixView<const token_t> picks,
                                   index_t shared, index_t dprobs_col) {
  MOM_CHECK(dscores.rows == scores.rows && dscores.cols == scores.cols && dweights.rows == scores.rows &&
                dweights.cols == picks.cols && picks.rows == scores.rows && shared >= 0 && shared < picks.cols,
            "affinity_topk_backward: dscores ", shape(dscores), ", dweights ", shape(dweights), ", picks ",
            shape(picks), ", shared ", shared, " disagree with scores ", shape(scores));
  MOM_CHECK(dprobs_col == 0 || dprobs_col == scores.cols, "affinity_topk_backward: dprobs_col has ", dprobs_col,
            " elements, expected ", scores.cols);
}
// DeepSeek-V3's sequence-wise balance loss (cpu/affinity.hpp): rows in sequences of seq rows.
template <class T>
void sequence_balance_shapes(index_t loss, CM<T> dscores, CM<T> freq, CM<T> scores, MatrixView<const token_t> picks,
                             index_t shared, index_t seq) {
  MOM_CHECK(seq >= 1 && scores.rows % seq == 0, "sequence_balance_forward: ", scores.rows, " rows are not sequences of ",
            seq);
  MOM_CHECK(loss == 1 && dscores.rows == scores.rows && dscores.cols == scores.cols && picks.rows == scores.rows &&
                shared >= 0 && shared < picks.cols && freq.rows == scores.rows / seq && freq.cols == scores.cols,
            "sequence_balance_forward: dscores ", shape(dscores), ", freq ", shape(freq), ", picks ", shape(picks),
            ", shared ", shared, " disagree with scores ", shape(scores), " in sequences of ", seq);
}
// Packed attention: q/k/v and position lists (the position order is checked by each backend).
template <class T>
void packed_attention_shapes(const char* op, CM<T> q, CM<T> k, CM<T> v, Tok q_tok, Tok k_tok, index_t seq,
                             index_t heads) {
  MOM_CHECK(seq > 0 && heads > 0 && q.cols % heads == 0, op, ": seq ", seq, ", heads ", heads, ", q ", shape(q));
  MOM_CHECK(k.cols == q.cols && v.cols == q.cols && k.rows == v.rows, op, ": q ", shape(q), ", k ", shape(k), ", v ",
            shape(v), " disagree");
  MOM_CHECK(ssize(q_tok) == q.rows && (k_tok.empty() || ssize(k_tok) == k.rows), op, ": ", q_tok.size(), " query and ",
            k_tok.size(), " key positions for q ", shape(q), " and k ", shape(k));
}
template <class T>
void attention_packed_forward_out_shapes(CM<T> out, CS<T> lse, CM<T> q, index_t heads) {
  MOM_CHECK(out.rows == q.rows && out.cols == q.cols && ssize(lse) == q.rows * heads, "attention_packed_forward: out ",
            shape(out), ", lse ", lse.size(), " for q ", shape(q));
}
template <class T>
void attention_packed_backward_grad_shapes(CM<T> dq, CM<T> dk, CM<T> dv, CM<T> dout, CM<T> out, CS<T> lse, CM<T> q,
                                           CM<T> k, CM<T> v, index_t heads) {
  MOM_CHECK(dq.rows == q.rows && dq.cols == q.cols && dk.rows == k.rows && dk.cols == k.cols && dv.rows == v.rows &&
                dv.cols == v.cols && dout.rows == q.rows && out.rows == q.rows && ssize(lse) == q.rows * heads,
            "attention_packed_backward: dq ", shape(dq), ", dk ", shape(dk), ", dv ", shape(dv), ", dout ", shape(dout),
            " disagree with q ", shape(q), " and k ", shape(k));
}

// ---- depth routing (Mixture-of-Depths, layer-skip) --------------------------------------
inline void select_topc_shapes(index_t n_idx, index_t n_scores, index_t batch, index_t seq) {
  MOM_CHECK(batch > 0 && seq > 0 && n_scores == batch * seq, "select_topc_per_sequence: ", n_scores,
            " scores for batch ", batch, " x seq ", seq);
  MOM_CHECK(n_idx % batch == 0 && n_idx / batch <= seq, "select_topc_per_sequence: ", n_idx, " indices are not C per "
            "sequence with 0 <= C <= seq = ", seq, " for batch ", batch);
}
inline void skip_select_shapes(index_t n_idx, index_t n_count, index_t n_alive, index_t n) {
  MOM_CHECK(n_idx == n && n_count == 1 && (n_alive == 0 || n_alive == n), "skip_select: idx ", n_idx, ", count ",
            n_count, ", alive ", n_alive, " elements for ", n, " logits (idx and alive: one per token, count: 1)");
}
inline void depth_choice_shapes(index_t n_decision, index_t n_coef, index_t n_picks, index_t n_weights) {
  MOM_CHECK(n_decision == n_picks && n_coef == n_picks && n_weights == n_picks, "depth_choice_rows: decision ",
            n_decision, ", coef ", n_coef, ", weights ", n_weights, " elements for ", n_picks, " picks (one per token)");
}
inline void bce_logits_shapes(const char* op, index_t n_out, index_t n_logits, index_t n_targets) {
  MOM_CHECK(n_out == 2 && n_logits == n_targets, op, ": out ", n_out, " (expected 2: loss, correct), ", n_logits,
            " logits and ", n_targets, " targets");
}

// ---- gemm (C = op(A)·op(B); the backends' Trans enums differ, so transposition is a bool) ----
template <class T>
void gemm_shapes(CM<T> C, CM<T> A, bool ta, CM<T> B, bool tb) {
  const index_t m = ta ? A.cols : A.rows;
  const index_t k = ta ? A.rows : A.cols;
  const index_t kb = tb ? B.cols : B.rows;
  const index_t n = tb ? B.rows : B.cols;
  MOM_CHECK(k == kb && C.rows == m && C.cols == n, "gemm: C ", shape(C), " = op(A) ", shape(A), (ta ? "^T" : ""),
            " * op(B) ", shape(B), (tb ? "^T" : ""), ": shapes do not agree");
}

// ---- elementwise: activations, residual add, axpy -----------------------------------------
// gelu_forward / relu_forward: out = f(x).
template <class T>
void activation_forward_shapes(const char* op, CS<T> out, CS<T> x) {
  MOM_CHECK(out.size() == x.size(), op, ": out has ", out.size(), " elements, x has ", x.size());
}
// gelu_backward / relu_backward: dx += dout · f'(x).
template <class T>
void activation_backward_shapes(const char* op, CS<T> dx, CS<T> x, CS<T> dout) {
  MOM_CHECK(dx.size() == x.size() && dout.size() == x.size(), op, ": dx/x/dout have ", dx.size(), "/", x.size(), "/",
            dout.size(), " elements");
}
template <class T>
void add_forward_shapes(CS<T> out, CS<T> a, CS<T> b) {
  MOM_CHECK(out.size() == a.size() && out.size() == b.size(), "add_forward: out/a/b have ", out.size(), "/", a.size(),
            "/", b.size(), " elements");
}
template <class T>
void axpy_shapes(CS<T> y, CS<T> x) {
  MOM_CHECK(y.size() == x.size(), "axpy: y has ", y.size(), " elements, x has ", x.size());
}

// ---- per-row top-k and softmax (the indices of topk_rows_backward are range-checked by each backend) ----
template <class T>
void topk_rows_shapes(CM<T> values, MatrixView<const token_t> indices, CM<T> x) {
  const index_t k = values.cols, N = x.cols;
  MOM_CHECK(k >= 1 && k <= N, "topk_rows: k = ", k, " (values ", shape(values), ") must be in [1, ", N, "] for x ",
            shape(x));
  MOM_CHECK(values.rows == x.rows && indices.rows == x.rows && indices.cols == k, "topk_rows: values ", shape(values),
            " and indices ", shape(indices), " must be [", x.rows, "x", k, "] for x ", shape(x));
}
template <class T>
void topk_rows_backward_shapes(CM<T> dx, CM<T> dvalues, MatrixView<const token_t> indices) {
  MOM_CHECK(dvalues.rows == dx.rows && indices.rows == dx.rows && indices.cols == dvalues.cols,
            "topk_rows_backward: dx ", shape(dx), ", dvalues ", shape(dvalues), ", indices ", shape(indices),
            " disagree");
}
template <class T>
void softmax_rows_shapes(CM<T> y, CM<T> x) {
  MOM_CHECK(y.rows == x.rows && y.cols == x.cols && x.cols > 0, "softmax_rows: y ", shape(y), " must match x ",
            shape(x), " (and be non-empty)");
}
template <class T>
void softmax_rows_backward_shapes(CM<T> dx, CM<T> dy, CM<T> y) {
  MOM_CHECK(dx.rows == y.rows && dx.cols == y.cols && dy.rows == y.rows && dy.cols == y.cols,
            "softmax_rows_backward: dx ", shape(dx), ", dy ", shape(dy), ", y ", shape(y), " must agree");
}

// ---- token dispatch (the indices themselves are range-checked by each backend) ---------------
template <class T>
void gather_rows_shapes(CM<T> out, CM<T> in, Tok idx) {
  MOM_CHECK(ssize(idx) == out.rows && out.cols == in.cols, "gather_rows: out ", shape(out), ", in ", shape(in), ", ",
            idx.size(), " indices");
}
template <class T>
void scatter_add_rows_shapes(CM<T> out, CM<T> in, Tok idx, CS<T> weights) {
  MOM_CHECK(ssize(idx) == in.rows && out.cols == in.cols, "scatter_add_rows: out ", shape(out), ", in ", shape(in),
            ", ", idx.size(), " indices");
  MOM_CHECK(weights.empty() || ssize(weights) == in.rows, "scatter_add_rows: ", weights.size(), " weights for in ",
            shape(in));
}
template <class T>
void scatter_add_rows_backward_shapes(CM<T> din, CS<T> dweights, CM<T> dout, CM<T> in, Tok idx, CS<T> weights) {
  MOM_CHECK(ssize(idx) == in.rows && dout.cols == in.cols, "scatter_add_rows_backward: dout ", shape(dout), ", in ",
            shape(in), ", ", idx.size(), " indices");
  MOM_CHECK(din.empty() || (din.rows == in.rows && din.cols == in.cols), "scatter_add_rows_backward: din ", shape(din),
            " must match in ", shape(in));
  MOM_CHECK(weights.empty() || ssize(weights) == in.rows, "scatter_add_rows_backward: ", weights.size(),
            " weights for in ", shape(in));
  MOM_CHECK(dweights.empty() || ssize(dweights) == in.rows, "scatter_add_rows_backward: ", dweights.size(),
            " dweights for in ", shape(in));
}
// weight_rows_backward (backend/cpu/dispatch.hpp): d and u [n × c], a c wide with n rows or read through idx [n],
// dwp and w empty or n long.
template <class T>
void weight_rows_backward_shapes(CM<T> d, CS<T> dwp, CM<T> u, CM<T> a, Tok idx, CS<T> w) {
  const index_t n = u.rows;
  MOM_CHECK(d.rows == n && d.cols == u.cols, "weight_rows_backward: d ", shape(d), " must match u ", shape(u));
  MOM_CHECK(a.cols == u.cols && (idx.empty() ? a.rows == n : ssize(idx) == n), "weight_rows_backward: a ", shape(a),
            " and ", idx.size(), " row indices for u ", shape(u));
  MOM_CHECK(dwp.empty() || ssize(dwp) == n, "weight_rows_backward: ", dwp.size(), " dwp entries for u ", shape(u));
  MOM_CHECK(w.empty() || ssize(w) == n, "weight_rows_backward: ", w.size(), " weights for u ", shape(u));
}
// group_by_choice over picks [n × K] into E classes (the picks are range-checked by each backend).
inline void group_by_choice_shapes(Tok row_token, Tok row_slot, Tok offsets, MatrixView<const token_t> picks,
                                   index_t E) {
  const index_t n = picks.rows, k = picks.cols;
  MOM_CHECK(ssize(row_token) == n * k && ssize(row_slot) == n * k && ssize(offsets) == E + 1, "group_by_choice: ",
            row_token.size(), " / ", row_slot.size(), " rows and ", offsets.size(), " offsets for picks ", shape(picks),
            " and ", E, " classes");
}
template <class T>
void balance_loss_forward_shapes(CS<T> loss_out, CS<T> dprobs_col, CM<T> probs, Tok offsets) {
  const index_t E = probs.cols;
  MOM_CHECK(ssize(loss_out) == 1 && ssize(dprobs_col) == E && ssize(offsets) == E + 1,
            "balance_loss_forward: loss_out ", loss_out.size(), ", dprobs_col ", dprobs_col.size(), ", offsets ",
            offsets.size(), " for probs ", shape(probs));
}
template <class T>
void selection_entropy_shapes(CS<T> loss_out, CM<T> dlogits, CM<T> logits, index_t batch, index_t seq) {
  MOM_CHECK(ssize(loss_out) == 1 && batch > 0 && seq > 0 && logits.rows == batch * seq && logits.cols > 0 &&
                dlogits.rows == logits.rows && dlogits.cols == logits.cols && dlogits.contiguous(),
            "selection_entropy_forward: logits ", shape(logits), " and dlogits ", shape(dlogits), " for ", batch,
            " sequences of ", seq, " tokens, loss_out ", loss_out.size());
}

// kv_write: qkv [rows × 3d] = [q | k | v] (d = the caches' width), caches [slots·max_len × d].
template <class T>
void kv_write_shapes(CM<T> k_cache, CM<T> v_cache, CM<T> qkv, index_t n_slot, index_t n_pos, index_t max_len) {
  const index_t d = k_cache.cols;
  MOM_CHECK(qkv.cols == 3 * d && v_cache.cols == d && v_cache.rows == k_cache.rows, "kv_write: qkv [", qkv.rows, " x ",
            qkv.cols, "] and caches [", k_cache.rows, " x ", k_cache.cols, "], [", v_cache.rows, " x ", v_cache.cols,
            "] do not agree");
  MOM_CHECK(n_slot == qkv.rows && n_pos == qkv.rows, "kv_write: ", n_slot, " slots and ", n_pos, " positions for ",
            qkv.rows, " rows");
  MOM_CHECK(max_len > 0 && k_cache.rows % max_len == 0, "kv_write: cache of ", k_cache.rows,
            " rows is not slots x max_len ", max_len);
}
template <class T>
void router_z_loss_shapes(CS<T> loss_out, CM<T> dlogits, CM<T> logits) {
  MOM_CHECK(ssize(loss_out) == 1 && logits.rows > 0 && logits.cols > 0 && dlogits.rows == logits.rows &&
                dlogits.cols == logits.cols,
            "router_z_loss_forward: logits ", shape(logits), ", dlogits ", shape(dlogits), ", loss_out ", loss_out.size());
}

// ---- optimizer -------------------------------------------------------------------------------
template <class T>
void grad_norm_args(CS<T> grads, const T* norm_out) {
  MOM_CHECK(norm_out != nullptr, "grad_norm: norm_out is null (", grads.size(), " gradients)");
}
template <class T>
void adamw_step_args(CS<T> params, CS<T> grads, CS<T> m, CS<T> v, std::int64_t step) {
  MOM_CHECK(grads.size() == params.size() && m.size() == params.size() && v.size() == params.size(),
            "adamw_step: params/grads/m/v have ", params.size(), "/", grads.size(), "/", m.size(), "/", v.size(),
            " elements");
  MOM_CHECK(step >= 1, "adamw_step: step = ", step, " must be >= 1 (1-based, for bias correction)");
}

// ---- depth routing: the checks the depth branch's CPU ops (cpu/depth.hpp, dc98a76) make inline,
// with the same messages, for the CUDA backend ---------------------------------------------------
template <class T>
void sigmoid_forward_shapes(CS<T> out, CS<T> x) {
  MOM_CHECK(out.size() == x.size(), "sigmoid_forward: out has ", out.size(), " elements, x ", x.size());
}
template <class T>
void sigmoid_backward_shapes(CS<T> dx, CS<T> out, CS<T> dout) {
  MOM_CHECK(dx.size() == out.size() && dout.size() == out.size(), "sigmoid_backward: dx ", dx.size(), ", out ",
            out.size(), ", dout ", dout.size(), " elements disagree");
}
inline void bce_logits_backward_grad_shapes(index_t n_dlogits, index_t n_logits) {
  MOM_CHECK(n_dlogits == n_logits, "bce_logits_backward: dlogits has ", n_dlogits, " elements, logits ", n_logits);
}

// ---- grouped ops (core/groups.hpp) -----------------------------------------------
inline void row_groups_shape(const char* op, RowGroups g) {
  MOM_CHECK(g.count >= 0 && g.count <= max_row_groups && (g.count == 0 || g.offsets != nullptr), op, ": ", g.count,
            " row groups (at most ", max_row_groups, ", with offsets)");
}
// y [rows x out] and x [rows x in] of a grouped linear (the per-group weights are [out x in]).
template <class T>
void grouped_linear_shapes(const char* op, CM<T> y, CM<T> x, bool has_weights) {
  MOM_CHECK(y.rows == x.rows, op, ": y ", shape(y), " and x ", shape(x), " must have the same rows");
  MOM_CHECK(has_weights, op, ": no weights");
}
template <class T>
void same_shape(const char* op, CM<T> a, CM<T> b) {
  MOM_CHECK(a.rows == b.rows && a.cols == b.cols, op, ": ", shape(a), " and ", shape(b), " must match");
}

// ---- stick-breaking attention (ModuleFormer, arXiv 2306.04640; cpu/stick_breaking.hpp) --------------
// Forward and backward check attention_qkv_shapes and attention_backward_grad_shapes (nothing saved but out).
// A decode op (attention_decode, stick_breaking_decode): out [rows × heads·hd], qkv [rows × (heads + 2·kv)·hd],
// caches [slots·max_len × kv·hd] (kv = kv_heads, not given: = heads; a given one must divide heads), one slot and
// one position per row (their values are range-checked by each backend: the CPU on the host, CUDA on the device).
template <class T>
void decode_shapes(const char* op, CM<T> out, CM<T> qkv, CM<T> k_cache, CM<T> v_cache, index_t n_slot, index_t n_pos,
                   index_t max_len, index_t heads, std::optional<index_t> kv_heads = std::nullopt) {
  if (kv_heads)
    MOM_CHECK(*kv_heads > 0 && heads % *kv_heads == 0, op, ": kv_heads = ", *kv_heads, " does not divide heads = ",
              heads);
  const index_t kv = kv_heads.value_or(heads), d = k_cache.cols, rows = qkv.rows;
  MOM_CHECK(heads > 0 && d % kv == 0 && qkv.cols == (heads + 2 * kv) * (d / kv) && out.rows == rows &&
                out.cols == heads * (d / kv) && v_cache.cols == d && v_cache.rows == k_cache.rows,
            op, ": ", heads, " heads", kv != heads ? " (" + std::to_string(kv) + " key/value)" : std::string(), ", qkv ",
            shape(qkv), ", out ", shape(out), ", caches ",
            shape(k_cache), " and ", shape(v_cache), " disagree");
  MOM_CHECK(n_slot == rows && n_pos == rows, op, ": ", n_slot, " slots and ", n_pos, " positions for ", rows, " rows");
  MOM_CHECK(max_len > 0 && k_cache.rows % max_len == 0, op, ": cache of ", k_cache.rows, " rows is not slots x max_len ",
            max_len);
}

}  // namespace mom::checks

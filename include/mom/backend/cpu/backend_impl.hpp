#pragma once
// The out-of-class definitions of cpu::Backend<T>'s ops (backend.hpp declares them): each forwards to the op of the
// same name in mom::cpu with the scalar fixed to T. Outside the class they are not inline, so a program of several
// translation units can compile them once: `template struct mom::cpu::Backend<float>;` in one unit and
// `extern template struct mom::cpu::Backend<float>;` in the others (mom-train does: examples/backend_cpu.hpp).
// Without those two lines nothing changes: every unit compiles the ops it calls, and the linker keeps one copy.
#include "mom/backend/cpu/backend.hpp"

namespace mom::cpu {

template <class T>
void Backend<T>::gemm(M C, CM A, Trans ta, CM B, Trans tb, T alpha, T beta) const {
  cpu::gemm<T>(C, A, ta, B, tb, alpha, beta);
}

template <class T>
void Backend<T>::linear_forward(M y, CM x, CM w, CS b) const {
  cpu::linear_forward<T>(y, x, w, b);
}

template <class T>
void Backend<T>::linear_backward(M dx, M dw, S db, CM dy, CM x, CM w, Store dx_store) const {
  cpu::linear_backward<T>(dx, dw, db, dy, x, w, dx_store);
}

template <class T>
void Backend<T>::embedding_forward(M out, Tok tokens, CM wte, CM wpe, index_t seq) const {
  cpu::embedding_forward<T>(out, tokens, wte, wpe, seq);
}

template <class T>
void Backend<T>::embedding_forward(M out, Tok tokens, CM wte, CM wpe, std::span<const index_t> pos) const {
  cpu::embedding_forward<T>(out, tokens, wte, wpe, pos);
}

template <class T>
void Backend<T>::embedding_backward(M dwte, M dwpe, CM dout, Tok tokens, index_t seq) const {
  cpu::embedding_backward<T>(dwte, dwpe, dout, tokens, seq);
}

template <class T>
void Backend<T>::kv_write(M k_cache, M v_cache, CM qkv, std::span<const index_t> slot, std::span<const index_t> pos,
                          index_t max_len) const {
  cpu::kv_write<T>(k_cache, v_cache, qkv, slot, pos, max_len);
}

template <class T>
void Backend<T>::attention_decode(M out, CM qkv, CM k_cache, CM v_cache, std::span<const index_t> slot,
                                  std::span<const index_t> pos, index_t max_len, index_t heads) const {
  cpu::attention_decode<T>(out, qkv, k_cache, v_cache, slot, pos, max_len, heads);
}

template <class T>
void Backend<T>::stick_breaking_decode(M out, CM qkv, CM k_cache, CM v_cache, std::span<const index_t> slot,
                                       std::span<const index_t> pos, index_t max_len, index_t heads,
                                       index_t kv_heads) const {
  cpu::stick_breaking_decode<T>(out, qkv, k_cache, v_cache, slot, pos, max_len, heads, kv_heads);
}

template <class T>
void Backend<T>::layernorm_forward(M out, S mean, S rstd, CM x, CS gamma, CS beta, T eps) const {
  cpu::layernorm_forward<T>(out, mean, rstd, x, gamma, beta, eps);
}

template <class T>
void Backend<T>::layernorm_backward(M dx, S dgamma, S dbeta, CM dout, CM x, CS mean, CS rstd, CS gamma) const {
  cpu::layernorm_backward<T>(dx, dgamma, dbeta, dout, x, mean, rstd, gamma);
}

template <class T>
void Backend<T>::gelu_forward(S out, CS x) const {
  cpu::gelu_forward<T>(out, x);
}

template <class T>
void Backend<T>::gelu_backward(S dx, CS x, CS dout, Store st) const {
  cpu::gelu_backward<T>(dx, x, dout, st);
}

template <class T>
void Backend<T>::relu_forward(S out, CS x) const {
  cpu::relu_forward<T>(out, x);
}

template <class T>
void Backend<T>::relu_backward(S dx, CS x, CS dout, Store st) const {
  cpu::relu_backward<T>(dx, x, dout, st);
}

template <class T>
void Backend<T>::add_forward(S out, CS a, CS b) const {
  cpu::add_forward<T>(out, a, b);
}

template <class T>
void Backend<T>::axpy(S y, T alpha, CS x) const {
  cpu::axpy<T>(y, alpha, x);
}

template <class T>
void Backend<T>::scale(S y, T alpha) const {
  cpu::scale<T>(y, alpha);
}

template <class T>
void Backend<T>::cross_entropy_forward(S loss_out, S lse, CM logits, Tok targets, token_t ignore_index) const {
  cpu::cross_entropy_forward<T>(loss_out, lse, logits, targets, ignore_index);
}

template <class T>
void Backend<T>::cross_entropy_backward(M dlogits, CM logits, CS lse, Tok targets, T dloss,
                                        token_t ignore_index) const {
  cpu::cross_entropy_backward<T>(dlogits, logits, lse, targets, dloss, ignore_index);
}

template <class T>
void Backend<T>::attention_forward(M out, S lse, CM qkv, index_t batch, index_t seq, index_t heads) const {
  cpu::attention_forward<T>(out, lse, qkv, batch, seq, heads);
}

template <class T>
void Backend<T>::attention_backward(M dqkv, CM dout, CM out, CS lse, CM qkv, index_t batch, index_t seq,
                                    index_t heads) const {
  cpu::attention_backward<T>(dqkv, dout, out, lse, qkv, batch, seq, heads);
}

template <class T>
void Backend<T>::stick_breaking_forward(M out, CM qkv, index_t batch, index_t seq, index_t heads,
                                        index_t kv_heads) const {
  cpu::stick_breaking_forward<T>(out, qkv, batch, seq, heads, kv_heads);
}

template <class T>
void Backend<T>::stick_breaking_backward(M dqkv, CM dout, CM out, CM qkv, index_t batch, index_t seq, index_t heads,
                                         index_t kv_heads) const {
  cpu::stick_breaking_backward<T>(dqkv, dout, out, qkv, batch, seq, heads, kv_heads);
}

template <class T>
void Backend<T>::rope_forward(M x, std::span<const index_t> pos, index_t seq, index_t head_dim, T base) const {
  cpu::rope_forward<T>(x, pos, seq, head_dim, base);
}

template <class T>
void Backend<T>::rope_backward(M dx, std::span<const index_t> pos, index_t seq, index_t head_dim, T base) const {
  cpu::rope_backward<T>(dx, pos, seq, head_dim, base);
}

template <class T>
void Backend<T>::rope_forward(M x, Tok idx, index_t seq, index_t head_dim, T base, RowGroups g) const {
  cpu::rope_forward<T>(x, idx, seq, head_dim, base, g);
}

template <class T>
void Backend<T>::rope_backward(M dx, Tok idx, index_t seq, index_t head_dim, T base, RowGroups g) const {
  cpu::rope_backward<T>(dx, idx, seq, head_dim, base, g);
}

template <class T>
void Backend<T>::gather_rows(M out, CM in, Tok idx) const {
  cpu::gather_rows<T>(out, in, idx);
}

template <class T>
void Backend<T>::scatter_add_rows(M out, CM in, Tok idx, CS weights, Store st) const {
  cpu::scatter_add_rows<T>(out, in, idx, weights, st);
}

template <class T>
void Backend<T>::scatter_add_rows_backward(M din, S dweights, CM dout, CM in, Tok idx, CS weights, Store st) const {
  cpu::scatter_add_rows_backward<T>(din, dweights, dout, in, idx, weights, st);
}

template <class T>
void Backend<T>::topk_rows(M values, MatrixView<token_t> indices, CM x) const {
  cpu::topk_rows<T>(values, indices, x);
}

template <class T>
void Backend<T>::topk_rows_backward(M dx, CM dvalues, MatrixView<const token_t> indices) const {
  cpu::topk_rows_backward<T>(dx, dvalues, indices);
}

template <class T>
void Backend<T>::softmax_rows(M y, CM x, T scale) const {
  cpu::softmax_rows<T>(y, x, scale);
}

template <class T>
void Backend<T>::softmax_rows_backward(M dx, CM dy, CM y, T scale) const {
  cpu::softmax_rows_backward<T>(dx, dy, y, scale);
}

template <class T>
void Backend<T>::gru_cell_forward(M h_out, M gates, CM x, CM h, CM w_ih, CM w_hh, CS b_ih, CS b_hh) const {
  cpu::gru_cell_forward<T>(h_out, gates, x, h, w_ih, w_hh, b_ih, b_hh);
}

template <class T>
void Backend<T>::gru_cell_backward(M dx, M dh, M dw_ih, M dw_hh, S db_ih, S db_hh, M scratch, CM dh_out, CM gates, CM x,
                                   CM h, CM w_ih, CM w_hh) const {
  cpu::gru_cell_backward<T>(dx, dh, dw_ih, dw_hh, db_ih, db_hh, scratch, dh_out, gates, x, h, w_ih, w_hh);
}

template <class T>
void Backend<T>::route_topk_forward(M weights, MatrixView<token_t> picks, M probs, CM logits, T inv_temp,
                                    bool renormalise) const {
  cpu::route_topk_forward<T>(weights, picks, probs, logits, inv_temp, renormalise);
}

template <class T>
void Backend<T>::route_topk_backward(M dlogits, CM dweights, CM weights, CM probs, MatrixView<const token_t> picks,
                                     T inv_temp, bool renormalise, CS dprobs_col) const {
  cpu::route_topk_backward<T>(dlogits, dweights, weights, probs, picks, inv_temp, renormalise, dprobs_col);
}

template <class T>
void Backend<T>::group_by_choice(std::span<token_t> row_token, std::span<token_t> row_slot, std::span<token_t> offsets,
                                 MatrixView<const token_t> picks, index_t classes) const {
  cpu::group_by_choice(row_token, row_slot, offsets, picks, classes);
}

template <class T>
void Backend<T>::affinity_topk_forward(M weights, MatrixView<token_t> picks, M probs, CM scores, CS bias,
                                       index_t shared, index_t groups, index_t top_groups, bool renormalise,
                                       T scale) const {
  cpu::affinity_topk_forward<T>(weights, picks, probs, scores, bias, shared, groups, top_groups, renormalise, scale);
}

template <class T>
void Backend<T>::affinity_topk_backward(M dscores, CM dweights, CM scores, MatrixView<const token_t> picks,
                                        index_t shared, bool renormalise, T scale, CS dprobs_col) const {
  cpu::affinity_topk_backward<T>(dscores, dweights, scores, picks, shared, renormalise, scale, dprobs_col);
}

template <class T>
void Backend<T>::expert_load_add(S load, Tok offsets) const {
  cpu::expert_load_add<T>(load, offsets);
}

template <class T>
void Backend<T>::bias_balance_update(S bias, CS load, T rate) const {
  cpu::bias_balance_update<T>(bias, load, rate);
}

template <class T>
void Backend<T>::sequence_balance_forward(S loss_out, M dscores, M freq, CM scores, MatrixView<const token_t> picks,
                                          index_t shared, index_t seq, T coef) const {
  cpu::sequence_balance_forward<T>(loss_out, dscores, freq, scores, picks, shared, seq, coef);
}

template <class T>
void Backend<T>::expert_choice_forward(M weights, MatrixView<token_t> picks, CM probs, index_t capacity) const {
  cpu::expert_choice_forward<T>(weights, picks, probs, capacity);
}

template <class T>
void Backend<T>::expert_choice_backward(M dprobs, CM dweights, MatrixView<const token_t> picks) const {
  cpu::expert_choice_backward<T>(dprobs, dweights, picks);
}

template <class T>
void Backend<T>::balance_loss_forward(S loss_out, S dprobs_col, CM probs, Tok offsets, index_t k, T coef) const {
  cpu::balance_loss_forward<T>(loss_out, dprobs_col, probs, offsets, k, coef);
}

template <class T>
void Backend<T>::router_z_loss_forward(S loss_out, M dlogits, CM logits, T inv_temp, T coef) const {
  cpu::router_z_loss_forward<T>(loss_out, dlogits, logits, inv_temp, coef);
}

template <class T>
void Backend<T>::selection_entropy_forward(S loss_out, M dlogits, CM logits, index_t batch, index_t seq, T coef,
                                           T cond_coef) const {
  cpu::selection_entropy_forward<T>(loss_out, dlogits, logits, batch, seq, coef, cond_coef);
}

template <class T>
void Backend<T>::attention_packed_forward(M out, S lse, CM q, CM k, CM v, Tok q_tok, Tok k_tok, index_t seq,
                                          index_t heads) const {
  cpu::attention_packed_forward<T>(out, lse, q, k, v, q_tok, k_tok, seq, heads);
}

template <class T>
void Backend<T>::attention_packed_backward(M dq, M dk, M dv, CM dout, CM out, CS lse, CM q, CM k, CM v, Tok q_tok,
                                           Tok k_tok, index_t seq, index_t heads) const {
  cpu::attention_packed_backward<T>(dq, dk, dv, dout, out, lse, q, k, v, q_tok, k_tok, seq, heads);
}

template <class T>
void Backend<T>::grouped_linear_forward(M y, CM x, CPG w, CPG b, RowGroups g) const {
  cpu::grouped_linear_forward<T>(y, x, w, b, g);
}

template <class T>
void Backend<T>::grouped_linear_forward(M y, CM x, Tok idx, CPG w, CPG b, RowGroups g, Epilogue ep) const {
  cpu::grouped_linear_forward<T>(y, x, idx, w, b, g, ep);
}

template <class T>
void Backend<T>::grouped_linear_backward(M dx, PG dw, PG db, CM dy, CM x, Tok idx, CPG w, RowGroups g,
                                         Store dx_store) const {
  cpu::grouped_linear_backward<T>(dx, dw, db, dy, x, idx, w, g, dx_store);
}

template <class T>
void Backend<T>::grouped_linear_backward(M dx, PG dw, PG db, CM dy, CM x, CPG w, RowGroups g, Store dx_store) const {
  cpu::grouped_linear_backward<T>(dx, dw, db, dy, x, w, g, dx_store);
}

template <class T>
void Backend<T>::grouped_linear_backward(M dx, PG dw, ScaledRows<T> dy, CM x, Tok idx, CPG w, RowGroups g,
                                         Store dx_store) const {
  cpu::grouped_linear_backward<T>(dx, dw, dy, x, idx, w, g, dx_store);
}

template <class T>
void Backend<T>::grouped_layernorm_forward(M out, S mean, S rstd, CM x, CPG gamma, CPG beta, RowGroups g, T eps) const {
  cpu::grouped_layernorm_forward<T>(out, mean, rstd, x, gamma, beta, g, eps);
}

template <class T>
void Backend<T>::grouped_layernorm_backward(M dx, PG dgamma, PG dbeta, CM dout, CM x, CS mean, CS rstd, CPG gamma,
                                            RowGroups g, Store dx_store) const {
  cpu::grouped_layernorm_backward<T>(dx, dgamma, dbeta, dout, x, mean, rstd, gamma, g, dx_store);
}

template <class T>
void Backend<T>::grouped_layernorm_forward(M out, S mean, S rstd, CM x, Tok idx, CPG gamma, CPG beta, RowGroups g,
                                           T eps) const {
  cpu::grouped_layernorm_forward<T>(out, mean, rstd, x, idx, gamma, beta, g, eps);
}

template <class T>
void Backend<T>::grouped_layernorm_backward(M dx, PG dgamma, PG dbeta, CM dout, CM x, Tok idx, CS mean, CS rstd,
                                            CPG gamma, RowGroups g, Store dx_store) const {
  cpu::grouped_layernorm_backward<T>(dx, dgamma, dbeta, dout, x, idx, mean, rstd, gamma, g, dx_store);
}

template <class T>
void Backend<T>::gelu_forward(M out, CM x, RowGroups g) const {
  cpu::gelu_forward<T>(out, x, g);
}

template <class T>
void Backend<T>::gelu_backward(M dx, CM x, CM dout, RowGroups g, Store st) const {
  cpu::gelu_backward<T>(dx, x, dout, g, st);
}

template <class T>
void Backend<T>::add_forward(M out, CM a, CM b, RowGroups g) const {
  cpu::add_forward<T>(out, a, b, g);
}

template <class T>
void Backend<T>::axpy(M y, T alpha, CM x, RowGroups g) const {
  cpu::axpy<T>(y, alpha, x, g);
}

template <class T>
void Backend<T>::zero_rows(M m, RowGroups g) const {
  cpu::zero_rows<T>(m, g);
}

template <class T>
void Backend<T>::gather_rows(M out, CM in, Tok idx, RowGroups g) const {
  cpu::gather_rows<T>(out, in, idx, g);
}

template <class T>
void Backend<T>::gather_rows(M out, CPG in, index_t in_rows, Tok idx, RowGroups g) const {
  cpu::gather_rows<T>(out, in, in_rows, idx, g);
}

template <class T>
void Backend<T>::scatter_add_rows(M out, CM in, Tok idx, CS weights, RowGroups g, Store st) const {
  cpu::scatter_add_rows<T>(out, in, idx, weights, g, st);
}

template <class T>
void Backend<T>::scatter_add_rows(PG out, index_t out_rows, CM in, Tok idx, RowGroups g) const {
  cpu::scatter_add_rows<T>(out, out_rows, in, idx, g);
}

template <class T>
void Backend<T>::scatter_add_rows_backward(M din, S dweights, CM dout, CM in, Tok idx, CS weights, RowGroups g,
                                           Store st) const {
  cpu::scatter_add_rows_backward<T>(din, dweights, dout, in, idx, weights, g, st);
}

template <class T>
void Backend<T>::weight_rows_backward(M d, S dwp, CM u, CM a, Tok idx, CS w, RowGroups g, bool relu) const {
  cpu::weight_rows_backward<T>(d, dwp, u, a, idx, w, g, relu);
}

template <class T>
void Backend<T>::attention_grouped_forward(M out, S lse, CM q, CPG k, CPG v, index_t kv_rows, index_t kv_ld, Tok q_tok,
                                           Tok k_tok, RowGroups g, index_t seq, index_t heads) const {
  cpu::attention_grouped_forward<T>(out, lse, q, k, v, kv_rows, kv_ld, q_tok, k_tok, g, seq, heads);
}

template <class T>
void Backend<T>::attention_grouped_backward(M dq, PG dk, PG dv, CM dout, CM out, CS lse, CM q, CPG k, CPG v,
                                            index_t kv_rows, index_t kv_ld, Tok q_tok, Tok k_tok, RowGroups g,
                                            index_t seq, index_t heads) const {
  cpu::attention_grouped_backward<T>(dq, dk, dv, dout, out, lse, q, k, v, kv_rows, kv_ld, q_tok, k_tok, g, seq, heads);
}

template <class T>
void Backend<T>::select_topc_per_sequence(std::span<token_t> idx, CS scores, index_t batch, index_t seq) const {
  cpu::select_topc_per_sequence<T>(idx, scores, batch, seq);
}

template <class T>
void Backend<T>::selection_mask(S mask, Tok idx) const {
  cpu::selection_mask<T>(mask, idx);
}

template <class T>
void Backend<T>::skip_select(std::span<token_t> idx, std::span<token_t> count, std::span<token_t> alive,
                             CS logits) const {
  cpu::skip_select<T>(idx, count, alive, logits);
}

template <class T>
void Backend<T>::depth_choice_rows(S decision, S coef, Tok picks, CS weights, index_t r) const {
  cpu::depth_choice_rows<T>(decision, coef, picks, weights, r);
}

template <class T>
void Backend<T>::depth_choice_rows_backward(S dweights, CS dcoef, Tok picks, index_t r) const {
  cpu::depth_choice_rows_backward<T>(dweights, dcoef, picks, r);
}

template <class T>
void Backend<T>::sigmoid_forward(S out, CS x) const {
  cpu::sigmoid_forward<T>(out, x);
}

template <class T>
void Backend<T>::sigmoid_backward(S dx, CS out, CS dout) const {
  cpu::sigmoid_backward<T>(dx, out, dout);
}

template <class T>
void Backend<T>::bce_logits_forward(S out, CS logits, CS targets) const {
  cpu::bce_logits_forward<T>(out, logits, targets);
}

template <class T>
void Backend<T>::bce_logits_backward(S dlogits, CS logits, CS targets, T scale) const {
  cpu::bce_logits_backward<T>(dlogits, logits, targets, scale);
}

template <class T>
void Backend<T>::grad_norm(CS grads, T* norm_out) const {
  cpu::grad_norm<T>(grads, norm_out);
}

template <class T>
void Backend<T>::adamw_step(S params, CS grads, S m, S v, const AdamWConfig& cfg, std::int64_t step, const T* grad_norm,
                            T max_norm) const {
  cpu::adamw_step<T>(params, grads, m, v, cfg, step, grad_norm, max_norm);
}

}  // namespace mom::cpu

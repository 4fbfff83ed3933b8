#pragma once
// The CUDA backend's ops of routed models, over device memory: router top-K and its losses, the grouping of
// (token, pick) slots by class (group_by_choice, group_by_module: CUB radix sort and scan on the device),
// DeepSeekMoE's affinity routing and expert-choice selection, the packed and grouped causal attention, the
// depth-routing ops (Mixture-of-Depths, layer-skip, early-exit) and the grouped ops over RowGroups whose
// offsets never leave the device (docs/cuda.md, "Grouped ops" and "Token dispatch"). Host shape checks with
// the CPU ops' messages, then a launcher (kernels.hpp, depth_kernels.hpp, grouped_kernels.hpp) on the stream.
// cuda::Backend<T> (backend.hpp) derives from RoutedOps<T>, which extends MlpOps<T> (mlp_ops.hpp) and through it
// AttentionOps<T> (attention_ops.hpp), NormOps<T> (norm_ops.hpp) and DenseOps<T> (ops.hpp).
#include <cstddef>
#include <span>

#include "mom/backend/cuda/depth_kernels.hpp"
#include "mom/backend/cuda/grouped_kernels.hpp"
#include "mom/backend/cuda/kernels.hpp"
#include "mom/backend/cuda/mlp_ops.hpp"
#include "mom/backend/cuda/ops.hpp"
#include "mom/backend/cuda/staging.hpp"
#include "mom/backend/shape_checks.hpp"
#include "mom/core/check.hpp"
#include "mom/core/groups.hpp"
#include "mom/core/tensor.hpp"

namespace mom::cuda::detail {

template <class T>
class RoutedOps : public MlpOps<T> {
  using Base = MlpOps<T>;

 public:
  using M = MatrixView<T>;
  using CM = MatrixView<const T>;
  using S = std::span<T>;
  using CS = std::span<const T>;
  using Tok = std::span<const token_t>;
  using PG = PerGroup<T>;
  using CPG = PerGroup<const T>;
  using K = Kernels<T>;
  using DK = DepthKernels<T>;

  using Base::Base;
  // The dense ops of the same names (one overload set with the grouped ones below).
  using Base::add_forward;
  using Base::axpy;
  using Base::gather_rows;
  using Base::gelu_backward;
  using Base::gelu_forward;
  using Base::scatter_add_rows;
  using Base::scatter_add_rows_backward;

  // ---- routed assembly (cpu/routing.hpp) -------------------------------------
  void route_topk_forward(M weights, MatrixView<token_t> picks, M probs, CM logits, T inv_temp, bool renormalise) const {
    checks::route_topk_forward_shapes<T>(weights, picks, probs, logits);
    K::route_topk_forward(*ctx_, weights, picks, probs, logits, inv_temp, renormalise);
  }
  void route_topk_backward(M dlogits, CM dweights, CM weights, CM probs, MatrixView<const token_t> picks, T inv_temp,
                           bool renormalise, CS dprobs_col) const {
    checks::route_topk_backward_shapes<T>(dlogits, dweights, weights, probs, picks, dprobs_col);
    K::route_topk_backward(*ctx_, dlogits, dweights, weights, probs, picks, inv_temp, renormalise,
                           dprobs_col.empty() ? nullptr : dprobs_col.data());
  }
  // Stable grouping of the n×K (token, pick) slots by class: group_by_module over the flat picks
  // (CUB radix sort + scan), then row_token = slot / K. Stays on the device.
  void group_by_choice(std::span<token_t> row_token, std::span<token_t> row_slot, std::span<token_t> offsets,
                       MatrixView<const token_t> picks, index_t classes) const {
    const index_t n = picks.rows, k = picks.cols, E = classes;
    checks::group_by_choice_shapes(row_token, row_slot, offsets, picks, E);
    MOM_CHECK(picks.contiguous() || n <= 1, "group_by_choice: picks ", shape(picks), " with row stride ", picks.ld,
              " must be contiguous on the CUDA backend");
    cuda::reserve_dispatch(*ctx_, n * k, E);
    cuda::group_by_module(*ctx_, row_slot.data(), ctx_->sorted_keys, offsets.data(), ctx_->counts, picks.data, n * k, E,
                          DeviceError::group_choice);
    cuda::slots_to_rows(*ctx_, row_token.data(), row_slot.data(), n * k, k);
  }
  // Switch-style balance loss (Fedus et al. 2022, eq. (4)); reads the group offsets on the device.
  void balance_loss_forward(S loss_out, S dprobs_col, CM probs, Tok offsets, index_t k, T coef) const {
    const index_t E = probs.cols;
    checks::balance_loss_forward_shapes<T>(loss_out, dprobs_col, probs, offsets);
    MOM_CHECK(E <= Context::reduce_blocks, "balance_loss_forward: ", E, " classes exceed the CUDA backend's ",
              Context::reduce_blocks);
    K::balance_loss_forward(*ctx_, loss_out.data(), dprobs_col.data(), probs, offsets.data(), k, coef);
  }
  void router_z_loss_forward(S loss_out, M dlogits, CM logits, T inv_temp, T coef) const {
    checks::router_z_loss_shapes<T>(loss_out, dlogits, logits);
    K::router_z_loss_forward(*ctx_, loss_out.data(), dlogits, logits, inv_temp, coef);
  }
  void affinity_topk_forward(M weights, MatrixView<token_t> picks, M probs, CM scores, CS bias, index_t shared,
                             index_t groups, index_t top_groups, bool renormalise, T scale) const {
    checks::affinity_topk_forward_shapes<T>(weights, picks, probs, scores, ssize(bias), shared, groups, top_groups);
    K::affinity_topk_forward(*ctx_, weights, picks, probs, scores, bias.data(), shared, groups, top_groups, renormalise,
                             scale);
  }
  void affinity_topk_backward(M dscores, CM dweights, CM scores, MatrixView<const token_t> picks, index_t shared,
                              bool renormalise, T scale, CS dprobs_col) const {
    checks::affinity_topk_backward_shapes<T>(dscores, dweights, scores, picks, shared, ssize(dprobs_col));
    K::affinity_topk_backward(*ctx_, dscores, dweights, scores, picks, shared, renormalise, scale,
                              dprobs_col.empty() ? nullptr : dprobs_col.data());
  }
  void expert_load_add(S load, Tok offsets) const {
    MOM_CHECK(offsets.size() == load.size() + 1, "expert_load_add: ", offsets.size(), " offsets for ", load.size(),
              " classes (needs classes + 1)");
    K::expert_load_add(*ctx_, load.data(), offsets.data(), ssize(load));
  }
  void expert_choice_forward(M weights, MatrixView<token_t> picks, CM probs, index_t capacity) const {
    MOM_CHECK(weights.rows == probs.rows && weights.cols == probs.cols && picks.rows == probs.rows &&
                  picks.cols == probs.cols,
              "expert_choice_forward: weights ", shape(weights), ", picks ", shape(picks), " disagree with probs ",
              shape(probs), " (one slot per expert)");
    MOM_CHECK(capacity >= 0 && capacity <= probs.rows, "expert_choice_forward: capacity ", capacity,
              " must be in [0, ", probs.rows, "] (the rows)");
    K::expert_choice_forward(*ctx_, weights, picks, probs, capacity);
  }
  void expert_choice_backward(M dprobs, CM dweights, MatrixView<const token_t> picks) const {
    MOM_CHECK(dprobs.rows == picks.rows && dprobs.cols == picks.cols && dweights.rows == picks.rows &&
                  dweights.cols == picks.cols,
              "expert_choice_backward: dprobs ", shape(dprobs), ", dweights ", shape(dweights),
              " disagree with picks ", shape(picks));
    K::expert_choice_backward(*ctx_, dprobs, dweights, picks);
  }
  void bias_balance_update(S bias, CS load, T rate) const {
    MOM_CHECK(bias.size() == load.size() && !bias.empty(), "bias_balance_update: ", bias.size(), " biases for ",
              load.size(), " loads");
    K::bias_balance_update(*ctx_, bias.data(), load.data(), ssize(bias), rate);
  }
  void sequence_balance_forward(S loss_out, M dscores, M freq, CM scores, MatrixView<const token_t> picks, index_t shared,
                                index_t seq, T coef) const {
    checks::sequence_balance_shapes<T>(ssize(loss_out), dscores, freq, scores, picks, shared, seq);
    K::sequence_balance_forward(*ctx_, loss_out.data(), dscores, freq, scores, picks, shared, seq, coef);
  }
  void selection_entropy_forward(S loss_out, M dlogits, CM logits, index_t batch, index_t seq, T coef,
                                 T cond_coef = T(0)) const {
    checks::selection_entropy_shapes<T>(loss_out, dlogits, logits, batch, seq);
    MOM_CHECK(batch <= Context::reduce_blocks && logits.cols <= Context::entropy_classes,
              "selection_entropy_forward: ", batch, " sequences and ", logits.cols,
              " classes exceed the CUDA backend's ", Context::reduce_blocks, " and ", Context::entropy_classes);
    K::selection_entropy_forward(*ctx_, loss_out.data(), dlogits, logits, batch, seq, coef, cond_coef);
  }
  // Causal attention over packed queries/keys (positions q_tok, k_tok ascending; k_tok empty =
  // every token). lse is [nq × heads]. Position order is checked on the device (next sync).
  void attention_packed_forward(M out, S lse, CM q, CM k, CM v, Tok q_tok, Tok k_tok, index_t seq, index_t heads) const {
    check_packed("attention_packed_forward", q, k, v, q_tok, k_tok, seq, heads);
    checks::attention_packed_forward_out_shapes<T>(out, lse, q, heads);
    if (q.rows == 0) return;
    K::attention_packed_forward(*ctx_, out, lse.data(), q, k, v, q_tok.data(), k_tok.empty() ? nullptr : k_tok.data(),
                                seq, heads);
  }
  void attention_packed_backward(M dq, M dk, M dv, CM dout, CM out, CS lse, CM q, CM k, CM v, Tok q_tok, Tok k_tok,
                                 index_t seq, index_t heads) const {
    check_packed("attention_packed_backward", q, k, v, q_tok, k_tok, seq, heads);
    checks::attention_packed_backward_grad_shapes<T>(dq, dk, dv, dout, out, lse, q, k, v, heads);
    if (q.rows == 0) return;
    K::attention_packed_backward(*ctx_, dq, dk, dv, dout, out, lse.data(), q, k, v, q_tok.data(),
                                 k_tok.empty() ? nullptr : k_tok.data(), seq, heads);
  }
  // The packed attention per row group (cpu/grouped.hpp): query row r of group g (offsets[g] <= r <
  // offsets[g+1], read on the device only) attends to k[g] / v[g]: with k_tok empty to its rows
  // t < kv_rows (token t), with k_tok to the rows of g's own row range (tokens k_tok); key rows are
  // kv_ld apart. Rows outside [offsets[0], offsets[count]) are untouched. Bad offsets or query
  // positions are reported at the next sync. dq, dk, dv accumulate; groups' dk / dv rows must not
  // overlap (own buffers per group, or disjoint row ranges of a shared one with k_tok).
  void attention_grouped_forward(M out, S lse, CM q, CPG k, CPG v, index_t kv_rows, index_t kv_ld, Tok q_tok,
                                 Tok k_tok, RowGroups g, index_t seq, index_t heads) const {
    check_grouped_attention("attention_grouped_forward", q, k, v, kv_rows, kv_ld, q_tok, k_tok, g, seq, heads);
    checks::attention_packed_forward_out_shapes<T>(out, lse, q, heads);
    if (q.rows == 0 || g.count == 0) return;
    K::attention_grouped_forward(*ctx_, out, lse.data(), q, k, v, kv_rows, kv_ld, q_tok.data(),
                                 k_tok.empty() ? nullptr : k_tok.data(), g, seq, heads);
  }
  void attention_grouped_backward(M dq, PG dk, PG dv, CM dout, CM out, CS lse, CM q, CPG k, CPG v, index_t kv_rows,
                                  index_t kv_ld, Tok q_tok, Tok k_tok, RowGroups g, index_t seq, index_t heads) const {
    check_grouped_attention("attention_grouped_backward", q, k, v, kv_rows, kv_ld, q_tok, k_tok, g, seq, heads);
    MOM_CHECK(dq.rows == q.rows && dq.cols == q.cols && dout.rows == q.rows && dout.cols == q.cols &&
                  out.rows == q.rows && out.cols == q.cols && ssize(lse) == q.rows * heads && !dk.empty() &&
                  !dv.empty(),
              "attention_grouped_backward: dq ", shape(dq), ", dout ", shape(dout), ", out ", shape(out), ", lse ",
              lse.size(), (dk.empty() || dv.empty() ? " (no dk / dv)" : ""), " disagree with q ", shape(q));
    if (q.rows == 0 || g.count == 0) return;
    K::attention_grouped_backward(*ctx_, dq, dk, dv, dout, out, lse.data(), q, k, v, kv_rows, kv_ld, q_tok.data(),
                                  k_tok.empty() ? nullptr : k_tok.data(), g, seq, heads);
  }

  // ---- depth routing (Mixture-of-Depths, layer-skip, early-exit; cpu/depth.hpp) ---------------
  // The same members and checks as the CPU backend's (depth branch, dc98a76). skip_select leaves the
  // count in device memory (read it with read()); selection_mask reports a bad index at the next sync.
  void select_topc_per_sequence(std::span<token_t> idx, CS scores, index_t batch, index_t seq) const {
    checks::select_topc_shapes(ssize(idx), ssize(scores), batch, seq);
    DK::select_topc_per_sequence(*ctx_, idx.data(), scores.data(), batch, seq, ssize(idx) / batch);
  }
  void selection_mask(S mask, Tok idx) const {
    DK::selection_mask(*ctx_, mask.data(), ssize(mask), idx.data(), ssize(idx));
  }
  void skip_select(std::span<token_t> idx, std::span<token_t> count, std::span<token_t> alive, CS logits) const {
    checks::skip_select_shapes(ssize(idx), ssize(count), ssize(alive), ssize(logits));
    DK::skip_select(*ctx_, idx.data(), count.data(), alive.empty() ? nullptr : alive.data(), logits.data(),
                    ssize(logits));
  }
  void depth_choice_rows(S decision, S coef, Tok picks, CS weights, index_t r) const {
    checks::depth_choice_shapes(ssize(decision), ssize(coef), ssize(picks), ssize(weights));
    DK::depth_choice_rows(*ctx_, decision.data(), coef.data(), picks.data(), weights.data(), ssize(picks), r);
  }
  void depth_choice_rows_backward(S dweights, CS dcoef, Tok picks, index_t r) const {
    checks::depth_choice_shapes(ssize(dweights), ssize(dcoef), ssize(picks), ssize(dweights));
    DK::depth_choice_rows_backward(*ctx_, dweights.data(), dcoef.data(), picks.data(), ssize(picks), r);
  }
  void sigmoid_forward(S out, CS x) const {
    checks::sigmoid_forward_shapes<T>(out, x);
    DK::sigmoid_forward(*ctx_, out.data(), x.data(), ssize(x));
  }
  void sigmoid_backward(S dx, CS out, CS dout) const {
    checks::sigmoid_backward_shapes<T>(dx, out, dout);
    DK::sigmoid_backward(*ctx_, dx.data(), out.data(), dout.data(), ssize(out));
  }
  void bce_logits_forward(S out, CS logits, CS targets) const {
    checks::bce_logits_shapes("bce_logits_forward", ssize(out), ssize(logits), ssize(targets));
    DK::bce_logits_forward(*ctx_, out.data(), logits.data(), targets.data(), ssize(logits));
  }
  void bce_logits_backward(S dlogits, CS logits, CS targets, T scale) const {
    checks::bce_logits_shapes("bce_logits_backward", 2, ssize(logits), ssize(targets));
    checks::bce_logits_backward_grad_shapes(ssize(dlogits), ssize(logits));
    DK::bce_logits_backward(*ctx_, dlogits.data(), logits.data(), targets.data(), scale, ssize(logits));
  }

  // ---- grouped ops (core/groups.hpp, cpu/grouped.hpp) ------------------------------------------
  // The same members and host checks as the CPU backend's, but the offsets are never read on the
  // host: every kernel reads them in device memory (grouped_kernels.hpp), so a routed step has no
  // host-device synchronisation. Offsets outside [0, rows] or decreasing are reported at the next
  // sync (the CPU throws at once). The grouped GEMMs are mom's own kernels (not cuBLAS); in float they
  // follow the precision setting: TF32 and BF16 on tensor cores (mma.sync, operands rounded when staged,
  // fp32 accumulate), FP32 on the CUDA cores; the bias gradient is always summed in full precision.
  using GK = GroupedKernels<T>;

  void grouped_linear_forward(M y, CM x, CPG w, CPG b, RowGroups g) const {
    checks::grouped_linear_shapes<T>("grouped_linear_forward", y, x, !w.empty());
    checks::row_groups_shape("grouped_linear_forward", g);
    GK::linear_forward(*ctx_, y, x, nullptr, w, b, g);
  }
  // The gathered form (y[r] = W_g x[idx[r]] + b_g): bad indices are reported at the next sync.
  void grouped_linear_forward(M y, CM x, Tok idx, CPG w, CPG b, RowGroups g) const {
    MOM_CHECK(ssize(idx) == y.rows, "grouped_linear_forward: ", idx.size(), " row indices for y ", shape(y));
    checks::grouped_linear_shapes<T>("grouped_linear_forward", y, CM{x.data, y.rows, x.cols, x.ld}, !w.empty());
    checks::row_groups_shape("grouped_linear_forward", g);
    GK::linear_forward(*ctx_, y, x, idx.data(), w, b, g);
  }
  void grouped_linear_backward(M dx, PG dw, PG db, CM dy, CM x, CPG w, RowGroups g, Store dx_store = Store::add) const {
    grouped_linear_backward_impl(dx, dw, db, dy, x, x.rows, nullptr, w, g, dx_store);
  }
  void grouped_linear_backward(M dx, PG dw, PG db, CM dy, CM x, Tok idx, CPG w, RowGroups g,
                               Store dx_store = Store::add) const {
    MOM_CHECK(ssize(idx) == dy.rows, "grouped_linear_backward: ", idx.size(), " row indices for dy ", shape(dy));
    grouped_linear_backward_impl(dx, dw, db, dy, x, dy.rows, idx.data(), w, g, dx_store);
  }
  // rows: the packed rows (x's own, or idx's count).
  void grouped_linear_backward_impl(M dx, PG dw, PG db, CM dy, CM x, index_t rows, const token_t* idx, CPG w, RowGroups g,
                                    Store dx_store) const {
    checks::grouped_linear_shapes<T>("grouped_linear_backward", dy, CM{x.data, rows, x.cols, x.ld}, !w.empty());
    MOM_CHECK(dx.empty() || (dx.rows == rows && dx.cols == x.cols), "grouped_linear_backward: dx ", shape(dx),
              " must match x ", Shape{rows, x.cols});
    checks::row_groups_shape("grouped_linear_backward", g);
    if (!dx.empty()) GK::linear_backward_dx(*ctx_, dx, dy, w, g, dx_store == Store::add);
    GK::linear_backward_dw(*ctx_, dw, db, dy, x, idx, g);
  }
  // mean, rstd [x.rows] and every group's gamma / beta are required, as on the CPU (whose
  // per-group checks cannot run here: the group sizes live on the device).
  void grouped_layernorm_forward(M out, S mean, S rstd, CM x, CPG gamma, CPG beta, RowGroups g,
                                 T eps = T(1e-5)) const {
    checks::layernorm_forward_shapes<T>(out, mean, rstd, x, group_span(gamma, x.cols), group_span(beta, x.cols));
    checks::row_groups_shape("grouped_layernorm_forward", g);
    GK::layernorm_forward(*ctx_, out, mean.data(), rstd.data(), x, nullptr, gamma, beta, g, eps);
  }
  // The same over gathered rows: packed row r normalises x[idx[r]] (the gathered copy never written; an index
  // outside x is a DeviceError::gather_index and its row is skipped). Empty idx: x's own rows (the form above).
  void grouped_layernorm_forward(M out, S mean, S rstd, CM x, Tok idx, CPG gamma, CPG beta, RowGroups g,
                                 T eps = T(1e-5)) const {
    if (idx.empty()) return grouped_layernorm_forward(out, mean, rstd, x, gamma, beta, g, eps);
    checks::gathered_norm_shapes<T>("grouped_layernorm_forward", "out", out, x, idx);
    checks::layernorm_forward_shapes<T>(out, mean, rstd, out, group_span(gamma, x.cols), group_span(beta, x.cols));
    checks::row_groups_shape("grouped_layernorm_forward", g);
    GK::layernorm_forward(*ctx_, out, mean.data(), rstd.data(), x, idx.data(), gamma, beta, g, eps);
  }
  void grouped_layernorm_backward(M dx, PG dgamma, PG dbeta, CM dout, CM x, CS mean, CS rstd, CPG gamma,
                                  RowGroups g, Store dx_store = Store::add) const {
    checks::layernorm_backward_shapes<T>(dx, group_span(CPG(dgamma), x.cols), group_span(CPG(dbeta), x.cols), dout, x,
                                         mean, rstd, group_span(gamma, x.cols));
    checks::row_groups_shape("grouped_layernorm_backward", g);
    GK::layernorm_backward(*ctx_, dx, dgamma, dbeta, dout, x, nullptr, mean.data(), rstd.data(), gamma, g,
                           dx_store == Store::add);
  }
  void grouped_layernorm_backward(M dx, PG dgamma, PG dbeta, CM dout, CM x, Tok idx, CS mean, CS rstd, CPG gamma,
                                  RowGroups g, Store dx_store = Store::add) const {
    if (idx.empty()) return grouped_layernorm_backward(dx, dgamma, dbeta, dout, x, mean, rstd, gamma, g, dx_store);
    checks::gathered_norm_shapes<T>("grouped_layernorm_backward", "dout", dout, x, idx);
    checks::layernorm_backward_shapes<T>(dx, group_span(CPG(dgamma), x.cols), group_span(CPG(dbeta), x.cols), dout,
                                         dout, mean, rstd, group_span(gamma, x.cols));
    checks::row_groups_shape("grouped_layernorm_backward", g);
    GK::layernorm_backward(*ctx_, dx, dgamma, dbeta, dout, x, idx.data(), mean.data(), rstd.data(), gamma, g,
                           dx_store == Store::add);
  }
  void gelu_forward(M out, CM x, RowGroups g) const {
    checks::same_shape<T>("gelu_forward", out, x);
    checks::row_groups_shape("gelu_forward", g);
    GK::gelu_forward(*ctx_, out, x, g);
  }
  void gelu_backward(M dx, CM x, CM dout, RowGroups g, Store st = Store::add) const {
    checks::same_shape<T>("gelu_backward", dx, x);
    checks::same_shape<T>("gelu_backward", dout, x);
    checks::row_groups_shape("gelu_backward", g);
    GK::gelu_backward(*ctx_, dx, x, dout, g, st == Store::add);
  }
  void add_forward(M out, CM a, CM b, RowGroups g) const {
    checks::same_shape<T>("add_forward", out, a);
    checks::same_shape<T>("add_forward", out, b);
    checks::row_groups_shape("add_forward", g);
    GK::axpby(*ctx_, out, T(1), a, T(1), b, g);
  }
  void axpy(M y, T alpha, CM x, RowGroups g) const {
    checks::same_shape<T>("axpy", y, x);
    checks::row_groups_shape("axpy", g);
    GK::axpby(*ctx_, y, T(1), CM(y), alpha, x, g);
  }
  void zero_rows(M m, RowGroups g) const {
    checks::row_groups_shape("zero_rows", g);
    GK::zero_rows(*ctx_, m, g);
  }
  void gather_rows(M out, CM in, Tok idx, RowGroups g) const {
    checks::gather_rows_shapes<T>(out, in, idx);
    checks::row_groups_shape("gather_rows", g);
    GK::gather_rows(*ctx_, out, in, idx.data(), g);
  }
  void gather_rows(M out, CPG in, index_t in_rows, Tok idx, RowGroups g) const {
    MOM_CHECK(ssize(idx) == out.rows, "gather_rows: ", idx.size(), " indices for out ", shape(out));
    checks::row_groups_shape("gather_rows", g);
    MOM_CHECK(!in.empty() || g.count == 0, "gather_rows: no per-group inputs");
    GK::gather_rows(*ctx_, out, in, in_rows, idx.data(), g);
  }
  void scatter_add_rows(M out, CM in, Tok idx, CS weights, RowGroups g, Store st = Store::add) const {
    checks::scatter_add_rows_shapes<T>(out, in, idx, weights);
    checks::row_groups_shape("scatter_add_rows", g);
    if (st == Store::overwrite) this->clear(out);
    GK::scatter_add_rows(*ctx_, out, in, idx.data(), weights.empty() ? nullptr : weights.data(), g);
  }
  void scatter_add_rows(PG out, index_t out_rows, CM in, Tok idx, RowGroups g) const {
    MOM_CHECK(ssize(idx) == in.rows, "scatter_add_rows: ", idx.size(), " indices for in ", shape(in));
    checks::row_groups_shape("scatter_add_rows", g);
    MOM_CHECK(!out.empty() || g.count == 0, "scatter_add_rows: no per-group outputs");
    GK::scatter_add_rows(*ctx_, out, out_rows, in, idx.data(), g);
  }
  void scatter_add_rows_backward(M din, S dweights, CM dout, CM in, Tok idx, CS weights, RowGroups g,
                                 Store st = Store::add) const {
    checks::scatter_add_rows_backward_shapes<T>(din, dweights, dout, in, idx, weights);
    checks::row_groups_shape("scatter_add_rows_backward", g);
    GK::scatter_add_rows_backward(*ctx_, din, dweights.empty() ? nullptr : dweights.data(), dout, in, idx.data(),
                                  weights.empty() ? nullptr : weights.data(), g, st == Store::add);
  }

  // Groups (token, module) pairs by module: modules[p] is the module of pair p (e.g. p = token·K + j
  // for a router's K choices). Writes sorted_ids (pair indices, stably sorted by module, so causal
  // order is kept inside each group), sorted_modules, and offsets[n_modules + 1] (group m is
  // [offsets[m], offsets[m+1])). Everything stays on the device: group sizes are never read back.
  // Grows its scratch on first use unless reserve_dispatch sized it.
  void group_by_module(std::span<token_t> sorted_ids, std::span<token_t> sorted_modules, std::span<token_t> offsets,
                       Tok modules, index_t n_modules) const {
    const index_t n = ssize(modules);
    MOM_CHECK(n_modules >= 1, "group_by_module: n_modules = ", n_modules, " must be >= 1");
    MOM_CHECK(ssize(sorted_ids) == n && ssize(sorted_modules) == n, "group_by_module: sorted_ids/sorted_modules have ",
              sorted_ids.size(), "/", sorted_modules.size(), " elements for ", n, " pairs");
    MOM_CHECK(ssize(offsets) == n_modules + 1, "group_by_module: offsets has ", offsets.size(),
              " elements, expected n_modules + 1 = ", n_modules + 1);
    cuda::reserve_dispatch(*ctx_, n, n_modules);
    cuda::group_by_module(*ctx_, sorted_ids.data(), sorted_modules.data(), offsets.data(), ctx_->counts,
                          modules.data(), n, n_modules);
  }

 protected:
  // A per-group tensor's size for the host checks: cols elements when given, empty otherwise.
  static CS group_span(CPG p, index_t cols) { return p.empty() ? CS{} : CS{p.base, std::size_t(cols)}; }
  static void check_packed(const char* op, CM q, CM k, CM v, Tok q_tok, Tok k_tok, index_t seq, index_t heads) {
    checks::packed_attention_shapes<T>(op, q, k, v, q_tok, k_tok, seq, heads);
    MOM_CHECK(q.cols / heads <= 128, op, ": head dimension ", q.cols / heads,
              " exceeds the CUDA kernels' maximum of 128");
  }
  // The CPU's per-group checks (packed_attention_shapes) on the whole packed matrices; every group's
  // key matrix is [kv_rows × d] (k_tok empty) or [q.rows × d] (k_tok given: one key per query row).
  static void check_grouped_attention(const char* op, CM q, CPG k, CPG v, index_t kv_rows, index_t kv_ld, Tok q_tok,
                                      Tok k_tok, RowGroups g, index_t seq, index_t heads) {
    checks::row_groups_shape(op, g);
    MOM_CHECK(!k.empty() && !v.empty() && kv_ld >= q.cols && kv_rows >= 0, op, ": keys ",
              (k.empty() ? "missing" : "given"), ", values ", (v.empty() ? "missing" : "given"), ", kv_rows ", kv_rows,
              ", kv_ld ", kv_ld, " for q ", shape(q));
    const index_t key_rows = k_tok.empty() ? kv_rows : q.rows;
    check_packed(op, q, CM{k.base, key_rows, q.cols, kv_ld}, CM{v.base, key_rows, q.cols, kv_ld}, q_tok, k_tok, seq,
                 heads);
  }

  using Base::ctx_;
};

}  // namespace mom::cuda::detail

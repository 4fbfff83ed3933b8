#pragma once
// Routing layer (docs/design.md, "routing is data"): one router step's selection computed on a backend —
// the top-K of a softmax (select_forward, MoM's GRU routers and MoE's gates), the sigmoid top-K with the
// within-sequence entropy regulariser (σ-MoE, SwitchHead), the grouping of the n·K (row, slot) pairs by
// class, and their backward. Where a selection lives in the workspace is core/selection.hpp; the gathers and
// scatters over its rows are routing/dispatch.hpp.
#include <span>

#include "mom/core/groups.hpp"
#include "mom/core/layout.hpp"
#include "mom/core/selection.hpp"
#include "mom/core/tensor.hpp"

namespace mom::dispatch {

// After a router wrote picks and weights: the (row, slot) pairs grouped by class and the weights in
// group order.
template <class Be, class T>
void group_picks(Be& be, T* ws, const Selection& s, index_t n, index_t k, index_t classes) {
  const std::span<const token_t> row_slot{toks(ws, s.row_slot), std::size_t(n * k)};
  be.group_by_choice(std::span<token_t>{toks(ws, s.row_token), std::size_t(n * k)},
                     std::span<token_t>{toks(ws, s.row_slot), std::size_t(n * k)},
                     std::span<token_t>{toks(ws, s.offsets), std::size_t(classes + 1)},
                     MatrixView<const token_t>{toks(ws, s.picks), n, k}, classes);
  be.gather_rows(MatrixView<T>{ws + s.wpacked, n * k, 1}, MatrixView<const T>{ws + s.weights, n * k, 1}, row_slot);
}

// probs holds the router's logits on entry: softmax(logits · inv_temp) in place, top-K picks and
// weights, the groups, the weights in group order, the balance loss (coefficient coef) plus, with z_coef > 0
// (a selection planned with z_loss), the router z-loss of the logits (its gradient kept in zgrad).
template <class Be, class T>
void select_forward(Be& be, T* ws, const Selection& s, index_t n, index_t k, index_t classes, T inv_temp,
                    bool renormalise, T coef, T z_coef = T(0)) {
  const MatrixView<T> probs{ws + s.probs, n, classes};
  if (z_coef > T(0))
    be.router_z_loss_forward(std::span<T>{ws + s.zloss, 1}, MatrixView<T>{ws + s.zgrad, n, classes},
                             MatrixView<const T>(probs), inv_temp, z_coef);
  be.route_topk_forward(MatrixView<T>{ws + s.weights, n, k}, MatrixView<token_t>{toks(ws, s.picks), n, k}, probs,
                        MatrixView<const T>(probs), inv_temp, renormalise);
  group_picks(be, ws, s, n, k, classes);
  be.balance_loss_forward(std::span<T>{ws + s.loss, 1}, std::span<T>{ws + s.dprobs_col, std::size_t(classes)},
                          MatrixView<const T>(probs),
                          std::span<const token_t>{toks(ws, s.offsets), std::size_t(classes + 1)}, k, coef);
  if (z_coef > T(0)) be.axpy(std::span<T>{ws + s.loss, 1}, T(1), std::span<const T>{ws + s.zloss, 1});
}

// dL/d(weight) from group order (dwp [n·K]) back to the (row, slot) layout of `weights` (dws [n × K]).
template <class Be, class T>
void slot_grads(Be& be, const T* ws, const Selection& s, index_t n, index_t k, std::span<const T> dwp, std::span<T> dws) {
  be.zero(dws);
  be.scatter_add_rows(MatrixView<T>{dws.data(), n * k, 1}, MatrixView<const T>{dwp.data(), n * k, 1},
                      std::span<const token_t>{toks(ws, s.row_slot), std::size_t(n * k)});
}

// Sigmoid top-K selection with the within-sequence entropy regulariser (σ-MoE, SwitchHead; MoEUT
// arXiv 2405.16039 eqs. (1)-(2), (4), (5)-(6)). The logits [n × C] are s.probs on entry (they stay), or the given
// view (a column block of a wider matrix: SwitchHead's selections, whose logits are one product): the regulariser's
// value γ·L into s.loss and its gradient w.r.t. the logits into dreg [n × C], the top-K logits' ids into s.picks,
// their scores σ(logit) (not renormalised) into s.weights, then the groups and the weights in group order.
// n = batch · seq; the regulariser is taken within each sequence of seq rows.
template <class Be, class T>
void sigmoid_select_forward(Be& be, T* ws, const Selection& s, T* dreg, index_t batch, index_t seq, index_t k,
                            index_t classes, T coef, MatrixView<const T> logits_in = {}) {
  const index_t n = batch * seq;
  const MatrixView<const T> logits = logits_in.data ? logits_in : MatrixView<const T>{ws + s.probs, n, classes};
  const MatrixView<T> weights{ws + s.weights, n, k};
  be.selection_entropy_forward(std::span<T>{ws + s.loss, 1}, MatrixView<T>{dreg, n, classes}, logits, batch, seq, coef);
  be.topk_rows(weights, MatrixView<token_t>{toks(ws, s.picks), n, k}, logits);  // σ is monotonic
  be.sigmoid_forward(weights.flat(), std::span<const T>(weights.flat()));
  group_picks(be, ws, s, n, k, classes);
}
// Its backward: dwp holds dL/d(weight) in group order; dws and dv are n·K scratch; dlogits [n × C] (it may be a
// column block of a wider matrix) is overwritten with dL/dlogits, the regulariser's gradient (dreg) included.
template <class Be, class T>
void sigmoid_select_backward(Be& be, const T* ws, const Selection& s, const T* dreg, index_t n, index_t k,
                             index_t classes, std::span<const T> dwp, std::span<T> dws, std::span<T> dv,
                             MatrixView<T> dlogits) {
  slot_grads(be, ws, s, n, k, dwp, dws);
  be.zero(dv);
  be.sigmoid_backward(dv, std::span<const T>{ws + s.weights, std::size_t(n * k)}, std::span<const T>(dws));
  be.copy(dlogits, MatrixView<const T>{dreg, n, classes});
  be.topk_rows_backward(dlogits, MatrixView<const T>{dv.data(), n, k}, MatrixView<const token_t>{toks(ws, s.picks), n, k});
}

// Backward of select_forward (and of the balance loss and z-loss): dwp holds dL/d(weight) in group order;
// dws is n·K scratch; dlogits [n × classes] is overwritten with dL/dlogits.
template <class Be, class T>
void select_backward(Be& be, const T* ws, const Selection& s, index_t n, index_t k, index_t classes, T inv_temp,
                     bool renormalise, std::span<const T> dwp, std::span<T> dws, MatrixView<T> dlogits,
                     T z_coef = T(0)) {
  slot_grads(be, ws, s, n, k, dwp, dws);
  be.zero(dlogits.flat());
  be.route_topk_backward(dlogits, MatrixView<const T>{dws.data(), n, k}, MatrixView<const T>{ws + s.weights, n, k},
                         MatrixView<const T>{ws + s.probs, n, classes},
                         MatrixView<const token_t>{toks(ws, s.picks), n, k}, inv_temp, renormalise,
                         std::span<const T>{ws + s.dprobs_col, std::size_t(classes)});
  if (z_coef > T(0)) be.axpy(dlogits.flat(), T(1), std::span<const T>{ws + s.zgrad, std::size_t(n * classes)});
}

}  // namespace mom::dispatch

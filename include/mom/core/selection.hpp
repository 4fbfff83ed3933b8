#pragma once
// One router step's selection in the workspace, shared by every router that picks classes per row
// (MoM's GRU routers, MoE's top-K gates, user gates; docs/design.md "Data and the hot path"):
//   probs [n × C]    the router's probabilities (its logits before select_forward)
//   weights, picks   [n × K] the picked classes' weights and ids (a class >= the number of modules is a
//                    no-op: SKIP, or an unused slot of a router that picks fewer than K)
//   row_token, row_slot, offsets   the n·K (row, slot) pairs grouped by class with a stable counting
//                    sort (causal order kept inside a group); offsets stay in backend memory
//   wpacked [n·K]    the weights in group order; loss [1] the router's auxiliary loss
//   zgrad [n × C], zloss [1]   the router z-loss's gradient and value (planned only with a z-loss)
#include <span>

#include "mom/core/groups.hpp"
#include "mom/core/layout.hpp"
#include "mom/core/tensor.hpp"

namespace mom::dispatch {

// token_t index lists live in the T workspace (T is float or double, at least as wide as
// token_t): room for `count` of them.
constexpr index_t tok_elems(index_t count) {
  return (count * index_t(sizeof(token_t)) + index_t(sizeof(float)) - 1) / index_t(sizeof(float));
}
// index_t lists (the decoder's slots and positions) likewise: room for `count` of them.
constexpr index_t index_elems(index_t count) {
  return (count * index_t(sizeof(index_t)) + index_t(sizeof(float)) - 1) / index_t(sizeof(float));
}
template <class T>
token_t* toks(T* ws, index_t off) {
  return reinterpret_cast<token_t*>(ws + off);
}
template <class T>
const token_t* toks(const T* ws, index_t off) {
  return reinterpret_cast<const token_t*>(ws + off);
}

// A host list copied to base + off (backend memory, off in base's elements: an ordered host -> device copy on
// a device backend), returned there: the decoder's slots, positions and tokens for the ops.
template <class Be, class T, class U>
std::span<const U> from_host_at(Be& be, T* base, index_t off, std::span<const U> host) {
  const std::span<U> dev(reinterpret_cast<U*>(base + off), host.size());
  be.from_host(dev, host);
  return dev;
}

// One router step's selection in the workspace, for n tokens, K picks, C classes.
struct Selection {
  index_t probs = 0, weights = 0, wpacked = 0, dprobs_col = 0, loss = 0;  // T: n×C, n×K, n·K, C, 1
  index_t picks = 0, row_token = 0, row_slot = 0, offsets = 0;            // token_t: n×K, n·K, n·K, C+1
  index_t zgrad = -1, zloss = -1;                                         // T: n×C, 1 (-1: no z-loss)
};
constexpr Selection plan_selection(Arena& a, index_t n, index_t k, index_t classes, bool z_loss = false) {
  Selection s{};
  s.probs = a.take(n * classes);
  s.weights = a.take(n * k);
  s.wpacked = a.take(n * k);
  s.dprobs_col = a.take(classes);
  s.loss = a.take(1);
  s.picks = a.take(tok_elems(n * k));
  s.row_token = a.take(tok_elems(n * k));
  s.row_slot = a.take(tok_elems(n * k));
  s.offsets = a.take(tok_elems(classes + 1));
  if (z_loss) {
    s.zgrad = a.take(n * classes);
    s.zloss = a.take(1);
  }
  return s;
}

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

// Sigmoid top-K selection with the within-sequence entropy regulariser (σ-MoE, SwitchHead; MoEUT
// arXiv 2405.16039 eqs. (1)-(2), (4), (5)-(6)). s.probs holds the logits [n × C] on entry (they stay):
// the regulariser's value γ·L into s.loss and its gradient w.r.t. the logits into dreg [n × C], the top-K
// logits' ids into s.picks, their scores σ(logit) (not renormalised) into s.weights, then the groups and
// the weights in group order. n = batch · seq; the regulariser is taken within each sequence of seq rows.
template <class Be, class T>
void sigmoid_select_forward(Be& be, T* ws, const Selection& s, T* dreg, index_t batch, index_t seq, index_t k,
                            index_t classes, T coef) {
  const index_t n = batch * seq;
  const MatrixView<const T> logits{ws + s.probs, n, classes};
  const MatrixView<T> weights{ws + s.weights, n, k};
  be.selection_entropy_forward(std::span<T>{ws + s.loss, 1}, MatrixView<T>{dreg, n, classes}, logits, batch, seq, coef);
  be.topk_rows(weights, MatrixView<token_t>{toks(ws, s.picks), n, k}, logits);  // σ is monotonic
  be.sigmoid_forward(weights.flat(), std::span<const T>(weights.flat()));
  group_picks(be, ws, s, n, k, classes);
}
// Its backward: dwp holds dL/d(weight) in group order; dws and dv are n·K scratch; dlogits [n × C] is
// overwritten with dL/dlogits, the regulariser's gradient (dreg) included.
template <class Be, class T>
void sigmoid_select_backward(Be& be, const T* ws, const Selection& s, const T* dreg, index_t n, index_t k,
                             index_t classes, std::span<const T> dwp, std::span<T> dws, std::span<T> dv,
                             MatrixView<T> dlogits) {
  slot_grads(be, ws, s, n, k, dwp, dws);
  be.zero(dv);
  be.sigmoid_backward(dv, std::span<const T>{ws + s.weights, std::size_t(n * k)}, std::span<const T>(dws));
  be.copy(dlogits.flat(), std::span<const T>{dreg, std::size_t(n * classes)});
  be.topk_rows_backward(dlogits, MatrixView<const T>{dv.data(), n, k}, MatrixView<const token_t>{toks(ws, s.picks), n, k});
}

// The row groups of a selection's first `modules` classes, in group order; the offsets stay in
// backend memory. SKIP (the last class) is left out, so its rows are never touched.
template <class T>
RowGroups groups_of(const T* ws, const Selection& s, int modules) {
  return {toks(ws, s.offsets), modules};
}

// dL/d(weight) from group order (dwp [n·K]) back to the (row, slot) layout of `weights` (dws [n × K]).
template <class Be, class T>
void slot_grads(Be& be, const T* ws, const Selection& s, index_t n, index_t k, std::span<const T> dwp, std::span<T> dws) {
  be.zero(dws);
  be.scatter_add_rows(MatrixView<T>{dws.data(), n * k, 1}, MatrixView<const T>{dwp.data(), n * k, 1},
                      std::span<const token_t>{toks(ws, s.row_slot), std::size_t(n * k)});
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

// Backward of the weighted scatter-adds of `modules` groups (module m's outputs y in group order
// at ws + y_off), read from dres before anything accumulates into it: dL/dy into dy [n·K × d]
// (group order) and dL/d(weight) into dwp [n·K] (zeroed here).
template <class Be, class T>
void weighted_scatter_backward(Be& be, const T* ws, const Selection& s, index_t y_off, int modules,
                               MatrixView<const T> dres, T* dy, T* dwp, index_t n, index_t k) {
  const index_t d = dres.cols, rows = n * k;
  const RowGroups g = groups_of(ws, s, modules);
  be.zero(std::span<T>(dwp, std::size_t(rows)));
  const MatrixView<T> dyv{dy, rows, d};
  be.zero_rows(dyv, g);
  be.scatter_add_rows_backward(dyv, std::span<T>(dwp, std::size_t(rows)), dres, MatrixView<const T>{ws + y_off, rows, d},
                               std::span<const token_t>(toks(ws, s.row_token), std::size_t(rows)),
                               std::span<const T>(ws + s.wpacked, std::size_t(rows)), g);
}

}  // namespace mom::dispatch

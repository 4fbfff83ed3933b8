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
// This header is vocabulary only (where a selection lives in the workspace); what computes one, and the
// gathers and scatters over its rows, is the routing layer (routing/select.hpp, routing/dispatch.hpp).
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

// The row groups of a selection's first `modules` classes, in group order; the offsets stay in
// backend memory. SKIP (the last class) is left out, so its rows are never touched.
template <class T>
RowGroups groups_of(const T* ws, const Selection& s, int modules) {
  return {toks(ws, s.offsets), modules};
}

}  // namespace mom::dispatch

#pragma once
// Routing layer: the one "gather → run per group → weighted scatter" of every routed module
// (docs/design.md, "routing is data"). A selection (core/selection.hpp, computed by routing/select.hpp)
// lists the n·K (token, pick) pairs grouped by class; RoutedRows is that list as views:
//   token[r]    the source row of packed row r (row_token), in group order (causal order inside a group)
//   pair[r]     its (token, slot) pair t·K + j (row_slot): the position of its weight in weights [n × K]
//   weight[r]   its routing weight (wpacked)
//   groups      group m = the packed rows of class m (m < the number of modules; SKIP's group is left out,
//               so its rows are never touched); the offsets stay in backend memory
// and the ops over it are
//   gather           xg[r] = in[token[r]]                    (the modules' inputs, group order)
//   combine          out[token[r]] += weight[r] · y[r]       (paper eq. (5)/(6): out = in + Σ r_m · m(in));
//                    Store::overwrite: out = Σ weight[r] · y[r] (a fresh output, not zeroed first)
//   combine_backward dL/dy[r] = weight[r] · dout[token[r]],  dL/dweight[r] = dout[token[r]] · y[r]
//   combine_linear_backward  the same and the modules' first backward product over dL/dy, which reads it inside
//                    its GEMM on the CPU (never written: ScaledRows, core/groups.hpp)
//   weigh_after_products  the same with the weights applied after the product, dL/d(weight) from its input's rows
//                    (the CPU's, where the input is narrower than y or a ReLU follows)
//   gather_backward  din[token[r]] += dxg[r]
//   to_pairs / from_pairs   group order ↔ token-major pair order (t·K + j): MoA's query slots
//   routed_forward   gather, the per-group body, combine
// Every module and executor that routes rows (the GRU executor's attention and FFN, MoE's experts, σ-MoE, SMoE,
// MoA, SwitchHead; the depth executors' blocks: MoD, layer-skip, early exit, MoR) goes through these; the per-group body is the module's own (routing/expert_mlp.hpp for an
// expert MLP). On the CUDA backend every op is a grouped kernel that reads the offsets on the device: the
// host never waits for a routing decision.
#include <span>
#include <type_traits>

#include "mom/core/groups.hpp"
#include "mom/core/selection.hpp"
#include "mom/core/tensor.hpp"

namespace mom::dispatch {

// Parameters other than the rows take what converts to them (MatrixView<T> for MatrixView<const T>).
template <class U>
using Id = std::type_identity_t<U>;

template <class T>
struct RoutedRows {
  std::span<const token_t> token, pair;
  std::span<const T> weight;  // empty: every weight is 1
  RowGroups groups;           // no offsets: one run of all the rows, no groups (a depth router's top-C rows)
  index_t count() const { return index_t(token.size()); }
  bool grouped() const { return groups.offsets != nullptr; }
};

// The packed rows of a selection over n tokens with K picks, grouped over its first `modules` classes.
template <class T>
RoutedRows<T> routed_rows(const T* ws, const Selection& s, int modules, index_t n, index_t k) {
  const auto rows = std::size_t(n * k);
  return {{toks(ws, s.row_token), rows}, {toks(ws, s.row_slot), rows}, {ws + s.wpacked, rows}, groups_of(ws, s, modules)};
}

// The rows a depth router runs through its block (Mixture-of-Depths, layer-skip, Mixture-of-Recursions:
// assembly/depth_*.hpp, recursion_blocks.hpp): token[r] the source rows, weight[r] their weights (empty: 1),
// in one row group g (packed layouts) or, without g, all of them.
template <class T>
RoutedRows<T> picked_rows(std::span<const token_t> token, std::span<const T> weight, RowGroups g = {}) {
  return {token, {}, weight, g};
}

// xg [rows × cols] (group order) = the routed rows of in.
template <class Be, class T>
void gather(Be& be, const RoutedRows<T>& rr, Id<MatrixView<const T>> in, Id<MatrixView<T>> xg) {
  if (rr.grouped()) be.gather_rows(xg, in, rr.token, rr.groups);
  else be.gather_rows(xg, in, rr.token);
}

// out += Σ_r weight[r] · y[r] at row token[r] (out holds the residual); st = Store::overwrite: out = that sum
// (a fresh output: rows no routed row names are zero, nothing needs zeroing first).
template <class Be, class T>
void combine(Be& be, const RoutedRows<T>& rr, Id<MatrixView<const T>> y, Id<MatrixView<T>> out, Store st = Store::add) {
  if (rr.grouped()) be.scatter_add_rows(out, y, rr.token, rr.weight, rr.groups, st);
  else be.scatter_add_rows(out, y, rr.token, rr.weight, st);
}

// Backward of combine, read from dout before anything accumulates into it: dL/dy written into dy [rows × cols]
// (group order; the groups' rows, the others untouched) and dL/d(weight) into dwp [rows] (zero outside the groups;
// empty: not wanted). y: the forward's module outputs.
template <class Be, class T>
void combine_backward(Be& be, const RoutedRows<T>& rr, Id<MatrixView<const T>> y, Id<MatrixView<const T>> dout, Id<MatrixView<T>> dy,
                      Id<std::span<T>> dwp) {
  if (rr.grouped()) {
    be.zero(dwp);  // n·K values: the rows no group holds (SKIP) read as zero
    be.scatter_add_rows_backward(dy, dwp, dout, y, rr.token, rr.weight, rr.groups, Store::overwrite);
  } else {
    be.scatter_add_rows_backward(dy, dwp, dout, y, rr.token, rr.weight, Store::overwrite);
  }
}

// A backend whose grouped linear backward reads dL/dy as scaled rows of a table (core/groups.hpp's ScaledRows: the
// CPU's, inside its GEMM's packing) instead of a stored matrix. Optional: combine_linear_backward writes dL/dy
// out for the others (the CUDA backend).
template <class Be, class T>
concept ReadsScaledRows = requires(Be& be, MatrixView<T> m, PerGroup<T> pg, ScaledRows<T> dy, MatrixView<const T> cm,
                                   std::span<const token_t> tok, PerGroup<const T> cpg, RowGroups g) {
  be.grouped_linear_backward(m, pg, dy, cm, tok, cpg, g, Store::overwrite);
};

// A backend that also applies the routed rows' weights after their products, in one pass with dL/d(weight)
// (weight_rows_backward: backend/cpu/dispatch.hpp). Optional, with ReadsScaledRows (the CPU's).
template <class Be, class T>
concept WeighsAfterProducts =
    ReadsScaledRows<Be, T> && requires(Be& be, MatrixView<T> m, std::span<T> s, MatrixView<const T> cm,
                                       std::span<const token_t> tok, std::span<const T> cs, RowGroups g) {
      be.weight_rows_backward(m, s, cm, cm, tok, cs, g, true);
    };

// combine_backward and the first product's backward with the weights applied after the product (a backend that
// WeighsAfterProducts), for y[r] = x[r] W_gᵀ combined as weight[r] · y[r]:
//   u = dout[token] · W_g into u (unweighted),  dW_g += (weight · dout[token])ᵀ · x,
//   then one pass over the rows: dL/d(weight)[r] = u[r] · x[r] into dwp (= dout[token[r]] · y[r] by
//   associativity) and d[r] = weight[r] · u[r] (relu: x is a ReLU's output and d is dL/d(its input), ReLU's backward
//   read from x). d may be u.
// It reads x's rows (x_idx: through that index) where combine_backward reads y's: the cheaper when x is the narrower,
// and with relu the activation's backward pass is the same pass. Not combine_linear_backward's bits: the weight
// multiplies a sum instead of each of its terms, and the dot runs over x's columns instead of y's.
template <class Be, class T>
  requires WeighsAfterProducts<Be, T>
void weigh_after_products(Be& be, const RoutedRows<T>& rr, Id<MatrixView<const T>> dout, Id<std::span<T>> dwp,
                          Id<MatrixView<T>> u, Id<MatrixView<T>> d, Id<PerGroup<T>> dw, Id<MatrixView<const T>> x,
                          Id<std::span<const token_t>> x_idx, Id<PerGroup<const T>> w, bool relu) {
  be.zero(dwp);  // n·K values: the rows no group holds (SKIP) read as zero, as combine_backward leaves them
  be.grouped_linear_backward(u, PerGroup<T>{}, ScaledRows<T>{dout, rr.token, {}}, x, x_idx, w, rr.groups,
                             Store::overwrite);
  be.grouped_linear_backward(MatrixView<T>{}, dw, ScaledRows<T>{dout, rr.token, rr.weight}, x, x_idx, w, rr.groups,
                             Store::overwrite);
  be.weight_rows_backward(d, dwp, MatrixView<const T>(u), x, x_idx, rr.weight, rr.groups, relu);
}

// combine_backward and the first product of the routed modules' backward, which reads its result:
// dL/d(weight) into dwp (as combine_backward), and with dL/dy[r] = weight[r] · dout[token[r]]
//   dx = dL/dy · W_g (dx_store),  dW_g += dL/dyᵀ · x   (x's rows through x_idx when given: the gathered input)
// over every group g. A backend that ReadsScaledRows reads dL/dy inside both products and it is never written
// (the same bits: each value is the same one product); otherwise it is written into dy first. Where the backend
// WeighsAfterProducts, dx is written (not added) and x is narrower than y, weigh_after_products does it instead.
template <class Be, class T>
void combine_linear_backward(Be& be, const RoutedRows<T>& rr, Id<MatrixView<const T>> y, Id<MatrixView<const T>> dout,
                             Id<MatrixView<T>> dy, Id<std::span<T>> dwp, Id<MatrixView<T>> dx, Id<PerGroup<T>> dw,
                             Id<MatrixView<const T>> x, Id<std::span<const token_t>> x_idx, Id<PerGroup<const T>> w,
                             Store dx_store) {
  if constexpr (WeighsAfterProducts<Be, T>) {
    if (dx_store == Store::overwrite && !dx.empty() && x.cols < y.cols)
      return weigh_after_products(be, rr, dout, dwp, dx, dx, dw, x, x_idx, w, false);
  }
  if constexpr (ReadsScaledRows<Be, T>) {
    combine_backward(be, rr, y, dout, MatrixView<T>{}, dwp);
    be.grouped_linear_backward(dx, dw, ScaledRows<T>{dout, rr.token, rr.weight}, x, x_idx, w, rr.groups, dx_store);
  } else {
    combine_backward(be, rr, y, dout, dy, dwp);
    const MatrixView<const T> cdy(dy);
    if (x_idx.empty()) be.grouped_linear_backward(dx, dw, PerGroup<T>{}, cdy, x, w, rr.groups, dx_store);
    else be.grouped_linear_backward(dx, dw, PerGroup<T>{}, cdy, x, x_idx, w, rr.groups, dx_store);
  }
}

// Backward of gather: din[token[r]] += dxg[r] (st = Store::overwrite: din = that sum, as combine).
template <class Be, class T>
void gather_backward(Be& be, const RoutedRows<T>& rr, Id<MatrixView<const T>> dxg, Id<MatrixView<T>> din,
                     Store st = Store::add) {
  if (rr.grouped()) be.scatter_add_rows(din, dxg, rr.token, std::span<const T>{}, rr.groups, st);
  else be.scatter_add_rows(din, dxg, rr.token, std::span<const T>{}, st);
}

// Group order → pair order: pairs [n·K × cols] row t·K + j = packed [r] (a pair no group holds is zero).
template <class Be, class T>
void to_pairs(Be& be, const RoutedRows<T>& rr, Id<MatrixView<const T>> packed, Id<MatrixView<T>> pairs) {
  be.scatter_add_rows(pairs, packed, rr.pair, std::span<const T>{}, rr.groups, Store::overwrite);
}
// Pair order → group order: packed [r] = pairs [pair[r]].
template <class Be, class T>
void from_pairs(Be& be, const RoutedRows<T>& rr, Id<MatrixView<const T>> pairs, Id<MatrixView<T>> packed) {
  be.gather_rows(packed, pairs, rr.pair, rr.groups);
}

// out += Σ_m Σ_{r in group m} weight[r] · f_m(in[token[r]]): gather into xg, body(xg, y, groups) runs every
// module over exactly its group's rows, combine. An unchosen module has an empty group and costs nothing.
template <class Be, class T, class Body>
void routed_forward(Be& be, const RoutedRows<T>& rr, Id<MatrixView<const T>> in, Id<MatrixView<T>> xg, Id<MatrixView<T>> y,
                    Id<MatrixView<T>> out, Body&& body) {
  gather(be, rr, in, xg);
  body(MatrixView<const T>(xg), y, rr.groups);
  combine(be, rr, MatrixView<const T>(y), out);
}

// The previous spelling of combine_backward (before the routing layer), kept for one release.
template <class Be, class T>
[[deprecated("use dispatch::combine_backward(be, dispatch::routed_rows(ws, sel, modules, n, k), y, dres, dy, dwp)")]]
void weighted_scatter_backward(Be& be, const T* ws, const Selection& s, index_t y_off, int modules,
                               MatrixView<const T> dres, T* dy, T* dwp, index_t n, index_t k) {
  const index_t d = dres.cols, rows = n * k;
  combine_backward(be, routed_rows(ws, s, modules, n, k), MatrixView<const T>{ws + y_off, rows, d}, dres,
                   MatrixView<T>{dy, rows, d}, std::span<T>(dwp, std::size_t(rows)));
}

}  // namespace mom::dispatch

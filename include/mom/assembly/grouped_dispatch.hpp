#pragma once
// Grouped dispatch, shared by the routed executors (assembly/mom.hpp: MoM's routers and FFN
// half-round; assembly/moe.hpp: the MoE FFN step). DESIGN.md "Data and the hot path":
//   select:   softmax / top-K of one router step's logits, the K picked weights (renormalised),
//             the n×K (token, pick) slots grouped by class with a stable counting sort (causal
//             order kept inside a group), the weights in group order, the balance loss
//   FFN:      per FFN module m: gather its group's rows, run m over exactly those rows, one
//             weighted scatter-add into the output; a module no token picked costs nothing, and
//             the SKIP class (the last, >= the number of modules) is never touched
//   backward: the weighted scatter-adds first (dL/dy and dL/dweight, read from the output
//             gradient before anything accumulates into it), then the modules, then the router.
#include <array>
#include <span>

#include "mom/core/layout.hpp"
#include "mom/core/tensor.hpp"
#include "mom/modules/ffn.hpp"

namespace mom::dispatch {

// token_t index lists live in the T workspace (T is float or double, at least as wide as
// token_t): room for `count` of them.
constexpr index_t tok_elems(index_t count) {
  return (count * index_t(sizeof(token_t)) + index_t(sizeof(float)) - 1) / index_t(sizeof(float));
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
};
constexpr Selection plan_selection(Arena& a, index_t n, index_t k, index_t classes) {
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
  return s;
}

// probs holds the router's logits on entry: softmax(logits · inv_temp) in place, top-K picks and
// weights, the groups, the weights in group order, the balance loss (coefficient coef).
template <class Be, class T>
void select_forward(Be& be, T* ws, const Selection& s, index_t n, index_t k, index_t classes, T inv_temp,
                    bool renormalise, T coef) {
  const MatrixView<T> probs{ws + s.probs, n, classes};
  const std::span<const token_t> row_slot{toks(ws, s.row_slot), std::size_t(n * k)};
  be.route_topk_forward(MatrixView<T>{ws + s.weights, n, k}, MatrixView<token_t>{toks(ws, s.picks), n, k}, probs,
                        MatrixView<const T>(probs), inv_temp, renormalise);
  be.group_by_choice(std::span<token_t>{toks(ws, s.row_token), std::size_t(n * k)},
                     std::span<token_t>{toks(ws, s.row_slot), std::size_t(n * k)},
                     std::span<token_t>{toks(ws, s.offsets), std::size_t(classes + 1)},
                     MatrixView<const token_t>{toks(ws, s.picks), n, k}, classes);
  be.gather_rows(MatrixView<T>{ws + s.wpacked, n * k, 1}, MatrixView<const T>{ws + s.weights, n * k, 1}, row_slot);
  be.balance_loss_forward(std::span<T>{ws + s.loss, 1}, std::span<T>{ws + s.dprobs_col, std::size_t(classes)},
                          MatrixView<const T>(probs),
                          std::span<const token_t>{toks(ws, s.offsets), std::size_t(classes + 1)}, k, coef);
}

// The group offsets of the last select_forward, on the host (classes + 1 <= Max + 1 entries).
template <int Max, class Be, class T>
std::array<token_t, Max + 1> host_offsets(Be& be, const T* ws, const Selection& s, index_t classes) {
  std::array<token_t, Max + 1> out{};
  be.to_host(std::span<token_t>(out.data(), std::size_t(classes + 1)),
             std::span<const token_t>(toks(ws, s.offsets), std::size_t(classes + 1)));
  return out;
}

// Backward of select_forward (and of the balance loss): dwp holds dL/d(weight) in group order;
// dws is n·K scratch; dlogits [n × classes] is overwritten with dL/dlogits.
template <class Be, class T>
void select_backward(Be& be, const T* ws, const Selection& s, index_t n, index_t k, index_t classes, T inv_temp,
                     bool renormalise, std::span<const T> dwp, std::span<T> dws, MatrixView<T> dlogits) {
  be.zero(dws);
  be.scatter_add_rows(MatrixView<T>{dws.data(), n * k, 1}, MatrixView<const T>{dwp.data(), n * k, 1},
                      std::span<const token_t>{toks(ws, s.row_slot), std::size_t(n * k)});
  be.zero(dlogits.flat());
  be.route_topk_backward(dlogits, MatrixView<const T>{dws.data(), n, k}, MatrixView<const T>{ws + s.weights, n, k},
                         MatrixView<const T>{ws + s.probs, n, classes},
                         MatrixView<const token_t>{toks(ws, s.picks), n, k}, inv_temp, renormalise,
                         std::span<const T>{ws + s.dprobs_col, std::size_t(classes)});
}

// Backward of the weighted scatter-adds of `modules` groups (module m's outputs y in group order
// at ws + y_off), read from dres before anything accumulates into it: dL/dy into dy [n·K × d]
// (group order) and dL/d(weight) into dwp [n·K] (zeroed here).
template <std::size_t N, class Be, class T>
void weighted_scatter_backward(Be& be, const T* ws, const Selection& s, index_t y_off,
                               const std::array<token_t, N>& offsets, int modules, MatrixView<const T> dres,
                               T* dy, T* dwp, index_t n, index_t k) {
  const index_t d = dres.cols;
  be.zero(std::span<T>(dwp, std::size_t(n * k)));
  for (int m = 0; m < modules; ++m) {
    const index_t o = offsets[m], nm = offsets[m + 1] - offsets[m];
    if (nm == 0) continue;
    const MatrixView<T> dym{dy + o * d, nm, d};
    be.zero(dym.flat());
    be.scatter_add_rows_backward(dym, std::span<T>(dwp + o, std::size_t(nm)), dres,
                                 MatrixView<const T>{ws + y_off + o * d, nm, d},
                                 std::span<const token_t>(toks(ws, s.row_token) + o, std::size_t(nm)),
                                 std::span<const T>(ws + s.wpacked + o, std::size_t(nm)));
  }
}

// FFN modules over their groups (paper eq. (6): out = in + Σ_{m picked} r_m · m(in)).
template <Dims D>
struct RoutedFfn {
  using Ffn = modules::FeedForward<D>;
  static constexpr index_t d = D.d_model, f = D.ff();

  // Packed rows (n·K at most, group order): gathered inputs x, outputs y, the module's activations.
  struct Saved {
    index_t x = 0, y = 0;
    typename Ffn::Saved ffn{};
  };
  static constexpr Saved plan(Arena& a, index_t rows) {
    Saved s{};
    s.x = a.take(rows * d);
    s.ffn = Ffn::plan(a, 1, rows);
    s.y = a.take(rows * d);
    return s;
  }
  // Backward scratch: dL/d(gathered input) [rows × d] and the module's scratch.
  static constexpr index_t scratch(index_t rows) { return rows * d + Ffn::scratch(1, rows); }

  // The module activations of the packed rows starting at row o.
  static constexpr typename Ffn::Saved rows_from(typename Ffn::Saved s, index_t o) {
    s.ln += o * d;
    s.mean += o;
    s.rstd += o;
    s.pre += o * f;
    s.act += o * f;
    return s;
  }

  // out (holding the residual) += Σ_m w · m(in) over module m's group; offset(m): module m's
  // parameter block in p; classes >= modules (SKIP's group, if any, is never touched).
  template <std::size_t N, class Be, class T, class ParamOffset>
  static void forward(Be& be, const T* p, T* ws, const Saved& s, const Selection& sel,
                      const std::array<token_t, N>& offsets, int modules, ParamOffset offset,
                      MatrixView<const T> in, MatrixView<T> out) {
    for (int m = 0; m < modules; ++m) {
      const index_t o = offsets[m], nm = offsets[m + 1] - offsets[m];
      if (nm == 0) continue;  // an unchosen module costs nothing
      const std::span<const token_t> idx(toks(ws, sel.row_token) + o, std::size_t(nm));
      const MatrixView<T> xg{ws + s.x + o * d, nm, d}, y{ws + s.y + o * d, nm, d};
      be.gather_rows(xg, in, idx);
      Ffn::forward(be, p + offset(m), ws, rows_from(s.ffn, o), MatrixView<const T>(xg), y, 1, nm);
      be.scatter_add_rows(out, MatrixView<const T>(y), idx, std::span<const T>(ws + sel.wpacked + o, std::size_t(nm)));
    }
  }

  // The modules' backward, after weighted_scatter_backward put dL/dy in dy: parameter gradients
  // into g, input gradients scatter-added into din.
  template <std::size_t N, class Be, class T, class ParamOffset>
  static void backward(Be& be, const T* p, T* g, const T* ws, const Saved& s, const Selection& sel,
                       const std::array<token_t, N>& offsets, int modules, ParamOffset offset, const T* dy,
                       MatrixView<T> din, T* scratch) {
    for (int m = 0; m < modules; ++m) {
      const index_t o = offsets[m], nm = offsets[m + 1] - offsets[m];
      if (nm == 0) continue;
      const std::span<const token_t> idx(toks(ws, sel.row_token) + o, std::size_t(nm));
      const MatrixView<T> dxg{scratch, nm, d};
      be.zero(dxg.flat());
      const index_t at = offset(m);
      Ffn::backward(be, p + at, g + at, ws, rows_from(s.ffn, o), MatrixView<const T>{ws + s.x + o * d, nm, d}, dxg,
                    MatrixView<const T>{dy + o * d, nm, d}, scratch + nm * d, 1, nm);
      be.scatter_add_rows(din, MatrixView<const T>(dxg), idx);
    }
  }
};

}  // namespace mom::dispatch

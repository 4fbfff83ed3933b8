#pragma once
// Grouped dispatch, shared by the routed executors (assembly/gru.hpp: MoM's routers and FFN
// half-round; assembly/moe.hpp: the MoE FFN step). docs/design.md "Data and the hot path":
//   select:   softmax / top-K of one router step's logits, the K picked weights (renormalised),
//             the n×K (token, pick) slots grouped by class with a stable counting sort (causal
//             order kept inside a group), the weights in group order, the balance loss
//   FFN:      one gather of the grouped rows (routing/dispatch.hpp; none where the module reads its rows in place,
//             ReadsRowsInPlace), the grouped ops (core/groups.hpp) run module m over exactly its group's rows, one
//             weighted scatter-add into the output; a module no
//             token picked costs nothing, the SKIP class (the last, >= the number of modules) is
//             never touched, and the group offsets stay in backend memory: on a GPU the host
//             never waits for the routing decision
//   backward: the weighted scatter-adds first (dL/dy and dL/dweight, read from the output
//             gradient before anything accumulates into it), then the modules, then the router.
#include <array>
#include <span>

#include "mom/core/groups.hpp"
#include "mom/routing/dispatch.hpp"
#include "mom/routing/select.hpp"
#include "mom/core/layout.hpp"
#include "mom/core/tensor.hpp"
#include "mom/modules/module.hpp"
#include "mom/modules/checked.hpp"

namespace mom::dispatch {

// FFN modules over their groups (paper eq. (6): out = in + Σ_{m picked} r_m · m(in)): one gather,
// the modules' grouped GEMMs over exactly their rows, one weighted scatter-add. An unchosen module
// has an empty group and costs nothing; the group sizes never reach the host.
// Ffn: the set's token mixer (a TokenMixer, modules/module.hpp).
template <class Ffn, Dims D>
struct RoutedFfn {
  static constexpr index_t d = D.d_model;
  // A module that reads its rows through the routed rows' token index (modules/module.hpp, ReadsRowsInPlace:
  // FeedForward) is given the layer's input and that index; the rows are gathered into x first for the others.
  static constexpr bool in_place = ReadsRowsInPlace<Ffn>;

  // Packed rows (n·K, group order): gathered inputs x (only where the module does not read them in place),
  // outputs y, the modules' activations.
  struct Saved {
    index_t x = 0, y = 0;
    typename Ffn::Saved ffn{};
  };
  static constexpr Saved plan(Arena& a, index_t rows) {
    Saved s{};
    if constexpr (!in_place) s.x = a.take(rows * d);
    s.ffn = Ffn::plan(a, 1, rows);
    s.y = a.take(rows * d);
    return s;
  }
  // Backward scratch: dL/d(gathered input) [rows × d] and the module's scratch.
  static constexpr index_t scratch(index_t rows) { return rows * d + guarded_scratch<Ffn>(1, rows); }

  // out (holding the residual) += Σ_m w · m(in) over module m's group; offset(m): module m's
  // parameter block in p; classes >= modules (SKIP's group, if any, is never touched).
  template <class Be, class T, class ParamOffset>
  static void forward(Be& be, const T* p, T* ws, const Saved& s, const Selection& sel, int modules, ParamOffset offset,
                      MatrixView<const T> in, MatrixView<T> out, index_t k) {
    static_assert(TokenMixerOn<Ffn, Be, T>,
                  "mom: this FFN module has no forward_grouped / backward_grouped, so it cannot be a routed FFN (MoM, "
                  "MoE experts); a module that routes inside itself, such as SigmaMoE, runs in the dense stack and "
                  "under parameter sharing");
    if constexpr (!TokenMixerOn<Ffn, Be, T>) return;
    else {
      const index_t rows = in.rows * k;
      const auto rr = routed_rows(static_cast<const T*>(ws), sel, modules, in.rows, k);
      const PerGroup<const T> pg(p, modules, offset);
      const MatrixView<T> y{ws + s.y, rows, d};
      if constexpr (in_place) {
        checked<Ffn>::forward_grouped(be, pg, ws, s.ffn, in, rr.token, y, rr.groups);
        combine(be, rr, MatrixView<const T>(y), out);
      } else {
        routed_forward(be, rr, in, MatrixView<T>{ws + s.x, rows, d}, y, out,
                       [&](MatrixView<const T> xg, MatrixView<T> yg, RowGroups g) {
                         checked<Ffn>::forward_grouped(be, pg, ws, s.ffn, xg, yg, g);
                       });
      }
    }
  }

  // The modules' backward, after weighted_scatter_backward put dL/dy in dy: parameter gradients
  // into g, input gradients scatter-added into din. in: the forward's input.
  template <class Be, class T, class ParamOffset>
  static void backward(Be& be, const T* p, T* grads, const T* ws, const Saved& s, const Selection& sel, int modules,
                       ParamOffset offset, MatrixView<const T> in, const T* dy, MatrixView<T> din, T* scratch,
                       index_t k) {
    if constexpr (TokenMixerOn<Ffn, Be, T>) {
      const index_t rows = din.rows * k;
      const auto rr = routed_rows(ws, sel, modules, din.rows, k);
      const MatrixView<T> dxg{scratch, rows, d};
      const PerGroup<const T> pg(p, modules, offset);
      const PerGroup<T> gg(grads, modules, offset);
      const MatrixView<const T> cdy{dy, rows, d};
      if constexpr (in_place)
        checked<Ffn>::backward_grouped(be, pg, gg, ws, s.ffn, in, rr.token, dxg, cdy, scratch + rows * d, rr.groups,
                                       Store::overwrite);
      else
        checked<Ffn>::backward_grouped(be, pg, gg, ws, s.ffn, MatrixView<const T>{ws + s.x, rows, d}, dxg, cdy,
                                       scratch + rows * d, rr.groups, Store::overwrite);
      gather_backward(be, rr, MatrixView<const T>(dxg), din);
    }
  }
};

}  // namespace mom::dispatch

namespace mom {

// The executors' views into their workspace: spans, matrices and token_t lists at element offsets.
// A base class of the routed executors, so that its members are found by unqualified lookup in
// their static member functions.
struct WorkspaceViews {
  static constexpr index_t tok_elems(index_t count) { return dispatch::tok_elems(count); }
  template <class U>
  static auto toks(U* ws, index_t off) {
    return dispatch::toks(ws, off);
  }
  template <class U>
  static std::span<U> sp(U* p, index_t n) {
    return {p, static_cast<std::size_t>(n)};
  }
  template <class U>
  static MatrixView<U> mv(U* p, index_t r, index_t c) {
    return {p, r, c};
  }
  template <class T>
  static MatrixView<const T> cmv(const T* p, index_t r, index_t c) {
    return {p, r, c};
  }
};

}  // namespace mom

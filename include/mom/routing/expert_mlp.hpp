#pragma once
// Routing layer: the expert MLP, written once (σ-MoE with ReLU, arXiv 2310.10837 eq. (3); ModuleFormer's
// SMoE with GELU, arXiv 2306.04640 §3.1): over the packed rows of its group, expert e computes
//   h = x W₁ᵉᵀ,  a = Act(h),  y = a W₂ᵉᵀ          W₁ᵉ [width × d], W₂ᵉ [d × width], no biases
// with the activation a parameter (Relu, Gelu), over the packed rows of routing/dispatch.hpp: each expert's
// rows read from the input through the index list inside W₁'s GEMM (the gathered grouped_linear_*: no gathered
// copy, forward or backward), combined with the routing weights. Every packed row is in some expert's group
// (these selections have no SKIP class): the activation runs over all rows.
#include <span>
#include <type_traits>

#include "mom/core/groups.hpp"
#include "mom/core/layout.hpp"
#include "mom/core/tensor.hpp"
#include "mom/routing/dispatch.hpp"

namespace mom::dispatch {

struct Relu {
  template <class Be, class T>
  static void forward(Be& be, std::span<T> out, std::span<const T> in) {
    be.relu_forward(out, in);
  }
  template <class Be, class T>
  static void backward(Be& be, std::span<T> din, std::span<const T> in, std::span<const T> dout, Store st = Store::add) {
    be.relu_backward(din, in, dout, st);
  }
};
struct Gelu {
  template <class Be, class T>
  static void forward(Be& be, std::span<T> out, std::span<const T> in) {
    be.gelu_forward(out, in);
  }
  template <class Be, class T>
  static void backward(Be& be, std::span<T> din, std::span<const T> in, std::span<const T> dout, Store st = Store::add) {
    be.gelu_backward(din, in, dout, st);
  }
};

// A backend whose gathered grouped linear stores ReLU of its product (Epilogue::relu, core/tensor.hpp: the CPU's,
// tile by tile as the GEMM writes it). Optional: ExpertMlp<Relu> runs the activation as its own pass elsewhere.
template <class Be, class T>
concept FusesRelu = requires(Be& be, MatrixView<T> m, MatrixView<const T> cm, std::span<const token_t> tok,
                             PerGroup<const T> pg, RowGroups g) { be.grouped_linear_forward(m, cm, tok, pg, pg, g, Epilogue::relu); };

// E experts of hidden width `width` over d-wide rows. Their weights are two blocks in the module's
// parameters: W₁ [E·width × d] (expert e: rows e·width ..) and W₂ [E·d × width] (expert e: rows e·d ..).
template <class Act, int E, index_t d, index_t width>
struct ExpertMlp {
  static constexpr index_t w1_size = E * width * d, w2_size = E * d * width;
  // ReLU stored by W₁'s product, where the backward then reads only its output (the weights applied after W₂'s
  // products: routing/dispatch.hpp's weigh_after_products, ReLU's backward from act).
  template <class Be, class T>
  static constexpr bool relu_after_products = std::is_same_v<Act, Relu> && FusesRelu<Be, T> && WeighsAfterProducts<Be, T>;
  template <class T>
  static PerGroup<T> w1(T* block) {
    return uniform_groups(block, E, width * d);
  }
  template <class T>
  static PerGroup<T> w2(T* block) {
    return uniform_groups(block, E, d * width);
  }

  // Packed rows (group order): W₁'s output h and Act(h) [rows × width], the experts' outputs y [rows × d].
  struct Saved {
    index_t h = 0, act = 0, y = 0;
  };
  static constexpr Saved plan(Arena& a, index_t rows) {
    Saved s{};
    s.h = a.take(rows * width);
    s.act = a.take(rows * width);
    s.y = a.take(rows * d);
    return s;
  }
  // Backward scratch: dy [rows × d] (dL/dy, then dL/d(gathered input)), dact and dh [rows × width].
  struct Scratch {
    index_t dy = 0, dact = 0, dh = 0;
  };
  static constexpr Scratch scratch_plan(Arena& a, index_t rows) {
    Scratch s{};
    s.dy = a.take(rows * d);
    s.dact = a.take(rows * width);
    s.dh = a.take(rows * width);
    return s;
  }

  // out += Σ_r weight[r] · MLP_e(in[token[r]]) over every expert e's group (W₁ over the gathered rows, the
  // activation, W₂, combine; st = Store::overwrite: out = that sum).
  template <class Be, class T>
  static void forward(Be& be, const T* pw1, const T* pw2, T* ws, const Saved& s, const RoutedRows<T>& rr,
                      MatrixView<const T> in, MatrixView<T> out, Store st = Store::add) {
    const index_t rows = rr.count();
    const MatrixView<T> h{ws + s.h, rows, width}, act{ws + s.act, rows, width}, y{ws + s.y, rows, d};
    if constexpr (relu_after_products<Be, T>) {
      // act = ReLU(x W₁ᵀ) stored by the product (the same bits; h is not kept: backward reads act only)
      be.grouped_linear_forward(act, in, rr.token, w1(pw1), PerGroup<const T>{}, rr.groups, Epilogue::relu);
    } else {
      be.grouped_linear_forward(h, in, rr.token, w1(pw1), PerGroup<const T>{}, rr.groups);
      Act::forward(be, act.flat(), std::span<const T>(h.flat()));
    }
    be.grouped_linear_forward(y, MatrixView<const T>(act), w2(pw2), PerGroup<const T>{}, rr.groups);
    combine(be, rr, MatrixView<const T>(y), out, st);
  }

  // Backward, dout read first (combine_backward): dL/d(weight) into dwp [rows] (group order), the experts'
  // gradients added into gw1 / gw2 (the gradient blocks), and dL/d(gathered input) returned (scratch dy):
  // the module adds it to its input's gradient with gather_backward where its order of accumulation wants it.
  // in: the forward's input (W₁'s gradient reads its rows through the index list again).
  template <class Be, class T>
  static MatrixView<T> backward(Be& be, const T* pw1, const T* pw2, T* gw1, T* gw2, const T* ws, const Saved& s,
                                const RoutedRows<T>& rr, MatrixView<const T> in, MatrixView<const T> dout, T* sc,
                                const Scratch& c, std::span<T> dwp) {
    const index_t rows = rr.count();
    const RowGroups g = rr.groups;
    const MatrixView<T> dy{sc + c.dy, rows, d}, dact{sc + c.dact, rows, width}, dh{sc + c.dh, rows, width};
    // Every row is in a group (no SKIP class), so each op below overwrites its whole output: no zeroing. W₂'s
    // products read dL/dy = weight · dout[token] (combine_linear_backward: not written where the backend can).
    const MatrixView<const T> act{ws + s.act, rows, width};
    MatrixView<T> dpre = dh;  // dL/dh, what W₁'s products read
    if constexpr (std::is_same_v<Act, Relu> && WeighsAfterProducts<Be, T>) {
      // dact unweighted, then the weights, dL/d(weight) and ReLU's backward (ReLU'(h) = [act > 0]) in one pass over
      // act (weigh_after_products: y is not read), in place: dL/dh overwrites dact row by row
      weigh_after_products(be, rr, dout, dwp, dact, dact, w2(gw2), act, std::span<const token_t>{}, w2(pw2), true);
      dpre = dact;
    } else {
      combine_linear_backward(be, rr, MatrixView<const T>{ws + s.y, rows, d}, dout, dy, dwp, dact, w2(gw2), act,
                              std::span<const token_t>{}, w2(pw2), Store::overwrite);
      Act::backward(be, dh.flat(), std::span<const T>(ws + s.h, std::size_t(rows * width)),
                    std::span<const T>(dact.flat()), Store::overwrite);
    }
    // dy now becomes dL/d(gathered input)
    be.grouped_linear_backward(dy, w1(gw1), PerGroup<T>{}, MatrixView<const T>(dpre), in, rr.token, w1(pw1), g,
                               Store::overwrite);
    return dy;
  }
};

}  // namespace mom::dispatch

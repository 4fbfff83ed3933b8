#pragma once
// The FFN half of a depth-routed block, as a type parameter of the depth executors (assembly/depth.hpp):
//
//   PlainBlockFfn<Set, D>            the set's token mixer (FFN<L, Impl> or Block<L>'s): Dense<L>, MoD,
//                                    layer-skip, early exit
//   MoEBlockFfn<Set, D, Router, k>   MoDE staged (MoD paper §4.3): an MoE step of layer h's E experts
//                                    (Experts<FFN, E, PerStep>) gated by Router's policy with Router's
//                                    options (BlockChoice's ExpertRouter<R> option; default
//                                    Router<TopK<Softmax>>), top-k = the Assembly's K
//
// Both give, for layer h of the stack, with u = x̃ + Attn(x̃) the block's state after attention:
//   forward_residual(u -> out)         out = u + FFN(u)                          (an unrouted layer)
//   forward_block(u, x̃, fo -> fo)      fo := u + FFN(u) − x̃, fo holding Attn(x̃)  (a routed MoD block over (B, C))
//   backward_residual, backward_block  their backward (dres / df: dL/dout, accumulating into it)
// and the plain one also over one row group (the packed rows of a skip layer). Each keeps the
// exact op sequence its case always ran, so every model's losses and gradients are bit for bit
// those of the single executor this replaced.
#include <array>
#include <cstddef>
#include <span>
#include <type_traits>

#include "mom/assembly/moe.hpp"
#include "mom/modules/module.hpp"
#include "mom/routers/gate.hpp"
#include "mom/modules/checked.hpp"

namespace mom::detail {

template <class Set, Dims D>
struct PlainBlockFfn {
  using Ffn = typename Set::template ffn<D>;
  static constexpr index_t d = D.d_model;
  // Parameters beyond the set's: none.
  static constexpr index_t params = 0;
  static constexpr std::size_t tensor_count = 0;
  static constexpr void specs(TensorSpec*, index_t) {}
  static constexpr index_t flops = Ffn::flops_per_token(0), backward_flops = Ffn::backward_flops_per_token(0);

  using Saved = typename Ffn::Saved;
  static constexpr Saved plan(Arena& a, index_t rows) { return Ffn::plan(a, 1, rows); }
  static constexpr index_t scratch(index_t rows) { return guarded_scratch<Ffn>(1, rows); }
  static constexpr index_t offset(int h) { return Set::template ffn_offset<D>(h); }

  template <class Be, class T>
  static void forward_residual(Be& be, const T* p, T* ws, const Saved& s, int h, MatrixView<const T> u,
                               MatrixView<T> out, MatrixView<T> fo, std::span<T> /*aux*/) {
    const std::size_t nd = std::size_t(u.rows * d);
    checked<Ffn>::forward(be, p + offset(h), ws, s, u, fo, 1, u.rows);
    be.add_forward(out.flat(), std::span<const T>(u.data, nd), std::span<const T>(fo.data, nd));
  }
  template <class Be, class T>
  static void forward_block(Be& be, const T* p, T* ws, const Saved& s, int h, MatrixView<const T> u,
                            MatrixView<const T> /*xg*/, MatrixView<T> fo, MatrixView<T> fm, std::span<T> /*aux*/) {
    const std::size_t nd = std::size_t(u.rows * d);
    checked<Ffn>::forward(be, p + offset(h), ws, s, u, fm, 1, u.rows);
    be.add_forward(fo.flat(), std::span<const T>(fo.data, nd), std::span<const T>(fm.data, nd));  // f = y - x̃
  }
  template <class Be, class T>
  static void forward_grouped(Be& be, const T* p, T* ws, const Saved& s, int h, MatrixView<const T> u,
                              MatrixView<T> fo, MatrixView<T> fm, RowGroups g) {
    checked<Ffn>::forward_grouped(be, same_for_groups(p + offset(h)), ws, s, u, fm, g);
    be.add_forward(fo, MatrixView<const T>(fo), MatrixView<const T>(fm), g);  // f = y − x̃
  }

  template <class Be, class T>
  static void backward_residual(Be& be, const T* p, T* g, const T* ws, const Saved& s, int h, MatrixView<const T> u,
                                MatrixView<T> dres, T* scratch) {
    checked<Ffn>::backward(be, p + offset(h), g + offset(h), ws, s, u, dres, MatrixView<const T>(dres), scratch, 1, u.rows);
  }
  // df: dL/df on entry, dL/d(attention output) on exit; du: dL/du (written).
  template <class Be, class T>
  static void backward_block(Be& be, const T* p, T* g, const T* ws, const Saved& s, int h, MatrixView<const T> u,
                             MatrixView<T> df, MatrixView<T> du, T* scratch) {
    const std::size_t nd = std::size_t(u.rows * d);
    be.zero(du.flat());
    checked<Ffn>::backward(be, p + offset(h), g + offset(h), ws, s, u, du, MatrixView<const T>(df), scratch, 1, u.rows);
    be.axpy(df.flat(), T(1), std::span<const T>(du.data, nd));  // df := dL/da
  }
  template <class Be, class T>
  static void backward_grouped(Be& be, const T* p, T* g, const T* ws, const Saved& s, int h, MatrixView<const T> u,
                               MatrixView<T> df, MatrixView<T> du, T* scratch, RowGroups gr) {
    checked<Ffn>::backward_grouped(be, same_for_groups(p + offset(h)), same_for_groups(g + offset(h)), ws, s, u, du,
                                   MatrixView<const T>(df), scratch, gr, Store::overwrite);
    be.axpy(df, T(1), MatrixView<const T>(du), gr);  // df := dL/da
  }
};

template <class Set, Dims D, class R, int k>
struct MoEBlockFfn {
  static_assert(ExpertGatePolicy<typename R::policy>,
                "mom::ExpertRouter<R> (MoDE staged): R must be a Router whose policy gates experts, e.g. "
                "Router<TopK<Softmax>, Temperature<1, 2>>");
  static constexpr int L = Set::n_attention, E = Set::ffn_choices;
  using Step = MoEStepOf<Set, D, k, R, /*skip=*/false>;  // Skip is the MoD skip here, not an expert
  static_assert(!requires { requires Step::Gate::balances; },
                "mom::ExpertRouter<Router<TopK<Sigmoid>>> (MoDE staged): the depth executors do not apply the "
                "selection bias's update between optimizer steps yet; use BiasBalance<0>");
  static constexpr index_t d = D.d_model;
  // After the set's parameters: layer h's gate (h.<base + h>.router.*, as MoEStack: a MoEStack checkpoint
  // maps one to one).
  static constexpr index_t params = L * Step::router_params;
  static constexpr std::size_t tensor_count = Step::router_tensor_count * std::size_t(L);
  static constexpr void specs(TensorSpec* out, index_t layer_base) {
    for (int h = 0; h < L; ++h)
      for (const auto& t : Step::router_tensors(layer_base + h)) *out++ = t;
  }
  static constexpr index_t flops = Step::flops_per_token(), backward_flops = Step::backward_flops_per_token();

  using Saved = typename Step::Plan;
  static constexpr Saved plan(Arena& a, index_t rows) { return Step::plan(a, rows); }
  static constexpr index_t scratch(index_t rows) { return Step::scratch(rows); }
  static constexpr index_t router_offset(int h) { return Set::template params<D> + h * Step::router_params; }
  static constexpr std::array<index_t, E> experts_of(int h) {
    std::array<index_t, E> out{};
    for (int e = 0; e < E; ++e) out[e] = Set::template ffn_offset<D>(h * E + e);
    return out;
  }

  // x' = u + Σ r_e expert_e(u) (MoE eq. (11)); the gate's auxiliary loss into aux.
  template <class Be, class T>
  static void forward_residual(Be& be, const T* p, T* ws, const Saved& s, int h, MatrixView<const T> u,
                               MatrixView<T> out, MatrixView<T> /*fo*/, std::span<T> aux) {
    Step::forward(be, p, router_offset(h), experts_of(h), ws, s, u, out);
    be.axpy(aux, T(1), std::span<const T>(ws + Step::selection(s).loss, 1));
  }
  // The MoE step over the C selected rows: fm = u + MoE(u), f = fm − x̃.
  template <class Be, class T>
  static void forward_block(Be& be, const T* p, T* ws, const Saved& s, int h, MatrixView<const T> u,
                            MatrixView<const T> xg, MatrixView<T> fo, MatrixView<T> fm, std::span<T> aux) {
    const std::size_t nd = std::size_t(u.rows * d);
    forward_residual(be, p, ws, s, h, u, fm, fo, aux);
    be.axpy(fm.flat(), T(-1), std::span<const T>(xg.data, nd));  // f = y − x̃
    be.copy(fo.flat(), std::span<const T>(fm.data, nd));
  }

  template <class Be, class T>
  static void backward_residual(Be& be, const T* p, T* g, const T* ws, const Saved& s, int h, MatrixView<const T> u,
                                MatrixView<T> dres, T* scratch) {
    Step::backward(be, p, g, router_offset(h), experts_of(h), ws, s, u, dres, scratch);
  }
  // The step's out = u + MoE(u) has dL/dout = df: du = df + MoEᵀ df.
  template <class Be, class T>
  static void backward_block(Be& be, const T* p, T* g, const T* ws, const Saved& s, int h, MatrixView<const T> u,
                             MatrixView<T> df, MatrixView<T> du, T* scratch) {
    const std::size_t nd = std::size_t(u.rows * d);
    be.copy(du.flat(), std::span<const T>(df.data, nd));
    backward_residual(be, p, g, ws, s, h, u, du, scratch);
    be.axpy(du.flat(), T(-1), std::span<const T>(df.data, nd));  // du := dL/du = MoEᵀ df
    be.axpy(df.flat(), T(1), std::span<const T>(du.data, nd));   // df := dL/da
  }
};

}  // namespace mom::detail

#pragma once
// Executor of Assembly<Router<Sequential>, ModuleSet<MHA<L>, FFN<L>>, K<1>, H<L>, phi::MoM>:
// the dense stack. With one module per step and routing weight 1, phi_MoM's attention
// assembly (eq. (5)) and FFN assembly (eq. (6)) reduce to the single module, and eq. (4) gives
//   u_h     = x_h + m^A_{c(h)}(x_h)
//   x_{h+1} = u_h + m^F_{c(h)}(u_h)
// where each module applies its own LayerNorm first (pre-norm) and c(h) = h. The same code runs
// any fixed step -> module map c (detail::FixedRouteExecutor): parameter sharing (eq. (10),
// assembly/share.hpp) is this executor with c = c_share.
#include <algorithm>
#include <array>
#include <type_traits>

#include "mom/assembly/assembly.hpp"
#include "mom/assembly/decode_rounds.hpp"
#include "mom/modules/checked.hpp"

namespace mom {

namespace detail {

// c(h) = h: step h runs module pair h.
template <int steps>
constexpr std::array<int, steps> identity_route() {
  std::array<int, steps> c{};
  for (int h = 0; h < steps; ++h) c[std::size_t(h)] = h;
  return c;
}

// Step h (of L = A::h) runs attention module route[h] then FFN module route[h] of the set, each
// with weight 1. The set's parameters are stored once (Set::specs), whatever the route; a module
// used at several steps keeps one Saved block per use, and its backward accumulates (+=) into the
// same gradient block at every use, so a shared module's gradient is the sum over its uses.
// A module with an auxiliary loss (ModuleWithAuxLoss: σ-MoE's entropy regulariser, ...) adds it at every
// use into Plan::aux; the executor then declares has_aux_loss (AuxLossPart), and the model adds Plan::aux
// to its objective.
struct AuxLossPart {
  static constexpr bool has_aux_loss = true;
};
struct NoAuxLossPart {};
// Modules that route inside themselves (ModuleWithRouting: σ-MoE, MoA, SMoE) make the executor report
// their picks (ReportsRouting: routing statistics, expert usage, pruning), one router per such family.
template <int n>
struct ModuleRoutingPart {
  static constexpr int routing_routers = n;
};
struct NoModuleRoutingPart {};

template <class A, Dims D, std::array<int, A::h> route>
struct FixedRouteExecutor
    : std::conditional_t<ModuleWithAuxLoss<typename A::module_set::template attention<D>> ||
                             ModuleWithAuxLoss<typename A::module_set::template ffn<D>>,
                         AuxLossPart, NoAuxLossPart>,
      std::conditional_t<ModuleWithRouting<typename A::module_set::template attention<D>> ||
                             ModuleWithRouting<typename A::module_set::template ffn<D>>,
                         ModuleRoutingPart<int(ModuleWithRouting<typename A::module_set::template attention<D>>) +
                                           int(ModuleWithRouting<typename A::module_set::template ffn<D>>)>,
                         NoModuleRoutingPart> {
  static_assert(std::is_same_v<typename A::phi_type, phi::MoM>,
                "mom::Router<Sequential> and Router<Share<P>> run one module per step with weight 1: they assemble "
                "with phi::MoM (the default), not phi::MoE or phi::LayerSkip");
  using Set = typename A::module_set;
  using Attn = typename Set::template attention<D>;
  using Ffn = typename Set::template ffn<D>;
  static constexpr bool attn_aux = ModuleWithAuxLoss<Attn>, ffn_aux = ModuleWithAuxLoss<Ffn>;
  static constexpr int L = A::h;
  static constexpr index_t d = D.d_model;

  static constexpr std::size_t tensor_count = Set::template tensor_count<D>;
  static constexpr index_t params = Set::template params<D>;
  static constexpr void specs(TensorSpec* out, index_t layer_base) { Set::template specs<D>(out, layer_base); }

  // Parameter offsets of step h's modules inside the set's block.
  static constexpr index_t attention_offset(int h) { return Set::template attention_offset<D>(route[std::size_t(h)]); }
  static constexpr index_t ffn_offset(int h) { return Set::template ffn_offset<D>(route[std::size_t(h)]); }

  // Forward FLOPs per token: every step runs one attention and one FFN module (a shared module
  // costs its FLOPs at every use).
  static constexpr index_t flops_per_token(index_t seq) {
    return L * (Attn::flops_per_token(seq) + Ffn::flops_per_token(seq));
  }
  static constexpr index_t backward_flops_per_token(index_t seq) {
    return L * (Attn::backward_flops_per_token(seq) + Ffn::backward_flops_per_token(seq));
  }

  // Saved for backward: each module's activations and the residual stream after each round
  // (u_h and x_{h+1}); the input x_0 belongs to the caller.
  struct Plan {
    std::array<typename Attn::Saved, L> attn{};
    std::array<typename Ffn::Saved, L> ffn{};
    std::array<index_t, L> u{};
    std::array<index_t, L> x_next{};
    index_t aux = 0;  // the modules' auxiliary losses summed over the steps (when a module has one)
  };
  static constexpr Plan plan(Arena& a, index_t batch, index_t seq) {
    Plan p{};
    if constexpr (attn_aux || ffn_aux) p.aux = a.take(1);
    for (int h = 0; h < L; ++h) {
      p.attn[h] = Attn::plan(a, batch, seq);
      p.u[h] = a.take(batch * seq * d);
      p.ffn[h] = Ffn::plan(a, batch, seq);
      p.x_next[h] = a.take(batch * seq * d);
    }
    return p;
  }
  // Scratch shared with the other parts: a module's output f(x) [n x d] in forward, the
  // modules' backward scratch in backward.
  static constexpr index_t scratch(index_t batch, index_t seq) {
    return std::max({batch * seq * d, guarded_scratch<Attn>(batch, seq), guarded_scratch<Ffn>(batch, seq)});
  }

  // p: this part's parameter block. Returns the residual stream after the last step.
  template <class Be, class T>
  static MatrixView<const T> forward(Be& be, const T* p, T* ws, const Plan& plan, MatrixView<const T> x, T* scratch,
                                     index_t batch, index_t seq, std::span<const token_t> /*tokens*/) {
    const index_t n = batch * seq;
    const MatrixView<T> f{scratch, n, d};
    const std::span<T> aux(ws + plan.aux, 1);
    if constexpr (attn_aux || ffn_aux) be.zero(aux);
    for (int h = 0; h < L; ++h) {
      const MatrixView<T> u{ws + plan.u[h], n, d}, x_next{ws + plan.x_next[h], n, d};
      // eq. (4), u = x + f(x): the module adds the residual in its output product where it can (AddsResidualOn), else
      // f(x) goes to the scratch and an add follows (checked<M>::forward_residual).
      checked<Attn>::forward_residual(be, p + attention_offset(h), ws, plan.attn[h], x, u, f, batch, seq);
      if constexpr (attn_aux) be.axpy(aux, T(1), std::span<const T>(ws + plan.attn[h].aux, 1));
      checked<Ffn>::forward_residual(be, p + ffn_offset(h), ws, plan.ffn[h], MatrixView<const T>(u), x_next, f, batch,
                                     seq);  // eq. (4)
      if constexpr (ffn_aux) be.axpy(aux, T(1), std::span<const T>(ws + plan.ffn[h].aux, 1));
      x = x_next;
    }
    return x;
  }

  // ---- routing read-back (models/routing_stats.hpp; ReportsRouting when a module routes) ------------
  // Router 0 is the attention family's when it routes, then the FFN family's; step h's picks are those
  // of the module run at step h (a shared module reports each use). The modules always run their k
  // picks, so the realised FLOPs are the cost model's.
  static constexpr bool attn_routes = ModuleWithRouting<Attn>, ffn_routes = ModuleWithRouting<Ffn>;
  static constexpr bool ffn_router(int router) { return !attn_routes || router > 0; }
  static constexpr RoutingInfo routing_info(int router)
    requires(attn_routes || ffn_routes)
  {
    if constexpr (attn_routes && ffn_routes)
      return ffn_router(router) ? RoutingInfo{"ffn", Ffn::routed.classes, L, Ffn::routed.k}
                                : RoutingInfo{"attn", Attn::routed.classes, L, Attn::routed.k};
    else if constexpr (attn_routes) return {"attn", Attn::routed.classes, L, Attn::routed.k};
    else return {"ffn", Ffn::routed.classes, L, Ffn::routed.k};
  }
  template <class Be, class T>
    requires(attn_routes || ffn_routes)
  static void read_picks(Be& be, const T* ws, const Plan& plan, int h, int router, index_t n, std::span<token_t> out) {
    if constexpr (ffn_routes)
      if (ffn_router(router)) return Ffn::read_picks(be, ws, plan.ffn[std::size_t(h)], n, out);
    if constexpr (attn_routes) Attn::read_picks(be, ws, plan.attn[std::size_t(h)], n, out);
  }
  template <bool backward = false, class Picks>
    requires(attn_routes || ffn_routes)
  static index_t routed_flops(index_t batch, index_t seq, Picks&&) {
    return batch * seq * (backward ? backward_flops_per_token(seq) : flops_per_token(seq));
  }

  // ---- incremental decoding (infer/decoder.hpp; AssemblyDecoderOn) --------------------------------
  // One new token per active sequence. Step h keeps its own key/value cache (a module used at several
  // steps has one cache per use, as its forward sees a different input at each); the step workspace
  // is shared by the steps.
  using decode_sequence_mixer = Attn;  // named by infer::Decoder when it cannot decode
  template <class Be>
  static constexpr bool decodes_on = DecodingSequenceMixerOn<Attn, Be> && DenseTokenMixerOn<Ffn, Be>;
  struct DecodePlan {
    DecodeRounds<L, d> rounds{};  // per-step caches and the rows' residual stream
    typename Attn::DecodeSaved attn{};
    typename Ffn::Saved ffn{};
  };
  static constexpr DecodePlan plan_decode(Arena& a, index_t slots, index_t max_len, index_t rows) {
    DecodePlan p{};
    p.rounds = DecodeRounds<L, d>::take(a, slots, max_len, rows);
    p.attn = Attn::plan_decode(a, rows);
    p.ffn = Ffn::plan(a, rows, 1);
    return p;
  }
  // x [rows × d]: the new tokens' residual stream; returns it after the last step (eq. (4) per token).
  template <class Be, class T>
  static MatrixView<const T> decode(Be& be, const T* p, T* ws, const DecodePlan& plan, MatrixView<const T> x,
                                    std::span<const index_t> slot, std::span<const index_t> pos, index_t slots,
                                    index_t max_len, std::span<const token_t> /*tokens*/) {
    return plan.rounds.template run<Attn>(
        be, p, ws, plan.attn, [](int h) { return attention_offset(h); }, x, slot, pos, slots, max_len,
        [&](int h, MatrixView<const T> u, MatrixView<T> x_next, MatrixView<T> f) {
          checked<Ffn>::forward_residual(be, p + ffn_offset(h), ws, plan.ffn, u, x_next, f, u.rows, 1);  // eq. (4)
        });
  }

  // dres holds dL/dx_H on entry and dL/dx_0 on exit. The residual path is the identity, so
  // each module's backward reads dres as dL/df and accumulates its input gradient into
  // dres itself (a module reads df only in its first op, before it writes dx).
  template <class Be, class T>
  static void backward(Be& be, const T* p, T* g, const T* ws, const Plan& plan, MatrixView<const T> x0,
                       MatrixView<T> dres, T* scratch, index_t batch, index_t seq) {
    const index_t n = batch * seq;
    for (int h = L - 1; h >= 0; --h) {
      const MatrixView<const T> u{ws + plan.u[h], n, d};
      const MatrixView<const T> x = h == 0 ? x0 : MatrixView<const T>{ws + plan.x_next[h - 1], n, d};
      checked<Ffn>::backward(be, p + ffn_offset(h), g + ffn_offset(h), ws, plan.ffn[h], u,
                    dres, MatrixView<const T>(dres), scratch, batch, seq);
      checked<Attn>::backward(be, p + attention_offset(h), g + attention_offset(h), ws,
                     plan.attn[h], x, dres, MatrixView<const T>(dres), scratch, batch, seq);
    }
  }
};

}  // namespace detail

// The dense stack: c(h) = h.
template <class A, Dims D>
struct Executor<Sequential, A, D> : detail::FixedRouteExecutor<A, D, detail::identity_route<A::h>()> {};

}  // namespace mom

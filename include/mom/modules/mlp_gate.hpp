#pragma once
// ModuleFormer's router (Shen et al., arXiv 2306.04640, §3.1), shared by its two module kinds (MoA,
// modules/moa.hpp; the SMoE feed-forward, modules/smoe.hpp):
//   h(x)   = [A; A'] · ReLU(B x)                                    eq. (2), with eq. (9)'s A' after insertion
//   g(m|x) = Top-k(softmax(h(x) + prune))                           eq. (1)
// B [D_rtr × d], A [N × D_rtr], A' [N_new × D_rtr] (the inserted modules' embeddings, §4.3). Top-k keeps the
// k largest probabilities and zeroes the rest: the gates are NOT renormalised (eq. (1) as written; the
// SMoE output is Σ_m g(m|x) f_m(x)). `prune` [1 × (N + N_new)] is a runtime module mask added to the
// logits: 0 for a kept module, −10⁴ for a pruned one (its probability underflows to exactly 0, §5.3
// pruning as a mask, models/module_surgery.hpp); it is a buffer (TensorSpec::trainable = false): never
// trained, its gradient is left 0.
//
// The router's loss over the batch's n tokens (the model's auxiliary loss, ModuleWithAuxLoss):
//   MutualInformation<γ>   γ·(Σ_m p(m) log p(m) − (1/n) Σ_x Σ_m g(m|x) log g(m|x))   eq. (7), pre-training
//   LoadConcentration<γ>   γ·H(m) = −γ Σ_m p(m) log p(m)                              eq. (8), fine-tuning
//   NoRouterLoss
// each optionally with the router z-loss of ST-MoE (arXiv 2202.08906, eq. (5)), z · mean over the tokens of
// (log Σ_m exp h(x)_m)² (MutualInformation<γ, Z>, LoadConcentration<γ, Z>, NoRouterLoss<Z>; Z = 0: off),
// with g(m|x) the full softmax (before top-k) and p(m) its mean over the batch's tokens; plus, when
// RoutReg λ > 0, the routing regularisation λ·‖A'‖² of eq. (10) (partially trainable insertion).
#include <array>
#include <ratio>
#include <span>
#include <string_view>

#include "mom/routing/select.hpp"
#include "mom/modules/module.hpp"

namespace mom {

// The router's balancing loss (coef, cond_coef of the selection_entropy op, backend/cpu/routing.hpp).
template <class Gamma = std::ratio<1, 100>, class Z = std::ratio<0>>
struct MutualInformation {
  static_assert(Gamma::num >= 0 && Z::num >= 0, "mom::MutualInformation<gamma, z>: gamma and z must be >= 0");
  static constexpr double coef = double(Gamma::num) / double(Gamma::den), cond_coef = -coef;
  static constexpr double z_coef = double(Z::num) / double(Z::den);
};
template <class Gamma = std::ratio<1, 100>, class Z = std::ratio<0>>
struct LoadConcentration {
  static_assert(Gamma::num >= 0 && Z::num >= 0, "mom::LoadConcentration<gamma, z>: gamma and z must be >= 0");
  static constexpr double coef = -double(Gamma::num) / double(Gamma::den), cond_coef = 0;
  static constexpr double z_coef = double(Z::num) / double(Z::den);
};
template <class Z = std::ratio<0>>
struct NoRouterLoss {
  static_assert(Z::num >= 0, "mom::NoRouterLoss<z>: z must be >= 0");
  static constexpr double coef = 0, cond_coef = 0, z_coef = double(Z::num) / double(Z::den);
};
template <class L>
concept RouterLoss = requires {
  { L::coef } -> std::convertible_to<double>;
  { L::cond_coef } -> std::convertible_to<double>;
  { L::z_coef } -> std::convertible_to<double>;
};

// The value a pruned module's logit gets added (exp(−10⁴) is 0 in float and double).
inline constexpr double pruned_logit = -1e4;

namespace detail {

// The gate of C = N + N_new classes, k picks, width D_rtr, over d-wide inputs; its tensors are named
// <prefix>.router.{w_b, w_a, w_a_new, prune}. Offsets are relative to the gate's first parameter.
template <index_t d, int N, int NNew, int K, int Drtr, class Loss, class RoutReg>
struct MLPGate {
  static_assert(RouterLoss<Loss>, "mom: ModuleFormer's router loss must be MutualInformation<g>, LoadConcentration<g> or NoRouterLoss");
  static constexpr int C = N + NNew, n_old = N, n_new = NNew, d_rtr = Drtr;
  static constexpr double reg = double(RoutReg::num) / double(RoutReg::den);
  static constexpr index_t o_b = 0, o_a = Drtr * d, o_prune = o_a + C * Drtr, params = o_prune + C;
  static constexpr std::size_t tensor_count = NNew > 0 ? 4 : 3;
  template <std::size_t n>
  static constexpr std::array<TensorSpec, tensor_count> tensors(const std::array<std::string_view, n>& names,
                                                                index_t layer) {
    if constexpr (NNew > 0)
      return {{{names[0], layer, Drtr, d, Init::Normal},
               {names[1], layer, N, Drtr, Init::Normal},
               {names[2], layer, NNew, Drtr, Init::Normal},
               {names[3], layer, 1, C, Init::Zero, -1, false}}};
    else
      return {{{names[0], layer, Drtr, d, Init::Normal},
               {names[1], layer, N, Drtr, Init::Normal},
               {names[3], layer, 1, C, Init::Zero, -1, false}}};
  }
  // B x, the ReLU, the logits; softmax and top-k (entropy terms need no more).
  static constexpr index_t flops_per_token = 2 * d * Drtr + 2 * Drtr * C;

  struct Saved {
    index_t hid = 0, act = 0;  // B x and ReLU(B x) [n × D_rtr]
    dispatch::Selection sel;   // logits → softmax in sel.probs [n × C], picks, gates, groups, the loss
    index_t dreg = 0;          // d(router loss)/d(logits) [n × C]
    index_t sq = 0;            // ‖A'‖² (routing regularisation)
  };
  static constexpr Saved plan(Arena& a, index_t n) {
    Saved s{};
    s.hid = a.take(n * Drtr);
    s.act = a.take(n * Drtr);
    s.sel = dispatch::plan_selection(a, n, K, C, Loss::z_coef > 0);
    s.dreg = a.take(n * C);
    s.sq = a.take(1);
    return s;
  }
  struct Scratch {
    index_t dws, dlogits, dact, dhid, total;
  };
  static constexpr Scratch scratch_plan(index_t n) {
    Arena a;
    Scratch s{};
    s.dws = a.take(n * K);
    s.dlogits = a.take(n * C);
    s.dact = a.take(n * Drtr);
    s.dhid = a.take(n * Drtr);
    s.total = a.used;
    return s;
  }

  // The selection of the n rows of x (the module's LN(x)): gates, picks, their groups, the loss in sel.loss.
  template <class Be, class T>
  static void forward(Be& be, const T* p, T* ws, const Saved& s, MatrixView<const T> x) {
    using detail::mat, detail::vec;
    const index_t n = x.rows;
    const auto hid = mat(ws, s.hid, n, Drtr), act = mat(ws, s.act, n, Drtr), logits = mat(ws, s.sel.probs, n, C);
    be.linear_forward(hid, x, mat(p, o_b, Drtr, d), std::span<const T>{});
    be.relu_forward(act.flat(), std::span<const T>(hid.flat()));
    be.linear_forward(logits, MatrixView<const T>(act), mat(p, o_a, C, Drtr), vec(p, o_prune, C));  // eq. (2)
    const std::span<T> loss = vec(ws, s.sel.loss, 1);
    if constexpr (Loss::coef != 0 || Loss::cond_coef != 0)
      be.selection_entropy_forward(loss, mat(ws, s.dreg, n, C), MatrixView<const T>(logits), 1, n, T(Loss::coef),
                                   T(Loss::cond_coef));  // eqs. (7) / (8) over the batch
    else
      be.zero(loss);
    if constexpr (Loss::z_coef > 0) {  // + the z-loss, before the softmax replaces the logits
      be.router_z_loss_forward(vec(ws, s.sel.zloss, 1), mat(ws, s.sel.zgrad, n, C), MatrixView<const T>(logits), T(1),
                               T(Loss::z_coef));
      be.axpy(loss, T(1), vec(static_cast<const T*>(ws), s.sel.zloss, 1));
    }
    if constexpr (NNew > 0 && reg > 0) {  // + λ‖A'‖², eq. (10): A' as one row times itself
      const MatrixView<const T> a_new{p + o_a + N * Drtr, 1, NNew * Drtr};
      be.linear_forward(mat(ws, s.sq, 1, 1), a_new, a_new, std::span<const T>{});
      be.axpy(loss, T(reg), vec(static_cast<const T*>(ws), s.sq, 1));
    }
    be.route_topk_forward(mat(ws, s.sel.weights, n, K), MatrixView<token_t>{dispatch::toks(ws, s.sel.picks), n, K},
                          logits, MatrixView<const T>(logits), T(1), false);  // eq. (1), in place
    dispatch::group_picks(be, ws, s.sel, n, K, C);
  }

  // dwp: dL/d(gate) in group order [n·K]. Accumulates dL/dx into dx and the gate's gradients into g.
  template <class Be, class T>
  static void backward(Be& be, const T* p, T* g, const T* ws, const Saved& s, MatrixView<const T> x, MatrixView<T> dx,
                       std::span<const T> dwp, T* sc) {
    using detail::mat, detail::vec;
    const index_t n = x.rows;
    const Scratch c = scratch_plan(n);
    const auto dlogits = mat(sc, c.dlogits, n, C), dact = mat(sc, c.dact, n, Drtr), dhid = mat(sc, c.dhid, n, Drtr);
    dispatch::slot_grads(be, ws, s.sel, n, K, dwp, vec(sc, c.dws, n * K));
    be.zero(dlogits);
    be.route_topk_backward(dlogits, mat(static_cast<const T*>(sc), c.dws, n, K), mat(ws, s.sel.weights, n, K),
                           mat(ws, s.sel.probs, n, C), MatrixView<const token_t>{dispatch::toks(ws, s.sel.picks), n, K},
                           T(1), false, std::span<const T>{});
    if constexpr (Loss::coef != 0 || Loss::cond_coef != 0) be.axpy(dlogits.flat(), T(1), vec(ws, s.dreg, n * C));
    if constexpr (Loss::z_coef > 0) be.axpy(dlogits.flat(), T(1), vec(ws, s.sel.zgrad, n * C));
    be.zero(dact);
    be.linear_backward(dact, mat(g, o_a, C, Drtr), std::span<T>{}, MatrixView<const T>(dlogits), mat(ws, s.act, n, Drtr),
                       mat(p, o_a, C, Drtr));
    be.zero(dhid);
    be.relu_backward(dhid.flat(), vec(ws, s.hid, n * Drtr), std::span<const T>(dact.flat()));
    be.linear_backward(dx, mat(g, o_b, Drtr, d), std::span<T>{}, MatrixView<const T>(dhid), x, mat(p, o_b, Drtr, d));
    if constexpr (NNew > 0 && reg > 0)
      be.axpy(vec(g, o_a + N * Drtr, NNew * Drtr), T(2 * reg), vec(p, o_a + N * Drtr, NNew * Drtr));
  }

  template <class Be, class T>
  static void read_picks(Be& be, const T* ws, const Saved& s, index_t n, std::span<token_t> out) {
    be.to_host(out, std::span<const token_t>(dispatch::toks(ws, s.sel.picks), std::size_t(n * K)));
  }
};

}  // namespace detail
}  // namespace mom

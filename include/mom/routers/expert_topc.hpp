#pragma once
// Router<TopC<Softmax>, CapacityFactor<p, q>>: expert-choice routing (Zhou et al. 2022, arXiv 2202.09368), an
// ExpertGate (routers/gate.hpp) of phi::MoE's steps. Where TopK lets every token pick its k experts, here every
// expert picks its c tokens among the step's n rows (the batch's tokens):
//   z = LN_r(u)                        the router's own pre-norm (as TopK<Softmax>'s)
//   S = softmax(Z W_gᵀ)  [n × E]        token-to-expert scores, eq. (1)
//   G, I = TopK(Sᵀ, c),  c = ⌊n · cf / E⌋   each expert's top-c tokens and their scores, eq. (1)
//   x_out = x + Σ_e G[e, i] · FFN_e(x_i) over the (e, i) pairs                                eq. (2)
// so a token gets 0 .. E experts, every expert exactly c tokens (perfect load balance, no auxiliary loss), cf
// experts per token on average. K<E>: a row has one slot per expert, the slots of the experts that did not take
// it filled with the no-op class E at weight 0 (the ExpertGate convention).
//
// Not causal: which tokens an expert takes depends on every token of the batch, later ones included, so a
// decoder cannot route one new token as training did; infer::Decoder refuses it at compile time, and mom-sample
// recomputes the window per token (the experts then choose among the window's tokens).
//
// Options: CapacityFactor<p, q> (cf = p / q, default 2: the paper's EC-CF2); ZLoss<p, q> (the router z-loss of
// ST-MoE, arXiv 2202.08906 eq. (5), on the router's logits, as the other softmax routers have it; default off).
#include <array>
#include <span>
#include <string>
#include <string_view>

#include "mom/core/meta.hpp"
#include "mom/routing/select.hpp"
#include "mom/modules/module.hpp"
#include "mom/routers/gate.hpp"
#include "mom/routers/options.hpp"
#include "mom/routers/router.hpp"
#include "mom/routers/router_head.hpp"
#include "mom/routers/topk.hpp"

namespace mom {

// Expert-choice routing: every expert takes its top-C tokens (TopC<Softmax>, routers/expert_topc.hpp).
template <class Gate>
struct TopC;

template <long long num, long long den = 1>
struct CapacityFactor {
  static constexpr long long numerator = num, denominator = den;
  static constexpr double value = den != 0 ? double(num) / double(den) : 0.0;
};

template <class OptionList>
struct TopCConfig;
template <class... Os>
struct TopCConfig<TypeList<Os...>> {
  static constexpr bool options_known = mom::options_known<TypeList<CapacityFactor<2>, ZLoss<0>>, Os...>;
  static constexpr bool options_unique = mom::options_unique<Os...>;
  using factor_t = option_t<CapacityFactor<2>, Os...>;
  using z_loss_t = option_t<ZLoss<0>, Os...>;
  static constexpr double factor = factor_t::value;
  static constexpr double z_loss = z_loss_t::denominator != 0 ? double(z_loss_t::numerator) / double(z_loss_t::denominator) : 0.0;
};

template <Dims D, int E, int Kp, bool Skip, class Options>
struct TopCGate;

template <>
struct TopC<Softmax> {
  static constexpr bool is_router_policy = true;
  static constexpr bool gates_experts = true;  // an ExpertGate per step (routers/gate.hpp)
  static constexpr std::string_view name = "TopC<Softmax>";
  template <Dims D, int E, int Kp, bool Skip, class Options>
  using gate = TopCGate<D, E, Kp, Skip, Options>;

  template <class Set, int k, int h>
  struct Drives {
    static_assert(Set::n_attention >= 1 && Set::ffn_choices >= 1,
                  "mom::Router<TopC<Softmax>> routes each step's FFN experts after its attention module: the "
                  "ModuleSet needs MHA<L> and Experts<FFN, E, PerStep> (or FFN<E>)");
    static constexpr bool ok = Set::n_attention >= 1 && Set::ffn_choices >= 1;
  };

  template <class Options>
  struct VerifyOptions {
    using Cfg = TopCConfig<Options>;
    static_assert(Cfg::options_known,
                  "mom::Router<TopC<Softmax>, Options...>: unknown option; known: CapacityFactor<p, q>, ZLoss<p, q>");
    static_assert(Cfg::options_unique, "mom::Router<TopC<Softmax>, Options...>: each option may be given at most once");
    static_assert(!Cfg::options_known || (Cfg::factor_t::numerator > 0 && Cfg::factor_t::denominator > 0),
                  "mom::Router<TopC<Softmax>>: CapacityFactor<p, q> must be > 0");
    static_assert(!Cfg::options_known || (Cfg::z_loss_t::numerator >= 0 && Cfg::z_loss_t::denominator > 0),
                  "mom::Router<TopC<Softmax>>: ZLoss<p, q> must be >= 0");
    static constexpr bool ok = Cfg::options_known && Cfg::options_unique;
  };

  template <class Options>
  static std::string describe_options() {
    using F = typename TopCConfig<Options>::factor_t;
    using Z = typename TopCConfig<Options>::z_loss_t;
    std::string s;
    if (F::numerator != 2 * F::denominator)
      s += ", CapacityFactor<" + std::to_string(F::numerator) +
           (F::denominator == 1 ? "" : ", " + std::to_string(F::denominator)) + ">";
    if (Z::numerator != 0)
      s += ", ZLoss<" + std::to_string(Z::numerator) + (Z::denominator == 1 ? "" : ", " + std::to_string(Z::denominator)) + ">";
    return s;
  }
};

// The gate of one step (an ExpertGate): parameters ln.w, ln.b, w [E × d], named h.<layer>.router.*.
template <Dims D, int E, int Kp, bool Skip, class Options>
struct TopCGate {
  static_assert(sizeof(typename TopC<Softmax>::template VerifyOptions<Options>) > 0);  // runs the option checks
  using Cfg = TopCConfig<Options>;
  static_assert(!Skip, "mom::Router<TopC<Softmax>>: no SKIP class (a token no expert takes already skips the FFN); "
                       "drop Skip from the ModuleSet");
  static_assert(Kp == E, "mom::Router<TopC<Softmax>>: K<k> must equal the experts per step E (a token may be taken by "
                         "every expert: one slot per expert)");
  static constexpr int classes = E + 1;  // the experts, then the no-op class of the slots no expert filled
  static constexpr bool causal = false;  // infer::Decoder refuses it (routes_causally)
  static constexpr index_t d = D.d_model;
  using Head = detail::NormedRouterHead<d, E>;  // LN_r and W_g (routers/router_head.hpp)
  static constexpr index_t params = Head::params;
  // Rows an average token is run through (MoEStep's cost model): at most cf, E·c / n with c = ⌊n·cf/E⌋.
  static constexpr int picks_per_token = int(Cfg::factor_t::numerator / Cfg::factor_t::denominator) +
                                         (Cfg::factor_t::numerator % Cfg::factor_t::denominator != 0 ? 1 : 0);
  static constexpr std::array<TensorSpec, 3> tensors(index_t layer) { return Head::tensors(layer); }
  static constexpr index_t flops_per_token() { return Head::flops_per_token(); }
  static constexpr index_t backward_flops_per_token() { return 2 * flops_per_token(); }
  // c = ⌊n · cf / E⌋ tokens per expert (at most n).
  static constexpr index_t capacity(index_t rows) {
    const index_t c = rows * Cfg::factor_t::numerator / (Cfg::factor_t::denominator * E);
    return c < rows ? c : rows;
  }

  struct Plan {
    typename Head::Saved head{};
    dispatch::Selection sel{};  // sel.probs [rows × E]: S
  };
  static constexpr Plan plan(Arena& a, index_t rows) {
    Plan p{};
    p.head = Head::plan(a, rows);
    p.sel = dispatch::plan_selection(a, rows, Kp, classes, Cfg::z_loss > 0);
    return p;
  }
  static constexpr const dispatch::Selection& selection(const Plan& p) { return p.sel; }
  static constexpr index_t scratch(index_t rows) { return rows * Kp + 2 * rows * E + Head::scratch(rows); }

  template <class Be, class T>
  static void forward(Be& be, const T* p, T* ws, const Plan& s, MatrixView<const T> in, std::span<const token_t>) {
    const index_t rows = in.rows;
    const MatrixView<T> probs{ws + s.sel.probs, rows, E};
    Head::forward(be, p, ws, s.head, in, probs);
    if constexpr (Cfg::z_loss > 0)  // on the logits, before the softmax overwrites them; its gradient kept for backward
      be.router_z_loss_forward(std::span<T>{ws + s.sel.zloss, 1}, MatrixView<T>{ws + s.sel.zgrad, rows, E},
                               MatrixView<const T>(probs), T(1), T(Cfg::z_loss));
    be.softmax_rows(probs, MatrixView<const T>(probs));  // S, eq. (1)
    be.expert_choice_forward(MatrixView<T>{ws + s.sel.weights, rows, Kp},
                             MatrixView<token_t>{dispatch::toks(ws, s.sel.picks), rows, Kp}, MatrixView<const T>(probs),
                             capacity(rows));
    dispatch::group_picks(be, ws, s.sel, rows, Kp, classes);
    be.zero(std::span<T>{ws + s.sel.loss, 1});  // balanced by construction: no balance loss
    if constexpr (Cfg::z_loss > 0) be.axpy(std::span<T>{ws + s.sel.loss, 1}, T(1), std::span<const T>{ws + s.sel.zloss, 1});
  }

  template <class Be, class T>
  static void backward(Be& be, const T* p, T* g, const T* ws, const Plan& s, MatrixView<const T> in, MatrixView<T> din,
                       std::span<const T> dwp, T* scratch) {
    const index_t rows = in.rows;
    const std::span<T> dws{scratch, std::size_t(rows * Kp)};
    const MatrixView<T> dprobs{scratch + rows * Kp, rows, E}, dlogits{scratch + rows * Kp + rows * E, rows, E};
    dispatch::slot_grads(be, ws, s.sel, rows, Kp, dwp, dws);
    be.zero(dprobs.flat());
    be.expert_choice_backward(dprobs, MatrixView<const T>{dws.data(), rows, Kp},
                              MatrixView<const token_t>{dispatch::toks(ws, s.sel.picks), rows, Kp});
    be.zero(dlogits.flat());
    be.softmax_rows_backward(dlogits, MatrixView<const T>(dprobs), MatrixView<const T>{ws + s.sel.probs, rows, E});
    if constexpr (Cfg::z_loss > 0)
      be.axpy(dlogits.flat(), T(1), std::span<const T>{ws + s.sel.zgrad, std::size_t(rows * E)});
    Head::backward(be, p, g, ws, s.head, in, din, MatrixView<const T>(dlogits), scratch + rows * Kp + 2 * rows * E);
  }
};

}  // namespace mom

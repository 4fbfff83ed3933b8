#pragma once
// The TopK family of router policies, the token-choice routers of phi::MoE (each token picks its top-K experts):
//   TopK<Softmax>   softmax over the classes, top-K, renormalised (below; its gate SoftmaxTopKGate is here too)
//   TopK<Sigmoid>   DeepSeekMoE's sigmoid affinities with a selection-only bias and shared experts (the policy at
//                   the end of this file; its gate AffinityTopKGate and options: routers/affinity.hpp)
// (Expert choice, where each expert picks its tokens, is TopC<Softmax>: routers/expert_topc.hpp.)
//
// Router<TopK<Softmax>, Options...>: the Mixture-of-Experts router (Shazeer et al. 2017; Mixtral),
// one per assembly step h, stateless:
//   z_h = LN_r(u_h)                        the router's own pre-norm of the residual stream
//   r_h = softmax(W_r z_h / tau),  W_r ∈ R^{C × d}, C = E experts (+ 1 for SKIP, last)
//   top-K of r_h, the K picked weights renormalised to sum 1 (Mixtral)
// Why the router has its own LayerNorm: Mixtral's router reads the post-attention normalised
// hidden state, the same LN output its experts read; here every expert owns its LayerNorm
// (modules/ffn.hpp, as in MoM), so no shared normalised state exists and the router normalises
// for itself (2d parameters per step) rather than reading the un-normalised residual stream
// (whose scale grows with depth). docs/special_cases.md.
// A Switch-style load-balancing loss (coefficient 1/100) over the C classes is added to the model
// loss (Fedus et al. 2022, eq. (4); backend balance_loss_forward).
//
// Options (any order, each at most once; routers/options.hpp):
//   Temperature<p, q>   tau = p / q (default 1, as Mixtral)
//   BalanceCoef<p, q>   coefficient of the balance loss (default 1/100; BalanceCoef<0> off)
//   ZLoss<p, q>         coefficient of the router z-loss (ST-MoE, arXiv 2202.08906, eq. (5)): p / q ·
//                       mean over the rows of (log Σ exp(logits / tau))², added to the model loss (default 0: off)
//   Renormalise<b>      renormalise the K picked weights (default true, Mixtral); false: the raw
//                       softmax probabilities (Switch / GShard top-1 style)
#include <cstddef>
#include <string>
#include <string_view>

#include "mom/core/meta.hpp"
#include "mom/modules/module.hpp"
#include "mom/routers/affinity.hpp"
#include "mom/routers/gate.hpp"
#include "mom/routers/options.hpp"
#include "mom/routers/router.hpp"
#include "mom/routers/router_head.hpp"

namespace mom {

// The gate of a top-K router: softmax over the classes (TopK<Softmax>; also TopC<Softmax>'s scores).
struct Softmax {};
// The gate of a top-K router: sigmoid affinities (DeepSeekMoE, TopK<Sigmoid>).
struct Sigmoid {};

template <class OptionList>
struct TopKConfig;
template <class... Os>
struct TopKConfig<TypeList<Os...>> {
  static constexpr bool options_known =
      mom::options_known<TypeList<Temperature<1>, BalanceCoef<1>, Renormalise<true>, ZLoss<0>>, Os...>;
  static constexpr bool options_unique = mom::options_unique<Os...>;
  using temperature_t = option_t<Temperature<1>, Os...>;
  using balance_t = option_t<BalanceCoef<1, 100>, Os...>;
  using renormalise_t = option_t<Renormalise<true>, Os...>;
  using z_loss_t = option_t<ZLoss<0>, Os...>;
  static constexpr double temperature = temperature_t::value;
  static constexpr double balance_coef = balance_t::value;
  static constexpr bool renormalise = renormalise_t::value;
  static constexpr double z_loss = z_loss_t::value;
  static constexpr bool valid = options_known && options_unique && temperature_t::numerator > 0 &&
                                temperature_t::denominator > 0 && balance_t::numerator >= 0 &&
                                balance_t::denominator > 0 && z_loss_t::numerator >= 0 && z_loss_t::denominator > 0;
};

template <Dims D, int E, int Kp, bool Skip, class Options>
struct SoftmaxTopKGate;

template <class Gate>
struct TopK {
  static_assert(std::is_same_v<Gate, Softmax>,
                "mom::TopK<Gate>: the gate must be Softmax (TopK<Softmax>) or Sigmoid (TopK<Sigmoid>, DeepSeekMoE)");
  static constexpr bool is_router_policy = true;
  static constexpr bool gates_experts = true;  // an ExpertGate per step (routers/gate.hpp)
  static constexpr std::string_view name = "TopK<Softmax>";
  template <Dims D, int E, int Kp, bool Skip, class Options>
  using gate = SoftmaxTopKGate<D, E, Kp, Skip, Options>;

  template <class Set, int k, int h>
  struct Drives {
    static_assert(Set::n_attention >= 1 && Set::ffn_choices >= 1,
                  "mom::Router<TopK<Softmax>> routes each step's FFN experts after its attention module: the "
                  "ModuleSet needs MHA<L> and FFN<E> or Experts<FFN, E, PerStep>");
    static constexpr bool ok = Set::n_attention >= 1 && Set::ffn_choices >= 1;
  };

  template <class Options>
  struct VerifyOptions {
    using Cfg = TopKConfig<Options>;
    static_assert(Cfg::options_known,
                  "mom::Router<TopK<Softmax>, Options...>: unknown option; known: Temperature<p, q>, BalanceCoef<p, q>, "
                  "Renormalise<b>, ZLoss<p, q>");
    static_assert(Cfg::options_unique, "mom::Router<TopK<Softmax>, Options...>: each option may be given at most once");
    static_assert(!Cfg::options_known ||
                      (Cfg::temperature_t::numerator > 0 && Cfg::temperature_t::denominator > 0),
                  "mom::Router<TopK<Softmax>>: Temperature<p, q> must be > 0");
    static_assert(!Cfg::options_known || (Cfg::balance_t::numerator >= 0 && Cfg::balance_t::denominator > 0),
                  "mom::Router<TopK<Softmax>>: BalanceCoef<p, q> must be >= 0");
    static_assert(!Cfg::options_known || (Cfg::z_loss_t::numerator >= 0 && Cfg::z_loss_t::denominator > 0),
                  "mom::Router<TopK<Softmax>>: ZLoss<p, q> must be >= 0");
    static constexpr bool ok = Cfg::valid;
  };
};

// The gate of one step (an ExpertGate, routers/gate.hpp): z = LN_r(in), logits = W z (W [C × d], no
// bias), softmax(logits / tau), top-K, the K picked weights renormalised (option), the Switch balance
// loss. Parameters: ln.w, ln.b, w (h.<layer>.router.*).
template <Dims D, int E, int Kp, bool Skip, class Options>
struct SoftmaxTopKGate {
  static_assert(sizeof(typename TopK<Softmax>::template VerifyOptions<Options>) > 0);  // runs the option checks
  using Cfg = TopKConfig<Options>;
  static constexpr int classes = E + (Skip ? 1 : 0);  // SKIP last (class E)
  static constexpr index_t d = D.d_model, C = classes;
  using Head = detail::NormedRouterHead<d, C>;  // LN_r and W (routers/router_head.hpp)
  static constexpr index_t params = Head::params;
  static constexpr std::array<TensorSpec, 3> tensors(index_t layer) { return Head::tensors(layer); }
  static constexpr index_t flops_per_token() { return Head::flops_per_token(); }
  static constexpr index_t backward_flops_per_token() { return 2 * flops_per_token(); }

  struct Plan {
    typename Head::Saved head{};
    dispatch::Selection sel{};
  };
  static constexpr Plan plan(Arena& a, index_t rows) {
    Plan p{};
    p.head = Head::plan(a, rows);
    p.sel = dispatch::plan_selection(a, rows, Kp, C, Cfg::z_loss > 0);
    return p;
  }
  static constexpr const dispatch::Selection& selection(const Plan& p) { return p.sel; }
  struct Scratch {
    index_t dws, dlogits, head, total;
  };
  static constexpr Scratch scratch_plan(index_t rows) {
    Arena a;
    Scratch s{};
    s.dws = a.take(rows * Kp);
    s.dlogits = a.take(rows * C);
    s.head = a.take(Head::scratch(rows));
    s.total = a.used;
    return s;
  }
  static constexpr index_t scratch(index_t rows) { return scratch_plan(rows).total; }

  template <class Be, class T>
  static void forward(Be& be, const T* p, T* ws, const Plan& s, MatrixView<const T> in, std::span<const token_t>) {
    const index_t rows = in.rows;
    Head::forward(be, p, ws, s.head, in, MatrixView<T>{ws + s.sel.probs, rows, C});  // the logits
    dispatch::select_forward(be, ws, s.sel, rows, Kp, C, T(1.0 / Cfg::temperature), Cfg::renormalise,
                             T(Cfg::balance_coef), T(Cfg::z_loss));
  }

  // dL/dlogits through top-K / softmax (+ the balance loss), then W and LN_r.
  template <class Be, class T>
  static void backward(Be& be, const T* p, T* g, const T* ws, const Plan& s, MatrixView<const T> in, MatrixView<T> din,
                       std::span<const T> dwp, T* scratch) {
    const index_t rows = in.rows;
    const Scratch sc = scratch_plan(rows);
    const MatrixView<T> dlogits{scratch + sc.dlogits, rows, C};
    dispatch::select_backward(be, ws, s.sel, rows, Kp, C, T(1.0 / Cfg::temperature), Cfg::renormalise, dwp,
                              std::span<T>(scratch + sc.dws, std::size_t(rows * Kp)), dlogits, T(Cfg::z_loss));
    Head::backward(be, p, g, ws, s.head, in, din, MatrixView<const T>(dlogits), scratch + sc.head);
  }
};

// Router<TopK<Sigmoid>, Options...>: DeepSeekMoE's router (arXiv 2401.06066; DeepSeek-V3, arXiv 2412.19437 §2.1.2).
// The gate, its options (SharedExperts<n>, BiasBalance<p, q>, GroupLimited<G, M>, SequenceBalance<p, q>,
// RouteScale<p, q>) and the equations: routers/affinity.hpp.
template <>
struct TopK<Sigmoid> {
  static constexpr bool is_router_policy = true;
  static constexpr bool gates_experts = true;  // an ExpertGate per step (routers/gate.hpp)
  static constexpr std::string_view name = "TopK<Sigmoid>";
  template <Dims D, int E, int Kp, bool Skip, class Options>
  using gate = AffinityTopKGate<D, E, Kp, Skip, Options>;

  template <class Set, int k, int h>
  struct Drives {
    static_assert(Set::n_attention >= 1 && Set::ffn_choices >= 1,
                  "mom::Router<TopK<Sigmoid>> routes each step's FFN experts after its attention module: the "
                  "ModuleSet needs MHA<L> and Experts<FFN, E, PerStep> (or FFN<E>)");
    static constexpr bool ok = Set::n_attention >= 1 && Set::ffn_choices >= 1;
  };

  template <class Options>
  struct VerifyOptions : VerifyAffinityOptions<Options> {};

  // Options that differ from the defaults, in the type's spelling (models/describe.hpp).
  template <class Options>
  static std::string describe_options() {
    using Cfg = AffinityConfig<Options>;
    using Default = AffinityConfig<TypeList<>>;
    const auto ratio = [](const char* n, long long p, long long q) {
      return std::string(", ") + n + "<" + std::to_string(p) + (q == 1 ? "" : ", " + std::to_string(q)) + ">";
    };
    std::string s;
    if (Cfg::shared != 0) s += ", SharedExperts<" + std::to_string(Cfg::shared) + ">";
    if (Cfg::bias_rate != Default::bias_rate)
      s += ratio("BiasBalance", Cfg::bias_t::numerator, Cfg::bias_t::denominator);
    if (Cfg::groups != 1)
      s += ", GroupLimited<" + std::to_string(Cfg::groups) + ", " + std::to_string(Cfg::top_groups) + ">";
    if (Cfg::balance_coef != 0) s += ratio("BalanceCoef", Cfg::balance_t::numerator, Cfg::balance_t::denominator);
    if (Cfg::sequence_coef != 0)
      s += ratio("SequenceBalance", Cfg::sequence_t::numerator, Cfg::sequence_t::denominator);
    if (!Cfg::renormalise) s += ", Renormalise<false>";
    if (Cfg::scale != 1) s += ratio("RouteScale", Cfg::scale_t::numerator, Cfg::scale_t::denominator);
    return s;
  }
};

}  // namespace mom

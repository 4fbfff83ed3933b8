#pragma once
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
//   Renormalise<b>      renormalise the K picked weights (default true, Mixtral); false: the raw
//                       softmax probabilities (Switch / GShard top-1 style)
#include <cstddef>
#include <string_view>

#include "mom/core/meta.hpp"
#include "mom/routers/options.hpp"
#include "mom/routers/router.hpp"

namespace mom {

// The gate of a top-K router: softmax over the classes.
struct Softmax {};

template <class OptionList>
struct TopKConfig;
template <class... Os>
struct TopKConfig<TypeList<Os...>> {
  static constexpr bool options_known = (((detail::option_kind<Os> >= 2) && (detail::option_kind<Os> <= 4)) && ...);
  static constexpr bool options_unique = [] {
    int counts[5] = {0, 0, 0, 0, 0};
    ((++counts[detail::option_kind<Os>]), ...);
    return counts[2] <= 1 && counts[3] <= 1 && counts[4] <= 1;
  }();
  using temperature_t = typename detail::pick_option<2, Temperature<1>, Os...>::type;
  using balance_t = typename detail::pick_option<3, BalanceCoef<1, 100>, Os...>::type;
  using renormalise_t = typename detail::pick_option<4, Renormalise<true>, Os...>::type;
  static constexpr double temperature = temperature_t::value;
  static constexpr double balance_coef = balance_t::value;
  static constexpr bool renormalise = renormalise_t::value;
  static constexpr bool valid = options_known && options_unique && temperature_t::numerator > 0 &&
                                temperature_t::denominator > 0 && balance_t::numerator >= 0 &&
                                balance_t::denominator > 0;
};

template <class Gate>
struct TopK {
  static_assert(std::is_same_v<Gate, Softmax>, "mom::TopK<Gate>: the gate must be Softmax (TopK<Softmax>)");
  static constexpr bool is_router_policy = true;
  static constexpr std::string_view name = "TopK<Softmax>";
  // One router per step: ln.w, ln.b, w.
  template <class Set>
  static constexpr std::size_t tensor_count = 3 * std::size_t(Set::n_attention);

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
                  "Renormalise<b>");
    static_assert(Cfg::options_unique, "mom::Router<TopK<Softmax>, Options...>: each option may be given at most once");
    static_assert(!Cfg::options_known ||
                      (Cfg::temperature_t::numerator > 0 && Cfg::temperature_t::denominator > 0),
                  "mom::Router<TopK<Softmax>>: Temperature<p, q> must be > 0");
    static_assert(!Cfg::options_known || (Cfg::balance_t::numerator >= 0 && Cfg::balance_t::denominator > 0),
                  "mom::Router<TopK<Softmax>>: BalanceCoef<p, q> must be >= 0");
    static constexpr bool ok = Cfg::valid;
  };
};

}  // namespace mom

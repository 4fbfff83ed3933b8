#pragma once
// Router<Recursion<Options...>>: Mixture-of-Recursions' expert-choice routing (Bae et al. 2025,
// arXiv 2507.10524, §2.2.1), assembled by phi::Recursion (assembly/recursion.hpp executes it).
//
// One shared block (ModuleSet<Block<B>, Skip>: B layers) is applied up to N_r = H times. Every
// recursion depth r is an "expert" that keeps the top-k_r of the tokens still in play, by a linear
// router of its own, g_t^r = α · G(θ_rᵀ H_t^r):
//   H_t^{r+1} = g_t^r · f(H_t^r; Φ') + H_t^r   if t is among the top-k_r of recursion r,
//   H_t^{r+1} = H_t^r                           otherwise                          (paper eq. (2))
// with hierarchical filtering: only the tokens selected at recursion r−1 are candidates at r, so a
// token that is not selected has exited and keeps its state. k_r = ⌊p_r/q · S⌋ tokens of every
// sequence, the capacities shrinking with r. Options:
//   Capacities<q, p_1, ..., p_Nr>   capacity p_r/q of recursion r, in (0, 1], non-increasing. Default:
//                                   (N_r − r + 1)/N_r for r = 1..N_r (the paper's schedule: N_r = 3 keeps
//                                   3/3, 2/3, 1/3 of the tokens)
//   Weighting<w>                    G: RouterWeight::Sigmoid (default, the paper's σ), Raw (the score
//                                   itself, as Mixture-of-Depths), Unit (g = 1: the router only selects)
//   Alpha<p, q>                     the scale α = p/q of the weight (default 1)
//   AddBlockOutput                  x_{r+1} = x_r + g · y (y the block's output, its residual stream included), as the
//                                   authors' released code adds it, instead of the default x_r + g · (y − x_r): the
//                                   block's update, with which g = 1 is the plain recursive transformer
//   CausalAux<p, q>                 p/q · BCE(σ(θ_rᵀ H_t^r), [t selected at r]) over the candidates of every
//                                   recursion whose capacity is below 1 (the paper's auxiliary loss for
//                                   causal inference, as Mixture-of-Depths §3.5 method 1)
//   TokenChoice<R>                  token-choice routing (§2.2.1) instead: each token's depth is chosen once, at the
//                                   block's input, by the gate of router R over N_r classes (default
//                                   Router<TopK<Softmax>, Renormalise<false>>: softmax over the depths, top-1; its
//                                   options add a balance loss, BalanceCoef<p, q>, or a z-loss, ZLoss<p, q>); a token
//                                   of depth i runs recursions 0..i, its update weighted by its gate weight g_t at
//                                   recursion i and by 1 before: x_{r+1} = x_r + c_t (y − x_r), c_t = g_t if r = i
//                                   else 1 (a variable number per sequence: the block runs over packed rows).
//                                   Causal: a token's depth reads its own state only, so it decodes as trained.
//   KVShare                         recursive KV sharing (§2.2.2): at every recursion r ≥ 1 the selected tokens' queries
//                                   attend to the keys and values of recursion 0 — every token's, at every earlier
//                                   position — instead of to their own (recursion-wise caching, the default). Needs a
//                                   first recursion of capacity 1 (every token runs it)
//   CausalRouting                   inference: token t runs recursion r iff it ran recursion r−1 and θ_rᵀ H_t^r > 0
//                                   (every token in play at a recursion of capacity 1), the decision CausalAux
//                                   trains, instead of the top-k_r (a variable number per sequence; forward
//                                   only). The parameters are those of the same type without it.
// Top-k_r depends on later tokens of the sequence, so training's routing is not causal: a decoder
// refuses the type (infer/decoder.hpp) and decodes causal_sampling_arch<Arch>::type instead (assembly/
// recursion.hpp: the same type with CausalRouting).
#include <array>
#include <string>
#include <string_view>

#include "mom/core/meta.hpp"
#include "mom/routers/depth.hpp"
#include "mom/routers/options.hpp"
#include "mom/routers/router.hpp"
#include "mom/routers/topk.hpp"

namespace mom {

template <long long q, long long... ps>
struct Capacities {
  static constexpr long long denominator = q;
  static constexpr int count = int(sizeof...(ps));
  static constexpr std::array<long long, sizeof...(ps)> numerators{ps...};
};
struct AddBlockOutput {};
struct KVShare {};
template <class R>
struct TokenChoice {
  using router = R;
};
template <long long num = 1, long long den = 1>
struct Alpha {
  static constexpr long long numerator = num, denominator = den;
};

namespace detail {
template <class... Os>
struct RecursionConfig {
  static constexpr bool options_known =
      mom::options_known<TypeList<Capacities<1>, Weighting<RouterWeight::Sigmoid>, Alpha<>, CausalAux<>, AddBlockOutput,
                                  CausalRouting, TokenChoice<void>, KVShare>,
                         Os...>;
  static constexpr bool options_unique = mom::options_unique<Os...>;
  static constexpr bool capacities_given = has_option<Capacities<1>, Os...>;
  using capacities_t = option_t<Capacities<1>, Os...>;
  using weighting_t = option_t<Weighting<RouterWeight::Sigmoid>, Os...>;
  using alpha_t = option_t<Alpha<>, Os...>;
  using aux_t = option_t<CausalAux<>, Os...>;
  static constexpr RouterWeight weighting = weighting_t::value;
  static constexpr bool unit_weight = weighting == RouterWeight::Unit;
  static constexpr bool sigmoid = weighting == RouterWeight::Sigmoid;
  static constexpr double alpha = ratio<alpha_t>();
  static constexpr bool causal_aux = has_option<CausalAux<>, Os...>;
  static constexpr bool add_block_output = has_option<AddBlockOutput, Os...>;
  static constexpr bool causal_routing = has_option<CausalRouting, Os...>;
  static constexpr bool token_choice = has_option<TokenChoice<void>, Os...>;
  static constexpr bool kv_share = has_option<KVShare, Os...>;
  using token_router_t = typename option_t<TokenChoice<Router<TopK<Softmax>, Renormalise<false>>>, Os...>::router;
  static constexpr double aux_coef = causal_aux ? ratio<aux_t>() : 0.0;

  // Capacity p_r/q of recursion r (0-based) of nr.
  static constexpr long long cap_num(int r, int nr) {
    if constexpr (capacities_given) return r < capacities_t::count ? capacities_t::numerators[std::size_t(r)] : 0;
    else return nr - r;
  }
  static constexpr long long cap_den(int nr) {
    if constexpr (capacities_given) return capacities_t::denominator;
    else return nr;
  }
  // k_r = ⌊p_r/q · seq⌋ tokens of every sequence at recursion r.
  static constexpr long long tokens(int r, int nr, long long seq) {
    return cap_den(nr) > 0 ? seq * cap_num(r, nr) / cap_den(nr) : 0;
  }
  static constexpr bool full(int r, int nr) { return cap_num(r, nr) == cap_den(nr); }
  static constexpr bool capacities_ok(int nr) {
    if (cap_den(nr) <= 0) return false;
    if constexpr (capacities_given)
      if (capacities_t::count != nr) return false;
    for (int r = 0; r < nr; ++r) {
      if (cap_num(r, nr) <= 0 || cap_num(r, nr) > cap_den(nr)) return false;
      if (r > 0 && cap_num(r, nr) > cap_num(r - 1, nr)) return false;
    }
    return true;
  }
  static std::string options_name() {
    std::string s;
    auto add = [&s](const std::string& part) { s += (s.empty() ? "" : ", ") + part; };
    if constexpr (capacities_given) {
      std::string c = "Capacities<" + std::to_string(capacities_t::denominator);
      for (long long p : capacities_t::numerators) c += "," + std::to_string(p);
      add(c + ">");
    }
    if (weighting == RouterWeight::Raw) add("Weighting<Raw>");
    if (unit_weight) add("Weighting<Unit>");
    if (alpha_t::numerator != alpha_t::denominator) add("Alpha<" + ratio_name(alpha_t::numerator, alpha_t::denominator) + ">");
    if constexpr (add_block_output) add("AddBlockOutput");
    if constexpr (causal_aux) add("CausalAux<" + ratio_name(aux_t::numerator, aux_t::denominator) + ">");
    if constexpr (kv_share) add("KVShare");
    if constexpr (causal_routing) add("CausalRouting");
    if constexpr (token_choice)
      add("TokenChoice<Router<" + std::string(token_router_t::policy::name) +
          (token_router_t::options::size > 0 ? ", ...>>" : ">>"));
    return s;
  }
};
}  // namespace detail

template <class... Options>
struct Recursion {
  static constexpr bool is_router_policy = true;
  static constexpr std::string_view name = "Recursion";
  using config = detail::RecursionConfig<Options...>;
  static std::string options_name() { return config::options_name(); }

  template <class Set, int k, int h>
  struct Drives {
    using Cfg = config;
    static_assert(Cfg::options_known,
                  "mom::Recursion<Options...>: unknown option; known: Capacities<q, p_1, ..., p_Nr>, Weighting<w>, "
                  "Alpha<p, q>, AddBlockOutput, CausalAux<p, q>, CausalRouting, TokenChoice<R>, KVShare");
    static_assert(Cfg::options_unique, "mom::Recursion<Options...>: each option may be given at most once");
    static_assert(!Cfg::options_known || Cfg::capacities_ok(h),
                  "mom::Recursion: Capacities<q, p_1, ..., p_Nr> needs one capacity p_r/q in (0, 1] per recursion "
                  "(H<Nr> of them), non-increasing (a token leaves the recursion once it is not selected)");
    static_assert(!Cfg::options_known || (Cfg::alpha_t::denominator > 0 && Cfg::alpha_t::numerator > 0),
                  "mom::Alpha<p, q>: the scale p/q of the router weight must be > 0");
    static_assert(!Cfg::causal_aux || Cfg::aux_coef > 0, "mom::CausalAux<p, q>: the loss coefficient p/q must be > 0");
    static_assert(!Cfg::causal_routing || Cfg::causal_aux,
                  "mom::Recursion: CausalRouting decides by the router's sign, which CausalAux<p, q> trains: add it");
    static_assert(!Cfg::token_choice ||
                      (!Cfg::capacities_given && !Cfg::causal_aux && !Cfg::causal_routing &&
                       Cfg::weighting == RouterWeight::Sigmoid && Cfg::alpha_t::numerator == Cfg::alpha_t::denominator),
                  "mom::Recursion<TokenChoice<R>>: each token's depth is its router's choice, weighted by the gate: "
                  "Capacities, Weighting, Alpha, CausalAux and CausalRouting belong to expert-choice routing");
    static_assert(!Cfg::kv_share || !Cfg::options_known || Cfg::token_choice || Cfg::full(0, h),
                  "mom::Recursion<KVShare>: the deeper recursions share the first recursion's keys and values, so every "
                  "token must run it: give recursion 1 capacity 1 (Capacities<q, q, ...>)");
    static_assert(Set::has_block,
                  "mom::Router<Recursion> applies one shared block per recursion: use ModuleSet<Block<B>, Skip>");
    static constexpr bool ok = Cfg::options_known && Cfg::options_unique && Cfg::capacities_ok(h) &&
                               Cfg::alpha_t::denominator > 0 && Cfg::alpha_t::numerator > 0 &&
                               (!Cfg::causal_aux || Cfg::aux_coef > 0) && (!Cfg::causal_routing || Cfg::causal_aux) &&
                               (!Cfg::token_choice || (!Cfg::capacities_given && !Cfg::causal_aux &&
                                                       !Cfg::causal_routing && Cfg::weighting == RouterWeight::Sigmoid &&
                                                       Cfg::alpha_t::numerator == Cfg::alpha_t::denominator)) &&
                               (!Cfg::kv_share || Cfg::token_choice || Cfg::full(0, h)) && Set::has_block;
  };
};

}  // namespace mom

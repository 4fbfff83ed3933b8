#pragma once
// Depth routers: per-token decisions to run a layer or route around it (SKIP), assembled by
// phi::LayerSkip (MoM paper eq. (9); assembly/depth.hpp executes them).
//
//   Router<BlockChoice<Options...>>   Mixture-of-Depths (Raposo et al. 2024, arXiv 2404.02258, §3.4): in every
//       routed block a linear router r_i = wᵀx_i scores the tokens and the block keeps exactly
//       C = ⌊capacity · S⌋ tokens of every sequence, the top-C scores; the others route around it (SKIP). The
//       paper calls this expert-choice routing with the block as the one expert (§3.4); the policy is named
//       BlockChoice (the block chooses its tokens) so that it does not share a name with expert-choice MoE,
//       TopC<Softmax> (routers/expert_topc.hpp: E experts each choose their top-c tokens). BlockChoice was
//       called ExpertChoice; that name is a deprecated alias below, and describe() (the architecture string
//       checkpoints record, models/describe.hpp) still spells it ExpertChoice. Options:
//         Capacity<p, q>        capacity p/q in (0, 1] (default 1/8 = 12.5%, the paper's best)
//         Every<k>              route every k-th block: blocks k-1, 2k-1, ... (default 2: blocks 1, 3,
//                               5, ...; every routed block follows a full-capacity one, the
//                               "interleaved" MoD of the paper's Fig. 5; Every<1>: all blocks)
//         Weighting<w>          RouterWeight::Raw (default): x + r·f(x̃) with the raw score r (eq. (1),
//                               the router's only gradient path); RouterWeight::Unit: x + f(x̃) (the
//                               router then learns from a causal loss alone)
//         CausalAux<p, q>       causal sampling, method 1 (§3.5): p/q · BCE(σ(r_i), [i ∈ top-C]) added
//                               to the loss
//         CausalPredictor<w, p, q>  method 2: an MLP d → w → 1 (ReLU) on stop-gradient x_i predicts
//                               top-C membership, trained by p/q · BCE (no effect on the LM's gradient)
//         CausalRouting         inference: route token i iff the causal decision says so (the predictor's
//                               logit > 0, else the router's r_i > 0) instead of the non-causal top-C;
//                               a variable number of tokens per sequence (autoregressive sampling, §3.5;
//                               forward only). The parameters are those of the same type without it.
//   Router<Skipping<Criterion, Options...>>   layer-skip / early-exit (eq. (9)): per token and layer
//       the criterion decides to run the layer (c_skip(h) = 1) or SKIP it. Criteria:
//         LinearGate            learned: g_i = σ(wᵀx_i + b) (b starts at 1), run iff g_i > ½, output
//                               x + g_i·f(x̃) (the gate on the gradient path, as MoD's r)
//         Never                 never skips, weight 1 (the dense stack through the skip machinery)
//       Options: EarlyExit (a token that skips a layer skips every later one), RunTarget<p, q, c, e> (c/e ·
//       (mean gate − p/q)² added to the loss: holds the expected fraction of tokens run near p/q, and gives
//       every token's gate a gradient, the skipped ones' too; default RunTarget<1, 2>: half, coefficient 1;
//       with EarlyExit the mean counts the tokens still in play only, exited tokens as 0),
//       SkipCost<p, q> (p/q · mean gate: a plain compute cost, default 0; alone it lets the gates collapse,
//       bench/RESULTS.md), Every<k> (as above; default 1: every layer may be skipped).
#include <array>
#include <cstddef>
#include <string>
#include <string_view>
#include <type_traits>

#include "mom/core/layout.hpp"
#include "mom/core/meta.hpp"
#include "mom/routers/options.hpp"
#include "mom/routers/router.hpp"
#include "mom/routers/topk.hpp"

namespace mom {

template <long long num, long long den = 1>
struct Capacity {
  static constexpr long long numerator = num, denominator = den;
};
template <int k>
struct Every {
  static constexpr int value = k;
};
// The weight of a selected token's block output: the raw score (MoD), 1, or σ(score) (Mixture-of-Recursions,
// routers/recursion.hpp; Mixture-of-Depths takes Raw or Unit).
enum class RouterWeight { Raw, Unit, Sigmoid };
template <RouterWeight w>
struct Weighting {
  static constexpr RouterWeight value = w;
};
template <long long num = 1, long long den = 100>
struct CausalAux {
  static constexpr long long numerator = num, denominator = den;
};
struct CausalRouting {};
template <int width = 32, long long num = 1, long long den = 1>
struct CausalPredictor {
  static constexpr int value = width;
  static constexpr long long numerator = num, denominator = den;
};
struct LinearGate {};
struct Never {};
struct EarlyExit {};
// Layer-skip: a layer's running tokens also attend to the tokens that skip it (their keys and values
// from the layer's own projections of their current, copied-up state), as early-exit models do
// (depth-adaptive transformers' and CALM's state copying). Without it a skipped token is not a key
// in that layer (Mixture-of-Depths' semantics).
struct AttendToSkipped {};
template <long long num = 1, long long den = 50>
struct SkipCost {
  static constexpr long long numerator = num, denominator = den;
};
template <long long num = 1, long long den = 2, long long coef_num = 1, long long coef_den = 1>
struct RunTarget {
  static constexpr long long numerator = num, denominator = den, coef_numerator = coef_num, coef_denominator = coef_den;
};

// MoDE staged (BlockChoice over ModuleSet<MHA<L>, Experts<FFN, E, PerStep>, Skip>): the router of every
// block's MoE FFN step, any policy that gates experts with its options (default Router<TopK<Softmax>>).
template <class R>
struct ExpertRouter {
  using router = R;
};

namespace detail {
template <class R>
constexpr double ratio() {
  return R::denominator != 0 ? double(R::numerator) / double(R::denominator) : 0.0;
}
inline std::string ratio_name(long long p, long long q) { return std::to_string(p) + "," + std::to_string(q); }

// What the executor needs to know about a depth router, from either policy.
template <bool bc, class... Os>
struct DepthConfig {
  static constexpr bool block_choice = bc;  // BlockChoice (Mixture-of-Depths), else Skipping
  static constexpr bool options_known =
      mom::options_known<TypeList<Capacity<1>, Every<1>, Weighting<RouterWeight::Raw>, CausalAux<>, CausalPredictor<>,
                                  LinearGate, Never, EarlyExit, SkipCost<>, CausalRouting, RunTarget<>, AttendToSkipped,
                                  ExpertRouter<void>>,
                         Os...>;
  static constexpr bool options_unique = mom::options_unique<Os...>;
  using capacity_t = option_t<Capacity<1, 8>, Os...>;
  using every_t = option_t<std::conditional_t<bc, Every<2>, Every<1>>, Os...>;
  using weighting_t = option_t<Weighting<RouterWeight::Raw>, Os...>;
  using aux_t = option_t<CausalAux<>, Os...>;
  using predictor_t = option_t<CausalPredictor<>, Os...>;
  using cost_t = option_t<SkipCost<0, 1>, Os...>;
  using target_t = option_t<RunTarget<>, Os...>;
  using expert_router_t = option_t<ExpertRouter<Router<TopK<Softmax>>>, Os...>;
  static constexpr bool expert_router_given = has_option<ExpertRouter<void>, Os...>;
  static constexpr long long cap_num = capacity_t::numerator, cap_den = capacity_t::denominator;
  static constexpr bool capacity_ok = cap_den > 0 && cap_num > 0 && cap_num <= cap_den;
  static constexpr int every = every_t::value;
  static constexpr bool causal_aux = has_option<CausalAux<>, Os...>;
  static constexpr bool predictor = has_option<CausalPredictor<>, Os...>;
  static constexpr int predictor_width = predictor ? predictor_t::value : 0;
  static constexpr double aux_coef = causal_aux ? ratio<aux_t>() : 0.0;
  static constexpr double predictor_coef = predictor ? ratio<predictor_t>() : 0.0;
  static constexpr bool never = has_option<Never, Os...>;
  static constexpr bool causal_routing = has_option<CausalRouting, Os...>;
  static constexpr int criteria = option_count<LinearGate, Os...> + option_count<Never, Os...>;
  static constexpr bool early_exit = has_option<EarlyExit, Os...>;
  static constexpr bool attend_skipped = has_option<AttendToSkipped, Os...>;
  // Layer-skip's compute cost applies to the learned gate only.
  static constexpr double skip_cost = bc || never ? 0.0 : ratio<cost_t>();
  static constexpr bool target_ok = target_t::denominator > 0 && target_t::numerator > 0 &&
                                    target_t::numerator <= target_t::denominator && target_t::coef_denominator > 0 &&
                                    target_t::coef_numerator >= 0;
  static constexpr double run_target = ratio<target_t>();
  static constexpr double run_target_coef =
      bc || never || !target_ok ? 0.0 : double(target_t::coef_numerator) / double(target_t::coef_denominator);
  // The gates' mean is needed (forward: the losses; backward: their gradient).
  static constexpr bool gate_mean = skip_cost > 0 || run_target_coef > 0;
  // The weight of a selected token's block output: the raw score r (MoD), the gate σ(g) (LinearGate),
  // or 1 (Weighting<Unit>, Never).
  static constexpr bool unit_weight = bc ? weighting_t::value == RouterWeight::Unit : never;
  // Per routed block: the router's w (and the gate's bias b), none for Never.
  static constexpr bool has_router = !never;
  static constexpr bool has_bias = !bc && !never;

  // The router tensors of one routed layer, named under its layer h.<layer> (declared here, once): the
  // score's w [1 × d] (MoDE staged: mod_router.w, beside the MoE gate's router.*), the gate's bias b, the
  // causal predictor's MLP d → w → 1.
  static constexpr std::size_t layer_tensor_count =
      (has_router ? 1 : 0) + (has_bias ? 1 : 0) + (predictor_width > 0 ? 4 : 0);
  static constexpr std::array<TensorSpec, layer_tensor_count> layer_tensors(index_t layer, index_t d,
                                                                            bool beside_experts) {
    std::array<TensorSpec, layer_tensor_count> out{};
    std::size_t i = 0;
    const index_t pw = predictor_width;
    if (has_router) out[i++] = {beside_experts ? "mod_router.w" : "router.w", layer, 1, d, Init::Normal};
    // The gate's bias starts at 1: σ(1) = 0.73 > ½, so at initialisation every token runs every layer.
    if (has_bias) out[i++] = {"router.b", layer, 1, 1, Init::One};
    if (pw > 0) {
      out[i++] = {"predictor.w1", layer, pw, d, Init::Normal};
      out[i++] = {"predictor.b1", layer, 1, pw, Init::Zero};
      out[i++] = {"predictor.w2", layer, 1, pw, Init::Normal};
      out[i++] = {"predictor.b2", layer, 1, 1, Init::Zero};
    }
    return out;
  }

  // Block h is routed when h % k == k - 1: the last block of every group of k.
  static constexpr bool routes(int h) { return every >= 1 && h % every == every - 1; }
  // C = ⌊capacity · seq⌋ tokens per sequence.
  static constexpr long long capacity_tokens(long long seq) { return cap_den > 0 ? seq * cap_num / cap_den : 0; }

  // Option names for describe(), e.g. "Capacity<1,8>, Every<2>, CausalAux<1,100>".
  static std::string options_name() {
    std::string s;
    auto add = [&s](const std::string& part) { s += (s.empty() ? "" : ", ") + part; };
    if constexpr (bc) {
      add("Capacity<" + ratio_name(cap_num, cap_den) + ">");
      add("Every<" + std::to_string(every) + ">");
      if (unit_weight) add("Weighting<Unit>");
      if constexpr (causal_aux) add("CausalAux<" + ratio_name(aux_t::numerator, aux_t::denominator) + ">");
      if constexpr (predictor)
        add("CausalPredictor<" + std::to_string(predictor_width) + "," +
            ratio_name(predictor_t::numerator, predictor_t::denominator) + ">");
      if (causal_routing) add("CausalRouting");
      if constexpr (expert_router_given)
        add("ExpertRouter<Router<" + std::string(expert_router_t::router::policy::name) +
            (expert_router_t::router::options::size > 0 ? ", ...>>" : ">>"));
    } else {
      add(never ? "Never" : "LinearGate");
      if (early_exit) add("EarlyExit");
      if (attend_skipped) add("AttendToSkipped");
      if (every != 1) add("Every<" + std::to_string(every) + ">");
      if (!never && run_target_coef > 0)
        add("RunTarget<" + ratio_name(target_t::numerator, target_t::denominator) + "," +
            ratio_name(target_t::coef_numerator, target_t::coef_denominator) + ">");
      if (!never && skip_cost > 0) add("SkipCost<" + ratio_name(cost_t::numerator, cost_t::denominator) + ">");
    }
    return s;
  }
};

// The checks every depth router shares (module set, K, H are phi::LayerSkip's).
template <class Cfg, int h>
struct VerifyDepthOptions {
  static_assert(Cfg::every >= 1, "mom::Every<k>: k must be >= 1 (route every k-th block; Every<1>: every block)");
  static_assert(Cfg::every < 1 || Cfg::every <= h,
                "mom::Every<k>: k is larger than H, so no block would be routed (blocks k-1, 2k-1, ... are routed)");
  static constexpr bool ok = Cfg::every >= 1 && Cfg::every <= h;
};
}  // namespace detail

template <class... Options>
struct BlockChoice {
  static constexpr bool is_router_policy = true;
  static constexpr std::string_view name = "BlockChoice";
  // The spelling in describe() (models/describe.hpp), which checkpoints record (mom.describe) and compare on
  // load: the policy's name before the rename, kept so that older checkpoints still load.
  static constexpr std::string_view describe_name = "ExpertChoice";
  using config = detail::DepthConfig<true, Options...>;
  static std::string options_name() { return config::options_name(); }

  template <class Set, int k, int h>
  struct Drives {
    using Cfg = config;
    static_assert(Cfg::options_known,
                  "mom::BlockChoice<Options...>: unknown option; known: Capacity<p, q>, Every<k>, Weighting<w>, "
                  "CausalAux<p, q>, CausalPredictor<w, p, q>, CausalRouting, ExpertRouter<R>");
    static_assert(Cfg::options_unique, "mom::BlockChoice<Options...>: each option may be given at most once");
    static_assert(!Cfg::options_known || Cfg::criteria == 0,
                  "mom::BlockChoice: LinearGate / Never are layer-skip criteria: use Router<Skipping<...>>");
    static_assert(Cfg::weighting_t::value != RouterWeight::Sigmoid,
                  "mom::BlockChoice: Weighting<RouterWeight::Sigmoid> is Mixture-of-Recursions' (Router<Recursion>); "
                  "Mixture-of-Depths weighs by the raw score (Raw) or 1 (Unit)");
    static_assert(!Cfg::attend_skipped,
                  "mom::BlockChoice: AttendToSkipped is a layer-skip option (in Mixture-of-Depths a routed block "
                  "attends among its selected tokens only)");
    static_assert(!Cfg::options_known || (Cfg::cap_den > 0 && Cfg::cap_num > 0 && Cfg::cap_num <= Cfg::cap_den),
                  "mom::BlockChoice: Capacity<p, q> must be in (0, 1] (the fraction of each sequence a routed block "
                  "processes)");
    static_assert(!(Cfg::causal_aux && Cfg::predictor),
                  "mom::BlockChoice: choose one causal-sampling method: CausalAux<p, q> or CausalPredictor<w, p, q>");
    static_assert(!Cfg::predictor || Cfg::predictor_width >= 1, "mom::CausalPredictor<w, p, q>: width w must be >= 1");
    static_assert(!Cfg::causal_aux || Cfg::aux_coef > 0,
                  "mom::CausalAux<p, q>: the loss coefficient p/q must be > 0");
    static_assert(!Cfg::predictor || Cfg::predictor_coef > 0,
                  "mom::CausalPredictor<w, p, q>: the loss coefficient p/q must be > 0");
    static_assert(!Cfg::causal_routing || Cfg::causal_aux || Cfg::predictor,
                  "mom::BlockChoice: CausalRouting decides by a trained causal predictor: add CausalAux<p, q> or "
                  "CausalPredictor<w, p, q>");
    static_assert(Set::has_block || Set::experts_per_step,
                  "mom::Router<BlockChoice> routes whole blocks: use ModuleSet<Block<L>, Skip> (or, MoDE staged, "
                  "ModuleSet<MHA<L>, Experts<FFN, E, PerStep>, Skip>)");
    static constexpr bool ok = detail::VerifyDepthOptions<Cfg, h>::ok && Cfg::options_known && Cfg::options_unique &&
                               Cfg::criteria == 0 && !Cfg::attend_skipped && Cfg::capacity_ok &&
                               Cfg::weighting_t::value != RouterWeight::Sigmoid && !(Cfg::causal_aux && Cfg::predictor) &&
                               (!Cfg::causal_routing || Cfg::causal_aux || Cfg::predictor) &&
                               (Set::has_block || Set::experts_per_step);
  };
};

// The Mixture-of-Depths router's old name (it borrowed expert-choice MoE's): deprecated, will be removed.
template <class... Options>
using ExpertChoice [[deprecated("mom::ExpertChoice is now mom::BlockChoice (Mixture-of-Depths' router; expert-choice "
                                "MoE is TopC<Softmax>)")]] = BlockChoice<Options...>;

template <class... Criteria>
struct Skipping {
  static constexpr bool is_router_policy = true;
  static constexpr std::string_view name = "Skipping";
  // Without a criterion the gate is learned: Skipping<EarlyExit> is Skipping<LinearGate, EarlyExit>.
  static constexpr int given_criteria = option_count<LinearGate, Criteria...> + option_count<Never, Criteria...>;
  using config = std::conditional_t<given_criteria == 0, detail::DepthConfig<false, LinearGate, Criteria...>,
                                    detail::DepthConfig<false, Criteria...>>;
  static std::string options_name() { return config::options_name(); }

  template <class Set, int k, int h>
  struct Drives {
    using Cfg = config;
    static_assert(Cfg::options_known,
                  "mom::Skipping<Criterion, Options...>: unknown option; known: LinearGate, Never, EarlyExit, "
                  "AttendToSkipped, RunTarget<p, q, c, e>, SkipCost<p, q>, Every<k>");
    static_assert(Cfg::options_unique, "mom::Skipping<Criterion, Options...>: each option may be given at most once");
    static_assert(!Cfg::options_known || Cfg::criteria == 1,
                  "mom::Skipping<Criterion, Options...>: give one criterion, LinearGate or Never, not both");
    static_assert(!Cfg::options_known || (Cfg::cost_t::denominator > 0 && Cfg::cost_t::numerator >= 0),
                  "mom::SkipCost<p, q>: the coefficient p/q must be >= 0");
    static_assert(!Cfg::options_known || Cfg::target_ok,
                  "mom::RunTarget<p, q, c, e>: the target fraction p/q must be in (0, 1] and the coefficient c/e >= 0");
    static_assert(!Cfg::options_known ||
                      (!Cfg::causal_aux && !Cfg::predictor && !Cfg::causal_routing &&
                       std::is_same_v<typename Cfg::capacity_t, Capacity<1, 8>> &&
                       std::is_same_v<typename Cfg::weighting_t, Weighting<RouterWeight::Raw>> &&
                       !Cfg::expert_router_given),
                  "mom::Skipping: Capacity, Weighting and the causal-sampling options belong to BlockChoice (as does "
                  "ExpertRouter; a skip criterion is causal already)");
    static constexpr bool ok = detail::VerifyDepthOptions<Cfg, h>::ok && Cfg::options_known && Cfg::options_unique &&
                               Cfg::criteria == 1 && Cfg::target_ok;
  };
};

}  // namespace mom

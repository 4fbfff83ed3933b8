#pragma once
// DeepSeekMoE's affinity gate (arXiv 2401.06066; DeepSeek-V3, arXiv 2412.19437 §2.1.2): AffinityTopKGate, the
// ExpertGate (routers/gate.hpp) of Router<TopK<Sigmoid>, Options...> in phi::MoE's steps, with its options and
// their checks. The policy TopK<Sigmoid> itself is in routers/topk.hpp, beside TopK<Softmax>: the TopK family in
// one file, the sigmoid affinities and the selection bias here. Per step h and token t, over the step's
// E experts of which the first N_s are shared (always on) and the other N_r = E − N_s are routed:
//   z = LN_r(u_t)                                the router's own pre-norm (as TopK<Softmax>'s)
//   s_i = σ(e_iᵀ z)                              affinities of the routed experts (V3 eq. (15))
//   K_t = top-k_r of s_i + b_i                   k_r = K − N_s; b: a per-expert bias that only selects
//   g_i = s_i / Σ_{j ∈ K_t} s_j, i ∈ K_t         gate weights from the affinities, not the bias (eq. (13))
//   h'_t = u_t + Σ_{shared} FFN_i(u_t) + Σ_{i ∈ K_t} g_i FFN_i(u_t)                        (eq. (12))
// The shared experts are classes 0 .. N_s−1, picked in the first N_s slots of every row with weight 1, so
// MoE's dispatch runs them as it runs any expert (no executor knows about them).
//
// Auxiliary-loss-free balancing (V3 eq. (16)): after every optimizer step b_i ← b_i + γ·sign(mean_j c_j − c_i),
// c_i the tokens routed to expert i during the step, summed over its micro-batches (and over data-parallel
// ranks: the loads travel in the bias's gradient slot, which the trainer sums like any gradient). b is a
// buffer (TensorSpec::trainable = false, h.<i>.router.bias): checkpointed, never learned; the trainer applies
// the rule through Model::update_buffers (models/runtime.hpp).
//
// Options (any order, each at most once; routers/options.hpp):
//   SharedExperts<n>     the first n experts of each step are shared (default 0)
//   BiasBalance<p, q>    γ = p / q, the bias update speed (default 1/1000, V3's 0.001; BiasBalance<0>: off)
//   GroupLimited<G, M>   routed experts in G equal groups, each token's picks within its M best groups, a
//                        group scored by the sum of its two largest biased affinities (V3 §2.1.2; default off)
//   BalanceCoef<p, q>    a Switch-style balance loss over the normalised affinities s_i / Σ_j s_j (default 0;
//                        computed over the step's rows, i.e. batch-wise)
//   SequenceBalance<p, q>  V3's complementary sequence-wise balance loss (eqs. (17)–(20)), α = p / q (V3: 1e-4;
//                        default 0): the same f·P sum within every sequence, averaged over the sequences (the
//                        MoE step's rows read as sequences of the model's seq; where a step's rows are not
//                        whole sequences, e.g. MoDE staged's selected tokens, all rows as one)
//   Renormalise<b>       g_i normalised over the picks (default true, V3); false: g_i = s_i
//   RouteScale<p, q>     a factor on the routed weights (V3's routed scaling factor; default 1)
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

namespace mom {

template <int n>
struct SharedExperts {
  static constexpr int value = n;
};
template <long long num, long long den = 1>
struct BiasBalance {
  static constexpr long long numerator = num, denominator = den;
  static constexpr double value = den != 0 ? double(num) / double(den) : 0.0;
};
template <int groups, int kept>
struct GroupLimited {
  static constexpr int count = groups, top = kept;
};
template <long long num, long long den = 1>
struct SequenceBalance {
  static constexpr long long numerator = num, denominator = den;
  static constexpr double value = den != 0 ? double(num) / double(den) : 0.0;
};
template <long long num, long long den = 1>
struct RouteScale {
  static constexpr long long numerator = num, denominator = den;
  static constexpr double value = den != 0 ? double(num) / double(den) : 0.0;
};

template <class OptionList>
struct AffinityConfig;
template <class... Os>
struct AffinityConfig<TypeList<Os...>> {
  static constexpr bool options_known =
      mom::options_known<TypeList<SharedExperts<0>, BiasBalance<0>, GroupLimited<1, 1>, BalanceCoef<0>, Renormalise<true>,
                                  RouteScale<1>, SequenceBalance<0>>,
                         Os...>;
  static constexpr bool options_unique = mom::options_unique<Os...>;
  using bias_t = option_t<BiasBalance<1, 1000>, Os...>;
  using balance_t = option_t<BalanceCoef<0>, Os...>;
  using scale_t = option_t<RouteScale<1>, Os...>;
  using sequence_t = option_t<SequenceBalance<0>, Os...>;
  static constexpr double sequence_coef = sequence_t::value;
  using groups_t = option_t<GroupLimited<1, 1>, Os...>;
  static constexpr int shared = option_t<SharedExperts<0>, Os...>::value;
  static constexpr double bias_rate = bias_t::value, balance_coef = balance_t::value, scale = scale_t::value;
  static constexpr int groups = groups_t::count, top_groups = groups_t::top;
  static constexpr bool renormalise = option_t<Renormalise<true>, Os...>::value;
};

// The option checks of Router<TopK<Sigmoid>, Options...> (TopK<Sigmoid>::VerifyOptions, routers/topk.hpp, is this).
template <class Options>
struct VerifyAffinityOptions {
  using Cfg = AffinityConfig<Options>;
  static_assert(Cfg::options_known,
                "mom::Router<TopK<Sigmoid>, Options...>: unknown option; known: SharedExperts<n>, BiasBalance<p, q>, "
                "GroupLimited<G, M>, BalanceCoef<p, q>, SequenceBalance<p, q>, Renormalise<b>, RouteScale<p, q>");
  static_assert(Cfg::options_unique, "mom::Router<TopK<Sigmoid>, Options...>: each option may be given at most once");
  static_assert(!Cfg::options_known || (Cfg::bias_t::numerator >= 0 && Cfg::bias_t::denominator > 0 &&
                                        Cfg::balance_t::numerator >= 0 && Cfg::balance_t::denominator > 0 &&
                                        Cfg::sequence_t::numerator >= 0 && Cfg::sequence_t::denominator > 0 &&
                                        Cfg::scale_t::numerator > 0 && Cfg::scale_t::denominator > 0),
                "mom::Router<TopK<Sigmoid>>: BiasBalance, BalanceCoef and SequenceBalance must be >= 0, RouteScale > 0");
  static_assert(!Cfg::options_known || (Cfg::groups >= 1 && Cfg::groups <= 64 && Cfg::top_groups >= 1 &&
                                        Cfg::top_groups <= Cfg::groups),
                "mom::Router<TopK<Sigmoid>>: GroupLimited<G, M> needs 1 <= M <= G <= 64");
  static constexpr bool ok = Cfg::options_known && Cfg::options_unique;
};

// The gate of one step (an ExpertGate): parameters ln.w, ln.b, w [N_r × d] (trained) and bias [1 × N_r]
// (a buffer updated by update_buffers), named h.<layer>.router.*.
template <Dims D, int E, int Kp, bool Skip, class Options>
struct AffinityTopKGate {
  static_assert(sizeof(VerifyAffinityOptions<Options>) > 0);  // runs the option checks (TopK<Sigmoid>'s)
  using Cfg = AffinityConfig<Options>;
  static constexpr int Ns = Cfg::shared, Nr = E - Ns, kr = Kp - Ns;
  static_assert(!Skip, "mom::Router<TopK<Sigmoid>>: no SKIP class (DeepSeekMoE routes every token to experts); drop "
                       "Skip from the ModuleSet");
  static_assert(Nr >= 1 && kr >= 1,
                "mom::Router<TopK<Sigmoid>, SharedExperts<n>>: K<k> must exceed the shared experts n (k − n routed picks "
                "per token) and the step's experts must exceed n (routed experts)");
  static_assert(Nr < 1 || Nr % Cfg::groups == 0,
                "mom::Router<TopK<Sigmoid>, GroupLimited<G, M>>: G must divide the routed experts");
  static_assert(Nr < 1 || kr <= Nr / Cfg::groups * Cfg::top_groups,
                "mom::Router<TopK<Sigmoid>>: more routed picks per token than experts in the kept groups (or than "
                "routed experts)");
  static constexpr int classes = E;  // shared experts first, then the routed ones
  static constexpr index_t d = D.d_model;
  using Head = detail::NormedRouterHead<d, Nr>;  // LN_r and W (routers/router_head.hpp)
  static constexpr index_t o_bias = Head::params, params = o_bias + Nr;
  static constexpr bool balances = Cfg::bias_rate > 0, balance_loss = Cfg::balance_coef > 0;
  static constexpr bool sequence_loss = Cfg::sequence_coef > 0;
  static constexpr std::array<TensorSpec, 4> tensors(index_t layer) {
    const auto h = Head::tensors(layer);
    return {{h[0], h[1], h[2], {"router.bias", layer, 1, Nr, Init::Zero, -1, false}}};
  }
  static constexpr index_t flops_per_token() { return Head::flops_per_token(); }
  static constexpr index_t backward_flops_per_token() { return 2 * flops_per_token(); }

  struct Plan {
    typename Head::Saved head{};
    index_t scores = 0;         // σ(logits) [rows × N_r]
    dispatch::Selection sel{};  // sel.probs [rows × N_r]: the normalised affinities (balance loss)
    index_t dseq = 0, freq = 0, seq_loss = 0;  // SequenceBalance: its gradient [rows × N_r], f [≤ rows × N_r], its value
  };
  static constexpr Plan plan(Arena& a, index_t rows) {
    Plan p{};
    p.head = Head::plan(a, rows);
    p.scores = a.take(rows * Nr);
    p.sel = dispatch::plan_selection(a, rows, Kp, classes);
    if constexpr (sequence_loss) {
      p.dseq = a.take(rows * Nr);
      p.freq = a.take(rows * Nr);
      p.seq_loss = a.take(1);
    }
    return p;
  }
  static constexpr const dispatch::Selection& selection(const Plan& p) { return p.sel; }
  static constexpr index_t scratch(index_t rows) { return rows * Kp + 2 * rows * Nr + Head::scratch(rows); }

  template <class Be, class T>
  static void forward(Be& be, const T* p, T* ws, const Plan& s, MatrixView<const T> in, std::span<const token_t>,
                      index_t seq = 0) {
    using detail::vec;
    const index_t rows = in.rows;
    const MatrixView<T> scores{ws + s.scores, rows, Nr};
    Head::forward(be, p, ws, s.head, in, scores);
    be.sigmoid_forward(scores.flat(), std::span<const T>(scores.flat()));  // s_i, eq. (15)
    const MatrixView<T> probs = balance_loss ? MatrixView<T>{ws + s.sel.probs, rows, Nr} : MatrixView<T>{};
    be.affinity_topk_forward(MatrixView<T>{ws + s.sel.weights, rows, Kp},
                             MatrixView<token_t>{dispatch::toks(ws, s.sel.picks), rows, Kp}, probs,
                             MatrixView<const T>(scores), vec(p, o_bias, Nr), index_t{Ns}, index_t{Cfg::groups},
                             index_t{Cfg::top_groups}, Cfg::renormalise, T(Cfg::scale));
    dispatch::group_picks(be, ws, s.sel, rows, Kp, classes);
    const std::span<T> loss{ws + s.sel.loss, 1};
    if constexpr (balance_loss)
      be.balance_loss_forward(loss, std::span<T>{ws + s.sel.dprobs_col, std::size_t(Nr)}, MatrixView<const T>(probs),
                              routed_offsets(ws, s), kr, T(Cfg::balance_coef));
    else
      be.zero(loss);
    if constexpr (sequence_loss) {  // V3 eqs. (17)–(20); its gradient is kept for backward
      const index_t T_ = seq > 0 && rows % seq == 0 ? seq : rows;
      be.sequence_balance_forward(std::span<T>{ws + s.seq_loss, 1}, MatrixView<T>{ws + s.dseq, rows, Nr},
                                  MatrixView<T>{ws + s.freq, rows / T_, Nr}, MatrixView<const T>(scores),
                                  MatrixView<const token_t>{dispatch::toks(ws, s.sel.picks), rows, Kp}, index_t{Ns}, T_,
                                  T(Cfg::sequence_coef));
      be.axpy(loss, T(1), std::span<const T>{ws + s.seq_loss, 1});
    }
  }

  // dL/dweights through the selection and σ, then W and LN_r. With the bias rule on, the step's routed
  // loads are added to the bias's gradient slot (its update statistic; the bias itself gets no gradient).
  template <class Be, class T>
  static void backward(Be& be, const T* p, T* g, const T* ws, const Plan& s, MatrixView<const T> in, MatrixView<T> din,
                       std::span<const T> dwp, T* scratch) {
    const index_t rows = in.rows;
    const std::span<T> dws{scratch, std::size_t(rows * Kp)};
    const MatrixView<T> dscores{scratch + rows * Kp, rows, Nr}, dlogits{scratch + rows * Kp + rows * Nr, rows, Nr};
    dispatch::slot_grads(be, ws, s.sel, rows, Kp, dwp, dws);
    be.zero(dscores.flat());
    be.affinity_topk_backward(dscores, MatrixView<const T>{dws.data(), rows, Kp}, MatrixView<const T>{ws + s.scores, rows, Nr},
                              MatrixView<const token_t>{dispatch::toks(ws, s.sel.picks), rows, Kp}, index_t{Ns},
                              Cfg::renormalise, T(Cfg::scale),
                              balance_loss ? std::span<const T>{ws + s.sel.dprobs_col, std::size_t(Nr)}
                                           : std::span<const T>{});
    if constexpr (sequence_loss)
      be.axpy(dscores.flat(), T(1), std::span<const T>{ws + s.dseq, std::size_t(rows * Nr)});
    be.zero(dlogits.flat());
    be.sigmoid_backward(dlogits.flat(), std::span<const T>{ws + s.scores, std::size_t(rows * Nr)},
                        std::span<const T>(dscores.flat()));
    Head::backward(be, p, g, ws, s.head, in, din, MatrixView<const T>(dlogits), scratch + rows * Kp + 2 * rows * Nr);
    if constexpr (balances) be.expert_load_add(std::span<T>{g + o_bias, std::size_t(Nr)}, routed_offsets(ws, s));
  }

  // After the optimizer step (the loads of the step's micro-batches summed in g's bias slot): eq. (16).
  template <class Be, class T>
  static void update_buffers(Be& be, T* p, const T* g) {
    if constexpr (balances)
      be.bias_balance_update(std::span<T>{p + o_bias, std::size_t(Nr)}, std::span<const T>{g + o_bias, std::size_t(Nr)},
                             T(Cfg::bias_rate));
  }

 private:
  // The group offsets of the routed classes N_s .. E−1 (N_r + 1 entries).
  template <class T>
  static std::span<const token_t> routed_offsets(const T* ws, const Plan& s) {
    return {dispatch::toks(ws, s.sel.offsets) + Ns, std::size_t(Nr + 1)};
  }
};

}  // namespace mom

// Code that included this header for Router<TopK<Sigmoid>> (defined here until the TopK family moved into one
// file) keeps compiling: deprecated, will be removed; include mom/routers/topk.hpp. (topk.hpp includes this
// header first, so in either order of inclusion both are complete.)
#include "mom/routers/topk.hpp"

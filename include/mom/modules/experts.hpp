#pragma once
// Experts<FFN, E, PerStep>: E feed-forward experts for EVERY step of the assembly (paper eq. (11):
// M_h = {m^F_{h,i}}_{i=1..N_F}, "the experts are not shared across different layers"), as in
// Mixtral. In ModuleSet<MHA<L>, Experts<FFN, E, PerStep>> the set holds L·E FFN modules; step h
// (layer h) owns experts h·E .. h·E + E - 1, stored after attention module h under the names
// "h.<h>.expert.<e>.ln_2.w", "h.<h>.expert.<e>.mlp.w_fc", ...
// One set of E experts shared by all layers (MoE(share)) is the plain family FFN<E>.
#include "mom/modules/ffn.hpp"
#include "mom/modules/module.hpp"

namespace mom {

// Placement of an expert family: one set of experts per assembly step (layer).
struct PerStep {};

template <template <int> class Family, int E, class Placement = PerStep>
struct Experts {
  static_assert(E >= 1, "mom::Experts<FFN, E, PerStep>: E (experts per step) must be >= 1");
  static_assert(std::is_same_v<Family<1>, FFN<1>>, "mom::Experts<Family, E, PerStep>: experts are FFN modules: Experts<FFN, E, PerStep>");
  static_assert(std::is_same_v<Placement, PerStep>, "mom::Experts<FFN, E, Placement>: the placement must be PerStep (for experts shared by all steps write FFN<E>)");
  static constexpr ModuleKind kind = ModuleKind::FeedForward;
  static constexpr int count = E;  // per step; the set multiplies by its number of steps (MHA<L>)
  static constexpr int per_step = E;
  template <Dims D>
  using single = modules::FeedForward<D>;
};

template <class F>
inline constexpr bool is_per_step_experts = false;
template <template <int> class Family, int E, class P>
inline constexpr bool is_per_step_experts<Experts<Family, E, P>> = true;

}  // namespace mom

#pragma once
// Experts<FFN, E, PerStep>: E feed-forward experts for EVERY step of the assembly (paper eq. (11):
// M_h = {m^F_{h,i}}_{i=1..N_F}, "the experts are not shared across different layers"), as in
// Mixtral. In ModuleSet<MHA<L>, Experts<FFN, E, PerStep>> the set holds L·E FFN modules; step h
// (layer h) owns experts h·E .. h·E + E - 1, stored after attention module h under the names
// "h.<h>.expert.<e>.ln_2.w", "h.<h>.expert.<e>.mlp.w_fc", ...
// One set of E experts shared by all layers (MoE(share)) is the plain family FFN<E>.
// The experts are computed by the family's single type: with `template <int N> using SwiGLUFFN =
// FFN<N, SwiGLU>;`, Experts<SwiGLUFFN, 8, PerStep> holds SwiGLU experts.
#include "mom/modules/ffn.hpp"
#include "mom/modules/module.hpp"

namespace mom {

// Placement of an expert family: one set of experts per assembly step (layer).
struct PerStep {};

template <template <int> class Family, int E, class Placement = PerStep>
struct Experts {
  static_assert(E >= 1, "mom::Experts<FFN, E, PerStep>: E (experts per step) must be >= 1");
  static_assert(ModuleFamily<Family<1>> && Family<1>::role == ModuleRole::TokenMixer,
                "mom::Experts<Family, E, PerStep>: experts are token mixers: Experts<FFN, E, PerStep>");
  static_assert(std::is_same_v<Placement, PerStep>, "mom::Experts<FFN, E, Placement>: the placement must be PerStep (for experts shared by all steps write FFN<E>)");
  static constexpr ModuleRole role = ModuleRole::TokenMixer;
  static constexpr int count = E;  // per step; the set multiplies by its number of steps (MHA<L>)
  static constexpr int per_step = E;
  template <Dims D>
  using single = typename Family<1>::template single<D>;
};

template <class F>
inline constexpr bool is_per_step_experts = false;
template <template <int> class Family, int E, class P>
inline constexpr bool is_per_step_experts<Experts<Family, E, P>> = true;

}  // namespace mom

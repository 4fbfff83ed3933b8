// mom-train's registry entries for MoEUT (issue 14; arXiv 2405.16039): the paper's §3 recipe at dense8's
// shape (mom8_dims: d 256, 8 layers; rotary positions as in the paper), parameter-matched with dense8-rope,
// and its ablations: pre- and post-LayerNorm (Fig. 8), G = 1 / 8 (Fig. 6; G = 8 is the non-shared σ-MoE baseline),
// AABB order (Fig. 6), and the configuration matched to GPT-2 small (gpt2-small-moeut).
#pragma once
#include <mom/models/gpt2.hpp>
#include <mom/models/moeut_models.hpp>

#include "architectures.hpp"

namespace mom::examples {

inline constexpr Dims mom8_rope_dims = with_rope(mom8_dims);
using Dense8Rope = LM<mom8_rope_dims, Dense<8>>;
template <int G, class Norm = PeriNorm, class Order = ABAB>
using MoEUT8 = LM<mom8_rope_dims, MoEUT<mom8_dims, 8, G, Norm, Order>>;  // recipe from dense8's shape
using GPT2SmallMoEUT = LM<with_rope(gpt2_small), MoEUT<gpt2_small, 12, 2>>;

// Parameter-matched: the non-embedding parameters within 1% of the dense baseline's (MoEUTRecipe checks
// it too); both without a learned position embedding.
template <class M>
constexpr bool matches_dense8 = 100 * (M::params > Dense8Rope::params ? M::params - Dense8Rope::params
                                                                     : Dense8Rope::params - M::params) <= Dense8Rope::params;
static_assert(matches_dense8<MoEUT8<2>> && matches_dense8<MoEUT8<1>> && matches_dense8<MoEUT8<8>>);

template <class Reg>
void moeut_architectures(Reg& reg) {
  reg.template add<Dense8Rope>("dense8-rope", "byte", "dense8 with rotary positions (no wpe): MoEUT's parameter-matched baseline");
  reg.template add<MoEUT8<2>>("moeut8", "byte", "MoEUT: SwitchHead + σ-MoE, G = 2 layers cycled ABAB x4, peri-LayerNorm, RoPE; dense8-rope's parameters");
  reg.template add<MoEUT8<2, PreNorm>>("moeut8-pre", "byte", "moeut8 with pre-LayerNorm (MoEUT Fig. 8 ablation)");
  reg.template add<MoEUT8<2, PostNorm>>("moeut8-post", "byte", "moeut8 with post-LayerNorm, LN(x + f(x)) (MoEUT Fig. 8 ablation)");
  reg.template add<MoEUT8<2, PeriNorm, AABB>>("moeut8-aabb", "byte", "moeut8 with the group in blocks AAAABBBB (MoEUT Fig. 6 ablation)");
  reg.template add<MoEUT8<1>>("moeut8-g1", "byte", "MoEUT with one shared layer (G = 1), 86 experts (Fig. 6 ablation)");
  reg.template add<MoEUT8<8>>("moeut8-g8", "byte", "the non-shared σ-MoE baseline (G = 8 = L), peri-LayerNorm");
  reg.template add<GPT2SmallMoEUT>("gpt2-small-moeut", "gpt2", "MoEUT matched to GPT-2 small (G = 2, RoPE): 3 heads x 128 with 7 experts each, 191 σ-MoE experts of 128, top-12");
}

}  // namespace mom::examples

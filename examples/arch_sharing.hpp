// mom-train's registry entries for parameter sharing (issue 6; MoM paper §3.5, eq. (10)): 8 assembly
// steps at mom8_dims, comparable with dense8 (same FLOPs per token, fewer parameters).
#pragma once
#include "architectures.hpp"

namespace mom::examples {

template <class Policy, int G>
using Share8 = LM<mom8_dims, Assembly<Router<Share<Policy>>, ModuleSet<MHA<G>, FFN<G>>, K<1>, H<8>>>;
using Share8All = Share8<All, 1>;          // ALBERT / Universal Transformer: one pair x 8
using Share8Cycle2 = Share8<Cycle<2>, 2>;  // ABABABAB (MoEUT grouping, G = 2)
using Share8Blocks2 = Share8<Blocks<2>, 2>;  // AAAABBBB (MoEUT's AABB ablation)

template <class Reg>
void sharing_architectures(Reg& reg) {
  reg.template add<Share8All>("share8-all", "byte", "parameter sharing: one attention+FFN pair run 8 times (ALBERT / UT)");
  reg.template add<Share8Cycle2>("share8-cycle2", "byte", "parameter sharing: 2 pairs cycled ABABABAB (MoEUT, G = 2)");
  reg.template add<Share8Blocks2>("share8-blocks2", "byte", "parameter sharing: 2 pairs in blocks AAAABBBB (MoEUT's AABB)");
}

}  // namespace mom::examples

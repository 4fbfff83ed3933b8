// mom-train's registry entries for parameter sharing (issue 6; MoM paper §3.5, eq. (10)): 8 assembly
// steps at mom8_dims, comparable with dense8 (same FLOPs per token, fewer parameters).
#include "train_model.hpp"

namespace mom::examples {

template <class Policy, int G>
using Share8 = LM<mom8_dims, Assembly<Router<Share<Policy>>, ModuleSet<MHA<G>, FFN<G>>, K<1>, H<8>>>;
using Share8All = Share8<All, 1>;          // ALBERT / Universal Transformer: one pair x 8
using Share8Cycle2 = Share8<Cycle<2>, 2>;  // ABABABAB (MoEUT grouping, G = 2)
using Share8Blocks2 = Share8<Blocks<2>, 2>;  // AAAABBBB (MoEUT's AABB ablation)

std::vector<ArchEntry> sharing_architectures() {
  std::vector<ArchEntry> v;
  v.push_back(make_architecture<Share8All>("share8-all", "byte", "parameter sharing: one attention+FFN pair run 8 times (ALBERT / UT)"));
  v.push_back(make_architecture<Share8Cycle2>("share8-cycle2", "byte", "parameter sharing: 2 pairs cycled ABABABAB (MoEUT, G = 2)"));
  v.push_back(make_architecture<Share8Blocks2>("share8-blocks2", "byte", "parameter sharing: 2 pairs in blocks AAAABBBB (MoEUT's AABB)"));
  return v;
}

}  // namespace mom::examples

// mom-train's registry entries for MoE, MoE(share), MoDE (integrated) (issue 6), at dense8's shape
// (mom8_dims: d 256, 8 heads, d_ff 1024, byte vocabulary, context 256), comparable with dense8.
#include <mom/models/moe_models.hpp>

#include "train_model.hpp"

namespace mom::examples {

using MoE8 = LM<mom8_dims, MoEStack<8, 8, 2>>;             // 8 layers x 8 experts, top-2 (Mixtral)
using MoE8Share = LM<mom8_dims, MoEShareStack<8, 8, 2>>;   // 8 experts shared by the 8 layers, top-2
using MoDE8Int = LM<mom8_dims, MoDEIntegrated<8, 8, 2>>;   // 8 experts + SKIP per layer, top-2

std::vector<ArchEntry> moe_architectures() {
  std::vector<ArchEntry> v;
  v.push_back(make_architecture<MoE8>("moe8", "byte", "MoE eq. (11): 8 layers x 8 FFN experts, top-2 softmax router (Mixtral)"));
  v.push_back(make_architecture<MoE8Share>("moe8-share", "byte", "MoE(share): 8 FFN experts shared by the 8 layers, top-2; dense8's parameters + routers"));
  v.push_back(make_architecture<MoDE8Int>("mode8-int", "byte", "MoDE integrated: 8 experts + a no-op (Skip) expert per layer, top-2"));
  return v;
}

}  // namespace mom::examples

// mom-train's registry entries for ModuleFormer (issue 15; arXiv 2306.04640) at dense8's shape (mom8_dims:
// d 256, 8 layers, no position embedding: stick-breaking attention encodes order), in the spirit of the
// paper's Table 1 (top-2 everywhere, D_ffd = 2·d): 8 stick-breaking heads of 128 per layer (shared K/V) and
// 16 experts of 512, each family with its MLP router (D_rtr 64) and the mutual-information loss; and the
// module manipulations of §4 as types that start from a moduleformer8 checkpoint (--init-from), and
// `mom-train prune` for moduleformer8 and moduleformer8-concentrate checkpoints:
//   moduleformer8-insert       §4.3 variant 1: +2 heads, +4 experts per layer, router fully trainable
//   moduleformer8-insert-reg   §4.3 variant 2: the same with λ‖A'‖² (λ = 0.01); freeze A and B (--freeze)
//   moduleformer8-concentrate  §4.2: the load-concentration loss H(m) for fine-tuning before pruning
//   moduleformer8-c6-12        §5.3: 6 heads and 12 experts per layer, the compaction target of mom-train prune
// docs/moduleformer.md has the commands of the continual-learning and pruning demo.
#pragma once
#include <mom/models/moduleformer_models.hpp>

#include "architectures.hpp"

namespace mom::examples {

inline constexpr Dims mom8_nope_dims = without_positions(mom8_dims);
using MF8Spec = ModuleFormerSpec<8, MoA<8, 2, 128, 64>, SMoE<16, 2, 512, 64>>;
using ModuleFormer8 = LM<mom8_nope_dims, MF8Spec::type>;
using ModuleFormer8Insert = LM<mom8_nope_dims, MF8Spec::inserted<2, 4>::type>;
using ModuleFormer8InsertReg = LM<mom8_nope_dims, MF8Spec::inserted<2, 4, std::ratio<1, 100>>::type>;
using ModuleFormer8Concentrate = LM<mom8_nope_dims, MF8Spec::with_loss<LoadConcentration<std::ratio<1, 100>>>::type>;
using ModuleFormer8Compact = LM<mom8_nope_dims, MF8Spec::compacted<6, 12>::type>;
// Its dense baseline at equal active compute (issue 32): the same layer with every module active (2 heads of 128,
// 2 experts of 512, top-2 of 2), so the comparison keeps stick-breaking attention (positions) and the gates.
using ModuleFormer8Dense = LM<mom8_nope_dims, ModuleFormerSpec<8, MoA<2, 2, 128, 64>, SMoE<2, 2, 512, 64>>::type>;

template <class Reg>
void moduleformer_architectures(Reg& reg) {
  // add<Model, DenseTwin, Compact>: `mom-train prune` compacts a checkpoint of Model into Compact.
  reg.template add<ModuleFormer8, void, ModuleFormer8Compact>("moduleformer8", "byte", "ModuleFormer: 8 stick-breaking heads of 128 (shared K/V) + 16 experts of 512 per layer, top-2 each, MLP routers, MI loss, no positions", {}, "moduleformer8-c6-12");
  reg.template add<ModuleFormer8Insert, ModuleFormer8>("moduleformer8-insert", "byte", "moduleformer8 + 2 heads + 4 experts per layer (§4.3 variant 1); --init-from a moduleformer8 run", "moduleformer8");
  reg.template add<ModuleFormer8InsertReg, ModuleFormer8>("moduleformer8-insert-reg", "byte", "moduleformer8-insert with routing regularisation 0.01·|A'|² (§4.3 variant 2); --init-from a moduleformer8 run", "moduleformer8");
  reg.template add<ModuleFormer8Concentrate, ModuleFormer8, ModuleFormer8Compact>("moduleformer8-concentrate", "byte", "moduleformer8 fine-tuned with the load-concentration loss H(m) (§4.2); --init-from a moduleformer8 run", "moduleformer8", "moduleformer8-c6-12");
  reg.template add<ModuleFormer8Dense>("moduleformer8-dense", "byte", "moduleformer8 with every module active (2 heads of 128 + 2 experts of 512, top-2 of 2): its active compute and positions without sparsity");
  reg.template add<ModuleFormer8Compact>("moduleformer8-c6-12", "byte", "moduleformer8 compacted to 6 heads and 12 experts per layer (mom-train prune --into)");
}

}  // namespace mom::examples

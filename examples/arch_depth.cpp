// mom-train's registry entries for Mixture-of-Depths, layer-skip, early-exit (issue 6). Every model keeps the
// layer names of dense8 (Block<8> is MHA<8> + FFN<8> in the same layout), so --init-from a dense8 run works.
#include "mom/models/moe_models.hpp"
#include "train_model.hpp"

namespace mom::examples {

// Mixture-of-Depths (Raposo et al. 2024): 12.5% capacity, blocks 1, 3, 5, 7 routed (every other block).
using MoD8 = LM<mom8_dims, MoD<8>>;
// ... with causal sampling (§3.5): method 2, an MLP predictor (d -> 32 -> 1) on stop-gradient inputs;
// method 1, a BCE loss (coefficient 1/100) on the router logits.
using MoD8Causal = LM<mom8_dims, MoD<8, 1, 8, 2, CausalPredictor<32>>>;
using MoD8CausalAux = LM<mom8_dims, MoD<8, 1, 8, 2, CausalAux<1, 100>>>;
// Layer-skip (MoM eq. (9)) and early-exit with a learned per-token gate on every layer.
using Skip8 = LM<mom8_dims, LayerSkipping<8>>;
using Exit8 = LM<mom8_dims, EarlyExiting<8>>;
// MoDE staged (MoD paper §4.3): mod8's routing (12.5% on blocks 1,3,5,7) in front of moe8's FFNs (8 experts
// per layer, top-2); the unrouted blocks run their MoE over every token.
using MoDE8Staged = LM<mom8_dims, MoDEStaged<8, 8, 2>>;

std::vector<ArchEntry> depth_architectures() {
  std::vector<ArchEntry> v;
  v.push_back(make_architecture<MoD8, Dense8>("mod8", "byte", "Mixture-of-Depths: 12.5% capacity on blocks 1,3,5,7 (dense8 shape)", "dense8"));
  v.push_back(make_architecture<MoD8Causal, Dense8>("mod8-causal", "byte", "mod8 + causal predictor (MoD §3.5, method 2); accuracy in <out>/depth.jsonl", "dense8"));
  v.push_back(make_architecture<MoD8CausalAux, Dense8>("mod8-causal-aux", "byte", "mod8 + router BCE loss 0.01 (MoD §3.5, method 1)", "dense8"));
  v.push_back(make_architecture<Skip8, Dense8>("skip8", "byte", "layer-skip: learned per-token gate on every layer (MoM eq. (9))", "dense8"));
  v.push_back(make_architecture<Exit8, Dense8>("exit8", "byte", "early-exit: a token that skips a layer skips all later ones", "dense8"));
  v.push_back(make_architecture<MoDE8Staged>("mode8-staged", "byte", "MoDE staged: mod8 routing (12.5%, blocks 1,3,5,7) before moe8's experts (8, top-2)"));
  return v;
}

}  // namespace mom::examples

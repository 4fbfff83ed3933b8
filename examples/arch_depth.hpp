// mom-train's registry entries for Mixture-of-Depths, layer-skip, early-exit (issue 6) and Mixture-of-Recursions
// (issue 18). Every model keeps the
// layer names of dense8 (Block<8> is MHA<8> + FFN<8> in the same layout), so --init-from a dense8 run works.
#pragma once
#include "mom/models/moe_models.hpp"
#include "architectures.hpp"

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
// Mixture-of-Recursions, middle-cycle (arXiv 2507.10524): layer 0 and layer 7 unshared, layers 1-6 one shared
// block applied up to Nr times, expert-choice per recursion (capacities 2/2, 1/2; or 3/3, 2/3, 1/3). dense8's
// parameters (+ one router row per recursion) and its layer names, so --init-from a dense8 run works.
using MoR8 = LM<mom8_dims, MoRMiddleCycle<6, 2>>;
using MoR8R3 = LM<mom8_dims, MoRMiddleCycle<6, 3>>;
// ... as the authors configure expert choice: x + g·(block output), g = σ(score)/10, router BCE 1/1000.
using MoR8Paper = LM<mom8_dims, MoRMiddleCycle<6, 3, AddBlockOutput, Alpha<1, 10>, CausalAux<1, 1000>>>;
// ... token choice: each token's depth (1-3 recursions) chosen once by a softmax router, Switch balance loss 1/10
// over the depths (the authors' token-choice setting).
using MoR8Token = LM<mom8_dims, MoRMiddleCycle<6, 3, TokenChoice<Router<TopK<Softmax>, Renormalise<false>, BalanceCoef<1, 10>>>>>;
// ... mor8-r3 with recursive KV sharing: recursions 2 and 3 attend to recursion 1's keys and values.
using MoR8Share = LM<mom8_dims, MoRMiddleCycle<6, 3, KVShare>>;

template <class Reg>
void depth_architectures(Reg& reg) {
  reg.template add<MoD8, Dense8>("mod8", "byte", "Mixture-of-Depths: 12.5% capacity on blocks 1,3,5,7 (dense8 shape)", "dense8");
  reg.template add<MoD8Causal, Dense8>("mod8-causal", "byte", "mod8 + causal predictor (MoD §3.5, method 2); accuracy in <out>/depth.jsonl", "dense8");
  reg.template add<MoD8CausalAux, Dense8>("mod8-causal-aux", "byte", "mod8 + router BCE loss 0.01 (MoD §3.5, method 1)", "dense8");
  reg.template add<Skip8, Dense8>("skip8", "byte", "layer-skip: learned per-token gate on every layer (MoM eq. (9))", "dense8");
  reg.template add<Exit8, Dense8>("exit8", "byte", "early-exit: a token that skips a layer skips all later ones", "dense8");
  reg.template add<MoDE8Staged>("mode8-staged", "byte", "MoDE staged: mod8 routing (12.5%, blocks 1,3,5,7) before moe8's experts (8, top-2)");
  reg.template add<MoR8, Dense8>("mor8", "byte", "Mixture-of-Recursions, middle-cycle: layers 1-6 shared, 2 recursions (capacity 1, 1/2)", "dense8");
  reg.template add<MoR8R3, Dense8>("mor8-r3", "byte", "Mixture-of-Recursions, middle-cycle: layers 1-6 shared, 3 recursions (capacity 1, 2/3, 1/3)", "dense8");
  reg.template add<MoR8Paper, Dense8>("mor8-paper", "byte", "mor8-r3 with the authors' settings: x + g*(block output), g = sigmoid/10, router BCE 0.001", "dense8");
  reg.template add<MoR8Token, Dense8>("mor8-token", "byte", "Mixture-of-Recursions, token choice: each token's depth (1-3) chosen once by a softmax router, balance loss 0.1", "dense8");
  reg.template add<MoR8Share, Dense8>("mor8-share", "byte", "mor8-r3 with recursive KV sharing: recursions 2, 3 attend to recursion 1's keys and values", "dense8");
}

}  // namespace mom::examples

// mom-train's registry entries for MoE, MoE(share), MoDE (integrated) (issue 6), DeepSeekMoE and expert-choice MoE
// (issue 18), at
// dense8's shape (mom8_dims: d 256, 8 heads, d_ff 1024, byte vocabulary, context 256), comparable with dense8.
#pragma once
#include <mom/models/moe_models.hpp>

#include "architectures.hpp"

namespace mom::examples {

using MoE8 = LM<mom8_dims, MoEStack<8, 8, 2>>;             // 8 layers x 8 experts, top-2 (Mixtral)
using MoE8Share = LM<mom8_dims, MoEShareStack<8, 8, 2>>;   // 8 experts shared by the 8 layers, top-2
using MoDE8Int = LM<mom8_dims, MoDEIntegrated<8, 8, 2>>;   // 8 experts + SKIP per layer, top-2
// DeepSeekMoE at moe8's parameters and FLOPs: per layer 1 shared + 31 routed experts of d_ff/4 (= moe8's 8 FFNs),
// 1 + 7 of them per token (= moe8's top-2); balanced by the selection bias, or by a Switch loss instead.
using DSMoE8 = LM<mom8_dims, DeepSeekMoEStack<8, 1, 31, 7, 4>>;
// Expert-choice MoE at moe8's parameters and (average) FLOPs: each layer's 8 experts take their top-c tokens of the
// batch, c = n·2/8 (2 experts per token on average, as moe8's top-2).
using EC8 = LM<mom8_dims, ExpertChoiceMoEStack<8, 8, 2>>;
using DSMoE8Switch = LM<mom8_dims, DeepSeekMoEStack<8, 1, 31, 7, 4, BiasBalance<0>, BalanceCoef<1, 100>>>;

template <class Reg>
void moe_architectures(Reg& reg) {
  reg.template add<MoE8>("moe8", "byte", "MoE eq. (11): 8 layers x 8 FFN experts, top-2 softmax router (Mixtral)");
  reg.template add<MoE8Share>("moe8-share", "byte", "MoE(share): 8 FFN experts shared by the 8 layers, top-2; dense8's parameters + routers");
  reg.template add<MoDE8Int>("mode8-int", "byte", "MoDE integrated: 8 experts + a no-op (Skip) expert per layer, top-2");
  reg.template add<DSMoE8>("dsmoe8", "byte", "DeepSeekMoE: 1 shared + 31 routed experts of d_ff/4 per layer, top-7 sigmoid routing, auxiliary-loss-free bias (moe8's params and FLOPs)");
  reg.template add<DSMoE8Switch>("dsmoe8-switch", "byte", "dsmoe8 balanced by a Switch loss (1/100) instead of the selection bias");
  reg.template add<EC8>("ec8", "byte", "expert-choice MoE: each layer's 8 experts take their top-c tokens of the batch, capacity factor 2 (moe8's params and FLOPs); not causal");
}

}  // namespace mom::examples

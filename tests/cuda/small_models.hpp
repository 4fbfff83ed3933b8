#pragma once
// Small models of every family, shared by the CUDA suite's whole-model tests (cuda_models_test.cpp: loss and
// gradients against the CPU backend; cuda_trainer_test.cpp: the bundled Trainer on both backends). Small enough
// for the CPU emulation of the kernels.
#include "mom/models/mom_models.hpp"
#include "mom/models/moe_models.hpp"
#include "mom/models/moeut_models.hpp"
#include "mom/models/moduleformer_models.hpp"
#include "mom/mom.hpp"

namespace mom::test::small_models {

constexpr Dims small_dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};    // hd 16
constexpr Dims gpt_head_dims{.d_model = 128, .heads = 2, .d_ff = 256, .vocab = 300, .context = 32};  // hd 64
using DenseSmall = LM<small_dims, Dense<2>>;
using ChunkedHd64 = LM<gpt_head_dims, Chunked<Layer, Dense<2>>>;
// Mixture-of-Modules: MoM_P (K2 H6 with Skip) in the [1-1-4-1-1] strategy, and a routed-KV chunk.
using MoMP = LM<small_dims, Strategy_11411<MoM_P<>>>;
// The same with the authors' router width 256 (the default here is min(256, d_model) = 64): the float Trainer
// comparisons use it. At width 64 the float runs of the two backends part by 2e-3 in the parameters after 3 steps
// (validation losses 7e-4 apart; 2026-11-27), more than their 1e-3: float rounding amplified by AdamW's first
// steps (an update of about lr·sign(g) per entry) or by a routing decision, not an arithmetic difference: the double
// comparison of MoMP agrees to 1e-9.
using MoMPWide = LM<small_dims, Strategy_11411<MoM_P<Router<GRU, Width<256>>>>>;
using MoMRoutedKV = LM<small_dims, Chunked<Layer, KaHbS<2, 3, 3, Router<GRU>, phi::MoMRoutedKV>>>;
using MoMRoutedKVWide = LM<small_dims, Chunked<Layer, KaHbS<2, 3, 3, Router<GRU, Width<256>>, phi::MoMRoutedKV>>>;
// The special cases of issue 6: MoE (3 experts per layer, top-2),
// MoE(share), MoDE integrated, Mixture-of-Depths (capacity 1/8 of seq 24: 3 tokens per sequence, every
// other block), layer-skip and early-exit (learned gates), MoDE staged.
using MoESmall = LM<small_dims, MoEStack<2, 3, 2>>;
using MoEShareSmall = LM<small_dims, MoEShareStack<2, 3, 2>>;
using MoDEIntSmall = LM<small_dims, MoDEIntegrated<2, 3, 2>>;
using MoDSmall = LM<small_dims, MoD<4>>;
// Mixture-of-Recursions: nested top-k over 3 recursions of a 2-layer block, middle-cycle with CausalAux.
using MoRSmall = LM<small_dims, MoR<2, 3>>;
using MoRTokenSmall = LM<small_dims, MoR<2, 3, TokenChoice<Router<TopK<Softmax>, Renormalise<false>, BalanceCoef<1, 10>>>>>;
using MoRShareSmall = LM<small_dims, MoR<2, 3, KVShare, CausalAux<1, 10>>>;
using MoRMiddleSmall = LM<small_dims, MoRMiddleCycle<1, 2, CausalAux<1, 10>, Weighting<RouterWeight::Raw>>>;
using SkipSmall = LM<small_dims, LayerSkipping<3>>;
using ExitSmall = LM<small_dims, EarlyExiting<3>>;
using MoDEStagedSmall = LM<small_dims, MoDEStaged<2, 3, 2>>;
// DeepSeekMoE (issue 18): 1 shared + 6 routed experts of d_ff/4 per layer, top-2 routed within the best of 2
// groups, the sigmoid router's balance loss on, the selection bias's loads in its gradient slot.
using DSSmall = LM<small_dims, DeepSeekMoEStack<2, 1, 6, 2, 4, GroupLimited<2, 1>, BalanceCoef<1, 100>>>;
// Expert-choice MoE (issue 18): 3 experts per layer each take their top-c tokens (capacity factor 2).
using ECSmall = LM<small_dims, ExpertChoiceMoEStack<2, 3>>;
// Parameter sharing: the dense executor over a step -> module map (a shared module's gradient is the sum
// over its uses).
constexpr Dims share_dims{.d_model = 32, .heads = 4, .d_ff = 64, .vocab = 50, .context = 32};
using ShareCycle = LM<share_dims, Assembly<Router<Share<Cycle<2>>>, ModuleSet<MHA<2>, FFN<2>>, K<1>, H<5>>>;
using ShareAll = LM<share_dims, Assembly<Router<Share<All>>, ModuleSet<MHA<1>, FFN<1>>, K<1>, H<3>>>;
// MoEUT (issue 14): SwitchHead + σ-MoE under layer grouping, rotary positions; the §3 recipe's shapes at
// small_dims (1 head of 32, 2 value/output experts per head, 5 σ-MoE experts of 128, top-1; the recipe's 1%
// parameter match is out of reach at this size), and a pre-LayerNorm AABB configuration with two heads and
// top-2 σ-MoE.
using MoEUTSmall = LM<with_rope(small_dims), MoEUTStack<4, 2, SwitchHead<1, 2, 2, 32>, SigmaMoE<5, 1, 128>>>;
using MoEUTPreSmall = LM<with_rope(small_dims), MoEUTStack<4, 2, SwitchHead<2, 3, 2, 16, PreNorm>,
                                                           SigmaMoE<6, 2, 32, PreNorm>, AABB>>;
// ModuleFormer (issue 15): MoA (stick-breaking heads over shared K/V, MLP router) + SMoE, no positions, and
// the same with inserted modules and the routing regularisation.
using MFSmall = LM<without_positions(small_dims), ModuleFormer<2, MoA<4, 2, 16, 8>, SMoE<4, 2, 32, 8>>>;
using MFInsertedSmall =
    LM<without_positions(small_dims), ModuleFormerSpec<2, MoA<3, 2, 16, 8>, SMoE<3, 1, 32, 8>>::inserted<1, 2, std::ratio<1, 10>>::type>;
using ShareMap = LM<share_dims, Chunked<Layer, Assembly<Router<Share<Map<0, 1, 1, 0>>>, ModuleSet<MHA<2>, FFN<2>>, K<1>, H<4>>>>;

}  // namespace mom::test::small_models

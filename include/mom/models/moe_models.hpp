#pragma once
// Mixture-of-Experts configurations (MoM paper §3.5, eq. (11); issue 6) as types:
//
//   MoEStack<L, E, k>        L layers, E experts per layer, top-k (Mixtral: E = 8, k = 2)
//     = Assembly<Router<TopK<Softmax>>, ModuleSet<MHA<L>, Experts<FFN, E, PerStep>>, K<k>, H<L>, phi::MoE>
//   MoEShareStack<L, E, k>   one set of E experts shared by all L layers (MoE(share); E = L has the
//                            dense model's FFN parameters, under the dense model's names)
//     = Assembly<Router<TopK<Softmax>>, ModuleSet<MHA<L>, FFN<E>>, K<k>, H<L>, phi::MoE>
//   MoDEIntegrated<L, E, k>  MoDE, integrated (MoD paper §4.3): SKIP, a no-op expert, among each
//                            layer's E experts
//     = Assembly<Router<TopK<Softmax>>, ModuleSet<MHA<L>, Experts<FFN, E, PerStep>, Skip>, K<k>, H<L>, phi::MoE>
//   MoDEStaged<L, E, k>      MoDE, staged (MoD paper §4.3): MoD routing before MoE routing; each layer's FFN
//                            is an MoE step (E experts, top-k), every 2nd layer runs only the top-C/seq
//                            (12.5%) of each sequence (assembly/depth.hpp); the other layers run MoE densely
//     = Assembly<Router<BlockChoice<Capacity<1, 8>, Every<2>>>, ModuleSet<MHA<L>, Experts<FFN, E, PerStep>, Skip>,
//                K<k>, H<L>, phi::LayerSkip>
//   ExpertChoiceMoEStack<L, E, p, q>  expert-choice MoE (arXiv 2202.09368): each layer's E experts take their top-c
//                            tokens of the batch (capacity factor p/q: experts per token on average)
//     = Assembly<Router<TopC<Softmax>, CapacityFactor<p, q>>, ModuleSet<MHA<L>, Experts<FFN, E, PerStep>>, K<E>, H<L>,
//                phi::MoE>
//   DeepSeekMoEStack<L, Ns, Nr, kr, m, Options...>   DeepSeekMoE (arXiv 2401.06066; V3 2412.19437): per layer Ns
//                            shared and Nr routed fine-grained experts of width d_ff/m, top-kr routed by sigmoid
//                            affinity with the auxiliary-loss-free selection bias (routers/affinity.hpp)
//     = Assembly<Router<TopK<Sigmoid>, SharedExperts<Ns>, Options...>,
//                ModuleSet<MHA<L>, Experts<Segmented<m>::family, Ns + Nr, PerStep>>, K<Ns + kr>, H<L>, phi::MoE>
#include "mom/assembly/depth.hpp"
#include "mom/assembly/moe.hpp"
#include "mom/models/lm.hpp"
#include "mom/modules/ffn.hpp"
#include "mom/routers/topk.hpp"

namespace mom {

template <int L, int E, int k = 2, class R = Router<TopK<Softmax>>>
using MoEStack = Assembly<R, ModuleSet<MHA<L>, Experts<FFN, E, PerStep>>, K<k>, H<L>, phi::MoE>;
template <int L, int E, int k = 2, class R = Router<TopK<Softmax>>>
using MoEShareStack = Assembly<R, ModuleSet<MHA<L>, FFN<E>>, K<k>, H<L>, phi::MoE>;
template <int L, int E, int k = 2, class R = Router<TopK<Softmax>>>
using MoDEIntegrated = Assembly<R, ModuleSet<MHA<L>, Experts<FFN, E, PerStep>, Skip>, K<k>, H<L>, phi::MoE>;

template <int L, int E, int k = 2, long long p = 1, long long q = 8, int every = 2, class... Options>
using MoDEStaged = Assembly<Router<BlockChoice<Capacity<p, q>, Every<every>, Options...>>,
                            ModuleSet<MHA<L>, Experts<FFN, E, PerStep>, Skip>, K<k>, H<L>, phi::LayerSkip>;

// Expert-choice MoE (arXiv 2202.09368): every layer's E experts each take their top-c tokens of the batch,
// c = ⌊n · p/q / E⌋ (a token gets p/q experts on average, 0 .. E of them).
template <int L, int E, long long p = 2, long long q = 1>
using ExpertChoiceMoEStack = Assembly<Router<TopC<Softmax>, CapacityFactor<p, q>>,
                                      ModuleSet<MHA<L>, Experts<FFN, E, PerStep>>, K<E>, H<L>, phi::MoE>;

template <int L, int Ns, int Nr, int kr, int m, class... Options>
using DeepSeekMoEStack = Assembly<Router<TopK<Sigmoid>, SharedExperts<Ns>, Options...>,
                                  ModuleSet<MHA<L>, Experts<Segmented<m>::template family, Ns + Nr, PerStep>>,
                                  K<Ns + kr>, H<L>, phi::MoE>;

}  // namespace mom

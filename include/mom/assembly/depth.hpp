#pragma once
// phi::LayerSkip (MoM paper eq. (9)) and the executor of the depth routers (routers/depth.hpp):
//
//   Mixture-of-Depths   Assembly<Router<BlockChoice<Capacity<1,8>, Every<2>>>, ModuleSet<Block<L>, Skip>,
//                                K<1>, H<L>, phi::LayerSkip>
//   layer-skip          Assembly<Router<Skipping<LinearGate>>, ModuleSet<MHA<L>, FFN<L>, Skip>, K<1>, H<L>,
//                                phi::LayerSkip>
//   early-exit          Assembly<Router<Skipping<LinearGate, EarlyExit>>, ... the same>
//   MoDE staged         Assembly<Router<BlockChoice<Capacity<1,8>, Every<2>>>,
//                                ModuleSet<MHA<L>, Experts<FFN, E, PerStep>, Skip>, K<k>, H<L>, phi::LayerSkip>
//
// MoDE staged (MoD paper §4.3: MoD routing before the MoE routing): with Experts<FFN, E, PerStep> in
// the set, every layer's FFN is an MoE step (MoEStep, assembly/moe.hpp: its own softmax router, top-k
// of layer h's E experts, K<k> = that k) over the rows the layer runs: all n tokens in an unrouted
// layer, the batch·C selected ones in a routed layer (the MoD router picks the tokens, then the MoE
// router picks their experts). Each MoE step's Switch balance loss is added to Plan::aux. Skip is
// the MoD skip (the block a token does not enter), not a no-op expert. Parameters: the module set
// (as MoEStack<L, E, k>), the L MoE routers (h.<i>.router.*, as MoEStack), then the MoD routers
// (h.<i>.mod_router.w): a MoEStack checkpoint maps one to one.
//
// Step h runs layer h (attention then FFN, each pre-norm and residual) on the tokens the criterion
// keeps and SKIP (x ↦ x) on the others:
//   φ_layer-skip(M, R, x_h) = m_h if c_skip(h) = 1, m^S if c_skip(h) = 0                       eq. (9)
// A routed layer h, with S the tokens it runs (in their original order) and w_i their weight:
//   x̃ = x[S]; u = x̃ + Attn_h(x̃) (attention among S only); y = u + FFN_h(u); f(x̃) = y − x̃
//   x_{h+1,i} = x_{h,i} + w_i · f_i(x̃)  for i ∈ S,   x_{h+1,i} = x_{h,i}  otherwise     (MoD eq. (1))
// so the residual is counted once. Positions enter only through the input embedding (wpe), so the
// selected tokens keep their original positions; nothing is re-indexed or re-embedded.
//   BlockChoice   S = the top-C of r_i = wᵀx_i in every sequence (C = ⌊capacity·seq⌋, exactly C per
//                  sequence), w_i = r_i (or 1: Weighting<Unit>). Since every sequence gives C rows,
//                  the gathered rows are `batch` sequences of C tokens and the block runs as a plain
//                  dense block over (batch, C) (ordinary causal attention, no per-token work).
//   Skipping       S = {i : σ(wᵀx_i + b) > ½} (and, with EarlyExit, i ran every earlier routed layer),
//                  w_i = σ(wᵀx_i + b); a variable number of tokens per sequence, so attention is the
//                  packed op over the running tokens (queries and keys: S's flat indices).
// Unrouted layers (Every<k>) run every token with weight 1, exactly as Dense<L>.
//
// Auxiliary losses (their gradients in backward):
//   CausalAux<p,q>           p/q · mean_i BCE(σ(r_i), t_i), t_i = [i ∈ top-C]            (MoD §3.5, method 1)
//   CausalPredictor<w,p,q>   p/q · mean_i BCE(σ(P(sg(x_i))), t_i), P: d → w → 1 (ReLU)      (method 2)
//   RunTarget<p,q,c,e>       c/e · (mean_i σ(wᵀx_i + b) − p/q)²  (layer-skip: hold the expected fraction run)
//   SkipCost<p,q>            p/q · mean_i σ(wᵀx_i + b)           (layer-skip: a plain compute cost)
// CausalAux, RunTarget and SkipCost are part of the model loss (Plan::aux). The predictor's loss is not: its
// inputs are stop-gradient, so it is a separate objective whose gradient reaches the predictor only
// (no scalar of the model has that gradient); backward adds it, read_causal reports its value.
// The prediction accuracy of the causal decision (r_i > 0 or P(x_i) > 0 against t_i) is kept per
// routed block for evaluation (read_causal).
#include <type_traits>

#include "mom/assembly/assembly.hpp"
#include "mom/assembly/chunked.hpp"
#include "mom/assembly/depth_base.hpp"
#include "mom/assembly/depth_packed.hpp"
#include "mom/assembly/depth_selected.hpp"
#include "mom/routers/depth.hpp"

namespace mom {

// MoD trains with exactly C tokens per sequence (SelectedBlocks); at inference with CausalRouting it
// runs a variable number, as skip criteria do (PackedBlocks).
template <class... Os, class A, Dims D>
struct Executor<BlockChoice<Os...>, A, D>
    : std::conditional_t<BlockChoice<Os...>::config::causal_routing, detail::PackedBlocks<BlockChoice<Os...>, A, D>,
                         detail::SelectedBlocks<BlockChoice<Os...>, A, D>> {};
template <class... Os, class A, Dims D>
struct Executor<Skipping<Os...>, A, D> : detail::PackedBlocks<Skipping<Os...>, A, D> {};

// Mixture-of-Depths over L blocks: capacity p/q, every k-th block routed (the paper's best: 12.5%,
// every other block), router options appended (e.g. CausalAux<>, CausalPredictor<>).
template <int L, long long p = 1, long long q = 8, int k = 2, class... Options>
using MoD = Assembly<Router<BlockChoice<Capacity<p, q>, Every<k>, Options...>>, ModuleSet<Block<L>, Skip>, K<1>, H<L>,
                     phi::LayerSkip>;
// The type autoregressive sampling runs for a model trained with a causal-sampling method (MoD §3.5): the
// same parameters, routed by the causal decision (CausalRouting); every other architecture is itself.
template <class Arch>
struct causal_sampling_arch {
  using type = Arch;
};
template <class... Os, class M, class Kn, class Hn>
  requires(BlockChoice<Os...>::config::causal_aux || BlockChoice<Os...>::config::predictor) &&
          (!BlockChoice<Os...>::config::causal_routing)
struct causal_sampling_arch<Assembly<Router<BlockChoice<Os...>>, M, Kn, Hn, phi::LayerSkip>> {
  using type = Assembly<Router<BlockChoice<Os..., CausalRouting>>, M, Kn, Hn, phi::LayerSkip>;
};
template <class... Ps>
struct causal_sampling_arch<Chunked<Ps...>> {
  using type = Chunked<typename causal_sampling_arch<Ps>::type...>;
};

// Layer-skip and early-exit over L layers with a learned per-token gate.
template <int L, class... Options>
using LayerSkipping = Assembly<Router<Skipping<LinearGate, Options...>>, ModuleSet<MHA<L>, FFN<L>, Skip>, K<1>, H<L>,
                               phi::LayerSkip>;
// Early exit attends to the exited tokens (AttendToSkipped): their state is copied up unchanged, and later
// layers compute their keys/values from it, as depth-adaptive transformers and CALM do; otherwise an
// exited token would vanish from every later token's context.
template <int L, class... Options>
using EarlyExiting = Assembly<Router<Skipping<LinearGate, EarlyExit, AttendToSkipped, Options...>>,
                              ModuleSet<MHA<L>, FFN<L>, Skip>, K<1>, H<L>, phi::LayerSkip>;

}  // namespace mom

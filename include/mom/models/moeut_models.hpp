#pragma once
// MoEUT (Csordás et al. 2024, arXiv 2405.16039) as a type: σ-MoE feed-forward (§2.1, SigmaMoE) and
// SwitchHead attention (§2.2, SwitchHead) in G non-shared layers stacked recurrently to depth L (layer
// grouping, §2.3: parameter sharing eq. (10) of the MoM paper with c(h) = h mod G, Router<Share<Cycle<G>>>),
// peri-LayerNorm (§2.4) by default. In the MoM tuple: M = {G SwitchHead, G σ-MoE modules}, R = c_share,
// K = 1, H = L; the experts inside each module are chosen by its own sigmoid selection.
//
//   MoEUTStack<L, G, Attn, Ffn, Order>   the assembly for given module types (any SwitchHead / SigmaMoE
//                                        configuration; Order ABAB = Cycle<G>, AABB = Blocks<G>)
//   MoEUTRecipe<D, L, G, Norm, Order>    the paper's §3 recipe for the dense baseline LM<D, Dense<L>>:
//       H/4 heads of 2·d_head, K_A = 2, d_expert = 128, K = 2·d_model / d_expert, and N_A, N_E chosen so
//       that the non-embedding parameters match the dense model's (within 1%, static_assert) with 10-15%
//       of them in attention (N_A: the smallest with >= 10%; with G = L a single expert per head already
//       exceeds 15%, so N_A = 1, K_A = 1 there: the non-shared σ-MoE baseline's attention)
//   MoEUT<D, L, G = 2, Norm = PeriNorm, Order = ABAB>   = MoEUTRecipe<...>::type (Norm: PeriNorm, PreNorm,
//       PostNorm: modules/norm_scheme.hpp)
// The recipe's dims should use rotary positions (with_rope(dims)), as the paper does.
#include <cstdlib>
#include <type_traits>

#include "mom/assembly/assembly.hpp"
#include "mom/assembly/share.hpp"
#include "mom/modules/ffn.hpp"
#include "mom/modules/mha.hpp"
#include "mom/modules/module_set.hpp"
#include "mom/modules/sigma_moe.hpp"
#include "mom/modules/switch_head.hpp"
#include "mom/routers/share.hpp"

namespace mom {

// The order of the G layers of a group over the L steps (§2.3, Fig. 6).
struct ABAB {};  // c(h) = h mod G: the group repeated (MoEUT)
struct AABB {};  // c(h) = h / (L / G): each layer repeated in a block

template <int L, int G, class Attn, class Ffn, class Order = ABAB>
using MoEUTStack = Assembly<Router<Share<std::conditional_t<std::is_same_v<Order, AABB>, Blocks<G>, Cycle<G>>>>,
                            ModuleSet<MHA<G, Attn::template type>, FFN<G, Ffn::template type>>, K<1>, H<L>>;

template <Dims D, int L, int G = 2, class Norm = PeriNorm, class Order = ABAB>
struct MoEUTRecipe {
  static_assert(L >= 1 && G >= 1 && L % G == 0, "mom::MoEUT<dims, L, G>: the group size G must divide the depth L");
  static_assert(std::is_same_v<Order, ABAB> || std::is_same_v<Order, AABB>, "mom::MoEUT: the order must be ABAB or AABB");
  static_assert(D.heads % 4 == 0, "mom::MoEUT<dims, L, G>: the dense baseline's heads must be a multiple of 4 (MoEUT has H/4)");
  static_assert(2 * D.d_model % 128 == 0, "mom::MoEUT<dims, L, G>: d_model must be a multiple of 64 (K = 2·d_model / 128)");

  // After a failed check the numbers below are stand-ins, so that one mistake gives one message.
  static constexpr bool valid = L >= 1 && G >= 1 && L % G == 0 && D.heads % 4 == 0 && 2 * D.d_model % 128 == 0;
  static constexpr index_t d = valid ? D.d_model : 64;
  static constexpr int heads = valid ? int(D.heads / 4) : 1, d_head = valid ? int(2 * D.head_dim()) : 2, d_expert = 128;
  static constexpr int k = int(2 * d / d_expert);
  // The dense baseline's non-embedding parameters (L layers of attention + FFN), and one MoEUT layer's.
  static constexpr index_t dense =
      valid ? L * (modules::Attention<D>::params + modules::FeedForward<D>::params) : 10 * (2 * d + 2 * heads * d_head * d);
  static constexpr index_t budget = valid ? dense / G : dense;  // per layer of the group
  static constexpr index_t attention(int na) { return 2 * d + 2 * heads * d_head * d + 2 * heads * na * d * (1 + d_head); }
  static constexpr int n_a = [] {
    int na = 1;
    while (G * attention(na) * 10 < dense) ++na;
    return na;
  }();
  static constexpr int k_a = n_a < 2 ? n_a : 2;
  static constexpr index_t expert = d + 2 * d_expert * d;  // its selection row, W₁ and W₂
  static constexpr int n_e = valid ? int((budget - attention(n_a) - 2 * d + expert / 2) / expert) : k;

  using Attn = SwitchHead<heads, n_a, k_a, d_head, Norm>;
  using Ffn = SigmaMoE<n_e, k, d_expert, Norm>;
  using type = MoEUTStack<L, G, Attn, Ffn, Order>;

  static constexpr index_t params =
      G * (Attn::template type<D>::params + Ffn::template type<D>::params);  // non-embedding
  static constexpr double attention_share = double(G * Attn::template type<D>::params) / double(params);
  static_assert(!valid || k <= n_e, "mom::MoEUT: the recipe gives fewer experts than K: the dense baseline is too small");
  static_assert(!valid || 100 * (params > dense ? params - dense : dense - params) <= dense,
                "mom::MoEUT: the recipe does not match the dense baseline's parameters within 1%");
  static_assert(!valid || n_a == 1 || 20 * G * Attn::template type<D>::params <= 3 * params,
                "mom::MoEUT: the recipe puts more than 15% of the parameters in attention");
};

template <Dims D, int L, int G = 2, class Norm = PeriNorm, class Order = ABAB>
using MoEUT = typename MoEUTRecipe<D, L, G, Norm, Order>::type;

}  // namespace mom

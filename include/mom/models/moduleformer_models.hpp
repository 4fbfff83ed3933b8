#pragma once
// ModuleFormer (Shen et al., arXiv 2306.04640) as a type: every layer a mixture of stick-breaking
// attention heads (MoA, §3.2, modules/moa.hpp) and a sparse mixture of feed-forward experts (SMoE, §3.1,
// modules/smoe.hpp), each with its own MLP router (modules/mlp_gate.hpp) and the mutual-information loss
// (§4.1, eq. (7)); no position embedding (without_positions(dims)). In the MoM tuple: M = {L MoA, L SMoE},
// R = the identity route (Router<Sequential>), K = 1, H = L; the heads and experts inside each module are
// chosen by its own router.
//
//   ModuleFormer<L, MoA<N_att, k, D_att>, SMoE<N_ffd, k, D_ffd>>   the assembly (= ModuleFormerSpec<...>::type)
//   ModuleFormerSpec<L, Attn, Ffn>      the same with the module manipulations of §4 as types:
//     ::inserted<N_att_new, N_ffd_new, RoutReg>   §4.3: N_new modules more per layer (A' rows, new heads
//                                                 and experts in their own tensors; λ‖A'‖² when RoutReg > 0)
//     ::with_loss<LoadConcentration<γ>>          §4.2: the fine-tuning loss H(m) instead of the MI loss
//     ::compacted<M_att, M_ffd>                  §5.3: M heads / experts per layer (pruning's compaction)
// The weights move between these types with models/module_surgery.hpp (insert_modules, prune, compact).
#include <ratio>

#include "mom/assembly/assembly.hpp"
#include "mom/modules/ffn.hpp"
#include "mom/modules/mha.hpp"
#include "mom/modules/moa.hpp"
#include "mom/modules/module_set.hpp"
#include "mom/modules/smoe.hpp"

namespace mom {

template <int L, class Attn, class Ffn>
struct ModuleFormerSpec {
  static_assert(L >= 1, "mom::ModuleFormer<L, Attn, Ffn>: L (layers) must be >= 1");
  using attention = Attn;
  using ffn = Ffn;
  using type = Assembly<Router<Sequential>, ModuleSet<MHA<L, Attn::template type>, FFN<L, Ffn::template type>>, K<1>, H<L>>;
  template <int NA, int NF, class RoutReg = std::ratio<0>>
  using inserted = ModuleFormerSpec<L, typename Attn::template with_inserted<NA, RoutReg>,
                                    typename Ffn::template with_inserted<NF, RoutReg>>;
  template <class Loss>
  using with_loss = ModuleFormerSpec<L, typename Attn::template with_loss<Loss>, typename Ffn::template with_loss<Loss>>;
  template <int MA, int MF>
  using compacted = ModuleFormerSpec<L, typename Attn::template with_count<MA>, typename Ffn::template with_count<MF>>;
  // Total and active (used by one token) parameters of LM<D, type> (Table 1's two columns): the embeddings,
  // the final LayerNorm, and per layer the modules' own figures.
  template <Dims D>
  static constexpr index_t embedding_params = D.vocab * D.d_model + (D.learned_positions() ? D.context * D.d_model : 0) + 2 * D.d_model;
  template <Dims D>
  static constexpr index_t active_params = embedding_params<D> + L * (Attn::template type<D>::active_params +
                                                                       Ffn::template type<D>::active_params);
  template <Dims D>
  static constexpr index_t total_params = embedding_params<D> + L * (Attn::template type<D>::params + Ffn::template type<D>::params);
};

template <int L, class Attn, class Ffn>
using ModuleFormer = typename ModuleFormerSpec<L, Attn, Ffn>::type;

}  // namespace mom

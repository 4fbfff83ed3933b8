#pragma once
// Assembling functions phi (paper §3.2, eq. (3)). phi::MoM is the general one: the attention
// assembly of eq. (5), the FFN assembly of eq. (6), each round adding to the residual stream
// as in eq. (4). The special cases of §3.5 (layer-skip eq. (9), parameter sharing eq. (10),
// MoE eq. (11)) arrive with later issues as further tags.
#include "mom/core/meta.hpp"
#include "mom/modules/module_set.hpp"

namespace mom::phi {

struct MoM {
  static constexpr bool is_phi = true;
  // K modules are chosen among the N_X computing modules of one type plus SKIP, for X = A and
  // X = F, so K may not exceed either count.
  template <class Set, int k, int h>
  struct Verify {
    static_assert((Set::n_attention == 0 || k <= Set::selectable_attention) &&
                      (Set::n_ffn == 0 || k <= Set::selectable_ffn),
                  "mom::Assembly: K is larger than the number of selectable modules (MHA<N> or FFN<N>, plus Skip)");
    static constexpr bool ok =
        (Set::n_attention == 0 || k <= Set::selectable_attention) && (Set::n_ffn == 0 || k <= Set::selectable_ffn);
  };
};

// φ_MoE (paper eq. (11)): step h runs attention module h densely (as a vanilla layer) and
// φ_MoM's FFN assembly over the experts M_h of step h (Experts<FFN, E, PerStep>: layer h's own E;
// FFN<E>: the E experts every step shares), K picked per token, SKIP a no-op expert (MoDE
// integrated). Executed by Router<TopK<...>> (assembly/moe.hpp).
struct MoE {
  static constexpr bool is_phi = true;
  template <class Set, int k, int h>
  struct Verify {
    static constexpr bool steps_ok = Set::n_attention == 0 || h == Set::n_attention;
    static constexpr bool k_ok = Set::ffn_choices == 0 || k <= Set::selectable_ffn;
    static_assert(steps_ok,
                  "mom::phi::MoE runs attention module h at step h: H must equal the number of MHA modules, as in "
                  "Assembly<Router<TopK<Softmax>>, ModuleSet<MHA<L>, Experts<FFN, E, PerStep>>, K<2>, H<L>, phi::MoE>");
    static_assert(!steps_ok || k_ok,
                  "mom::phi::MoE: K is larger than the number of experts per step (E of FFN<E> or "
                  "Experts<FFN, E, PerStep>, plus Skip)");
    static constexpr bool ok = steps_ok && k_ok;
  };
};

}  // namespace mom::phi

namespace mom {
template <class P>
concept AssemblingFunction = requires { requires P::is_phi; };
}  // namespace mom

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

}  // namespace mom::phi

namespace mom {
template <class P>
concept AssemblingFunction = requires { requires P::is_phi; };
}  // namespace mom

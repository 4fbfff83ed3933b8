#pragma once
// Router<Sequential>: step h picks attention module h and FFN module h with weight 1 and
// never SKIP. With K = 1 and H = L over ModuleSet<MHA<L>, FFN<L>> the assembled model is the
// vanilla L-layer transformer (paper §3.5: the dense model is the MoM special case with a
// fixed router).
#include "mom/routers/router.hpp"

namespace mom {

struct Sequential {
  static constexpr bool is_router_policy = true;
  static constexpr std::string_view name = "Sequential";

  template <class Set, int k, int h>
  struct Drives {
    static_assert(k == 1, "mom::Router<Sequential> picks exactly one module per step: use K<1>");
    static_assert(!Set::experts_per_step,
                  "mom::Router<Sequential> runs one FFN per step: Experts<FFN, E, PerStep> needs Router<TopK<Softmax>> "
                  "with phi::MoE");
    static_assert(h == Set::n_attention && h == Set::n_ffn,
                  "mom::Router<Sequential> runs module h at step h: H must equal the number of MHA and of FFN "
                  "modules, as in Assembly<Router<Sequential>, ModuleSet<MHA<L>, FFN<L>>, K<1>, H<L>>");
    static_assert(!Set::has_skip, "mom::Router<Sequential> never picks Skip: remove Skip from the ModuleSet");
    static constexpr bool ok = k == 1 && !Set::experts_per_step && h == Set::n_attention && h == Set::n_ffn && !Set::has_skip;
  };
};

}  // namespace mom

// The GRU router of the paper (§3.3, eqs. (7)-(8)).
#include "mom/routers/gru.hpp"

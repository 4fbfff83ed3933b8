#pragma once
// Assembling functions phi (paper §3.2, eq. (3)), all of them: phi::MoM is the general one: the
// attention assembly of eq. (5), the FFN assembly of eq. (6), each round adding to the residual stream
// as in eq. (4); phi::MoMRoutedKV the same with routed keys/values; phi::MoE eq. (11); phi::LayerSkip
// eq. (9); phi::Recursion Mixture-of-Recursions' eq. (2). Parameter sharing (eq. (10)) is phi::MoM driven by
// Router<Share<P>>.
// A phi selects code: the executor of an Assembly is chosen by (router policy, phi) (assembly/), and
// each phi's Verify rejects the K and H it cannot assemble. `name` is what describe<> prints.
#include <concepts>

#include "mom/core/meta.hpp"
#include "mom/modules/module_set.hpp"

namespace mom::phi {

struct MoM {
  static constexpr bool is_phi = true;
  static constexpr const char* name = "phi::MoM";
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
  static constexpr const char* name = "phi::MoE";
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

// φ_MoM with each attention module's keys/values restricted to the tokens routed to it
// (assembly/gru.hpp, KeySource::Routed).
struct MoMRoutedKV : MoM {
  static constexpr const char* name = "phi::MoMRoutedKV";
};

// φ_layer-skip, eq. (9): step h runs layer h (its attention and FFN module) or SKIP.
struct LayerSkip {
  static constexpr bool is_phi = true;
  static constexpr const char* name = "phi::LayerSkip";
  template <class Set, int k, int h>
  struct Verify {
    // With per-step experts (MoDE staged) K is the MoE step's top-k among layer h's experts.
    static constexpr bool moe = Set::experts_per_step;
    static_assert(k == 1 || moe, "mom::phi::LayerSkip runs layer h or SKIP at step h: use K<1>");
    static_assert(!moe || k <= Set::ffn_choices,
                  "mom::phi::LayerSkip with Experts<FFN, E, PerStep> (MoDE staged): K<k> is the top-k of each "
                  "layer's E experts: k must be <= E");
    static constexpr bool k_ok = moe ? k <= Set::ffn_choices : k == 1;
    static_assert(!k_ok || Set::has_skip,
                  "mom::phi::LayerSkip needs Skip in the ModuleSet (the module a token that skips a layer takes), e.g. "
                  "ModuleSet<Block<L>, Skip>");
    static_assert(!(k_ok && Set::has_skip) || (h == Set::n_attention && (moe || h == Set::n_ffn)),
                  "mom::phi::LayerSkip runs layer h at step h: H must equal the number of layers (Block<L>, or MHA<L> "
                  "and FFN<L>)");
    static constexpr bool ok = k_ok && Set::has_skip && h == Set::n_attention && (moe || h == Set::n_ffn);
  };
};

// φ_recursion (Mixture-of-Recursions, arXiv 2507.10524 eq. (2)): step r applies the whole shared block
// (all B layers of Block<B>) to the tokens the router keeps at recursion r, SKIP (exit) to the others; H
// is the number of recursions N_r. Executed by Router<Recursion<...>> (assembly/recursion.hpp).
struct Recursion {
  static constexpr bool is_phi = true;
  static constexpr const char* name = "phi::Recursion";
  template <class Set, int k, int h>
  struct Verify {
    static_assert(k == 1, "mom::phi::Recursion applies the block or exits at every recursion: use K<1>");
    static_assert(k != 1 || (Set::has_block && Set::has_skip),
                  "mom::phi::Recursion recurses over one shared block and exits by SKIP: use ModuleSet<Block<B>, Skip>");
    static constexpr bool ok = k == 1 && Set::has_block && Set::has_skip;
  };
};

}  // namespace mom::phi

namespace mom {
template <class P>
concept AssemblingFunction = requires {
  requires P::is_phi;
  { P::name } -> std::convertible_to<const char*>;
};
}  // namespace mom

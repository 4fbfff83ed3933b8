#pragma once
// ModuleSet<Families...>: the paper's module set M (eq. (1)),
//   M = {m^A_i}_{i=1..N_A} ∪ {m^F_i}_{i=1..N_F} ∪ {m^S},
// written ModuleSet<MHA<N_A>, FFN<N_F>, Skip>. Storage order of the parameters: module
// index i = 0..depth-1, attention module i then FFN module i, each under the name "h.<i>",
// so a module set built from the L layers of a dense model keeps their names (warm start,
// paper §3.4). With Experts<FFN, E, PerStep> (Mixture-of-Experts, eq. (11)) layer i holds
// attention module i then its E experts "h.<i>.expert.<e>.*".
// Block<L> (Mixture-of-Depths) is L attention + FFN pairs with this very layout.
#include <algorithm>
#include <array>
#include <cstddef>
#include <type_traits>

#include "mom/core/meta.hpp"
#include "mom/modules/experts.hpp"
#include "mom/modules/block.hpp"
#include "mom/modules/ffn.hpp"
#include "mom/modules/mha.hpp"
#include "mom/modules/skip.hpp"

namespace mom {

namespace detail {
// Modules of role r that family F holds (Block<L> counts as L sequence and L token mixers).
template <class F, ModuleRole r>
constexpr int family_count() {
  if constexpr (ModuleFamily<F>) {
    const bool block_part = F::role == ModuleRole::Block && (r == ModuleRole::SequenceMixer || r == ModuleRole::TokenMixer);
    return F::role == r || block_part ? int{F::count} : 0;
  } else {
    return 0;
  }
}
template <class F, ModuleRole r>
constexpr int family_occurrences() {
  if constexpr (ModuleFamily<F>) {
    return F::role == r ? 1 : 0;
  } else {
    return 0;
  }
}
// A plain bool (not the concept) in static_asserts keeps the diagnostic to one line.
template <class F>
inline constexpr bool is_module_family = ModuleFamily<F>;

template <class F>
constexpr bool family_count_ok() {
  if constexpr (is_per_step_experts<F>) {
    return true;  // Experts checks its own E, with its own message
  } else if constexpr (ModuleFamily<F>) {
    return F::count >= 1;
  } else {
    return true;
  }
}
// N >= 1 for every family (Experts included), for `valid`.
template <class F>
constexpr bool family_nonempty() {
  if constexpr (ModuleFamily<F>) {
    return F::count >= 1;
  } else {
    return true;
  }
}

// The single-module types of a set: the family of role r (or Block<L>'s part), else Fallback.
struct NoModule {
  template <Dims D>
  using single = void;
};
template <ModuleRole r, class... Fs>
struct family_of {
  using type = NoModule;
};
template <ModuleRole r, class F, class... Fs>
struct family_of<r, F, Fs...> {
  using type = std::conditional_t<family_occurrences<F, r>() == 1, F, typename family_of<r, Fs...>::type>;
};
template <class F, Dims D, bool sequence>
struct single_of {
  using type = typename F::template single<D>;
};
template <class F, Dims D>
  requires(F::role == ModuleRole::Block)
struct single_of<F, D, true> {
  using type = typename F::template sequence_mixer<D>;
};
template <class F, Dims D>
  requires(F::role == ModuleRole::Block)
struct single_of<F, D, false> {
  using type = typename F::template token_mixer<D>;
};
}  // namespace detail

// The single-module types' contracts (plain bools keep a failed static_assert to one line).
template <class M>
inline constexpr bool is_sequence_mixer = SequenceMixer<M>;
template <class M>
inline constexpr bool is_routed_sequence_mixer = RoutedSequenceMixer<M>;
template <class M>
inline constexpr bool is_token_mixer = TokenMixer<M>;

template <class... Fs>
struct ModuleSet {
  static_assert(sizeof...(Fs) > 0, "mom::ModuleSet: the module set is empty");
  static_assert((detail::is_module_family<Fs> && ...), "mom::ModuleSet: every element must be a module family: MHA<N>, FFN<N> or Skip");
  static_assert((detail::family_count_ok<Fs>() && ...), "mom::ModuleSet: MHA<N> and FFN<N> need N >= 1");
  static_assert((0 + ... + detail::family_occurrences<Fs, ModuleRole::SequenceMixer>()) <= 1 &&
                    (0 + ... + detail::family_occurrences<Fs, ModuleRole::TokenMixer>()) <= 1 &&
                    (0 + ... + detail::family_occurrences<Fs, ModuleRole::Skip>()) <= 1,
                "mom::ModuleSet: each module kind (MHA<N>, FFN<N>, Skip) may appear at most once");
  static constexpr int n_block_families = (0 + ... + detail::family_occurrences<Fs, ModuleRole::Block>());
  static constexpr int n_computing_families =
      (0 + ... + (detail::family_occurrences<Fs, ModuleRole::SequenceMixer>() +
                  detail::family_occurrences<Fs, ModuleRole::TokenMixer>() +
                  detail::family_occurrences<Fs, ModuleRole::Block>()));
  static_assert(n_block_families == 0 || n_computing_families == 1,
                "mom::ModuleSet: Block<L> already holds L attention and L FFN modules: use it alone (with Skip), not "
                "beside MHA<N>, FFN<N> or another Block");

  // The elements are module families with N >= 1 (checked above); only then is "no computing
  // module" worth its own message.
  static constexpr bool families_ok = sizeof...(Fs) > 0 && (detail::is_module_family<Fs> && ...) &&
                                      (detail::family_count_ok<Fs>() && ...);
  static constexpr int n_computing =
      (0 + ... + (detail::family_count<Fs, ModuleRole::SequenceMixer>() + detail::family_count<Fs, ModuleRole::TokenMixer>()));
  static_assert(!families_ok || n_computing > 0,
                "mom::ModuleSet: needs at least one computing module (MHA<N> or FFN<N>), not only Skip");

  static constexpr bool valid =
      sizeof...(Fs) > 0 && n_computing > 0 && (ModuleFamily<Fs> && ...) && (detail::family_nonempty<Fs>() && ...) &&
      (0 + ... + detail::family_occurrences<Fs, ModuleRole::SequenceMixer>()) <= 1 &&
      (0 + ... + detail::family_occurrences<Fs, ModuleRole::TokenMixer>()) <= 1 &&
      (0 + ... + detail::family_occurrences<Fs, ModuleRole::Skip>()) <= 1 &&
      (n_block_families == 0 || n_computing_families == 1);

  static constexpr int n_attention = (0 + ... + detail::family_count<Fs, ModuleRole::SequenceMixer>());
  // Experts<FFN, E, PerStep>: E experts for each of the n_attention steps.
  static constexpr bool experts_per_step = (is_per_step_experts<Fs> || ...);
  // FFN modules one step chooses among: E per step, or the whole flat family FFN<N>.
  static constexpr int ffn_choices = (0 + ... + detail::family_count<Fs, ModuleRole::TokenMixer>());
  static constexpr int n_ffn = experts_per_step ? ffn_choices * n_attention : ffn_choices;
  static constexpr bool has_skip = (0 + ... + detail::family_count<Fs, ModuleRole::Skip>()) > 0;
  // ModuleSet<Block<L>, ...>: the same modules and layout as MHA<L>, FFN<L>, run as whole blocks.
  static constexpr bool has_block = n_block_families > 0;
  // Number of layer names the set's parameters occupy ("h.<base>" .. "h.<base+depth-1>").
  static constexpr int depth = experts_per_step ? n_attention : std::max(n_attention, n_ffn);
  // Modules a router can choose among for one module type, SKIP included (paper §3.1: an
  // (N_X + 1)-way distribution when SKIP is in the set).
  static constexpr int selectable_attention = n_attention + (has_skip ? 1 : 0);
  static constexpr int selectable_ffn = ffn_choices + (has_skip ? 1 : 0);
  // FFN modules stored under layer name i.
  static constexpr int ffn_in_layer(int i) {
    if (experts_per_step) return i < n_attention ? ffn_choices : 0;
    return i < n_ffn ? 1 : 0;
  }

  // The single-module types (the families' `single`; a Block's parts). A role the set does not hold
  // gives GPT-2's module, which nothing then runs.
  using sequence_family = typename detail::family_of<has_block ? ModuleRole::Block : ModuleRole::SequenceMixer, Fs...>::type;
  using token_family = typename detail::family_of<has_block ? ModuleRole::Block : ModuleRole::TokenMixer, Fs...>::type;
  template <Dims D>
  using attention = std::conditional_t<std::is_same_v<sequence_family, detail::NoModule>, modules::Attention<D>,
                                       typename detail::single_of<sequence_family, D, true>::type>;
  template <Dims D>
  using ffn = std::conditional_t<std::is_same_v<token_family, detail::NoModule>, modules::FeedForward<D>,
                                 typename detail::single_of<token_family, D, false>::type>;
  // The sequence mixer as the routed executors use it (over row groups). When it is not a
  // RoutedSequenceMixer, their check (VerifyRoutedSequenceMixer) has fired and GPT-2's attention
  // stands in, so that one mistake gives one message.
  template <Dims D>
  using routed_attention =
      std::conditional_t<is_routed_sequence_mixer<attention<D>>, attention<D>, modules::Attention<D>>;

  // The modules' contracts at dims D (modules/module.hpp): instantiating Verify fires a static_assert
  // naming the first missing member of a module that lacks one.
  template <Dims D>
  struct Verify {
    static_assert(sizeof(VerifyModule<attention<D>>) > 0 && sizeof(VerifyModule<ffn<D>>) > 0);
    static constexpr bool ok = is_sequence_mixer<attention<D>> && is_token_mixer<ffn<D>>;
  };

  template <Dims D>
  static constexpr std::size_t tensor_count = std::size_t(n_attention) * module_tensor_count<attention<D>> +
                                              std::size_t(n_ffn) * module_tensor_count<ffn<D>>;

  template <Dims D>
  static constexpr index_t params = n_attention * attention<D>::params + n_ffn * ffn<D>::params;

  // Offset of attention / FFN module i inside the set's parameter block (storage order above).
  template <Dims D>
  static constexpr index_t attention_offset(int i) {
    index_t at = 0;
    for (int j = 0; j < i; ++j) at += (j < n_attention ? attention<D>::params : 0) + ffn_in_layer(j) * ffn<D>::params;
    return at;
  }
  // FFN module i (with per-step experts: expert i % E of layer i / E).
  template <Dims D>
  static constexpr index_t ffn_offset(int i) {
    const int layer = experts_per_step ? i / ffn_choices : i, e = experts_per_step ? i % ffn_choices : 0;
    return attention_offset<D>(layer) + (layer < n_attention ? attention<D>::params : 0) + e * ffn<D>::params;
  }

  // Writes the set's tensor specs (storage order) to out[0 .. tensor_count).
  template <Dims D>
  static constexpr void specs(TensorSpec* out, index_t layer_base) {
    for (int i = 0; i < depth; ++i) {
      if (i < n_attention)
        for (const auto& t : attention<D>::tensors(layer_base + i)) *out++ = t;
      for (int e = 0; e < ffn_in_layer(i); ++e)
        for (auto t : ffn<D>::tensors(layer_base + i)) {
          if (experts_per_step) t.expert = e;
          *out++ = t;
        }
    }
  }
};

template <class T>
inline constexpr bool is_module_set = false;
template <class... Fs>
inline constexpr bool is_module_set<ModuleSet<Fs...>> = true;

}  // namespace mom

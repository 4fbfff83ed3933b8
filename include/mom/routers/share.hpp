#pragma once
// Router<Share<Policy>>: parameter sharing across assembly steps (MoM paper §3.5, eq. (10)),
//   phi_parameter-sharing(M, R^X, x_h) = m^X_{c_share(h)},   c_share : i ↦ j  (j ≤ i),
// over ModuleSet<MHA<G>, FFN<G>> with K<1>, H<L>: step h runs attention module c(h), then FFN
// module c(h), each with weight 1 (the dense residual update of eq. (4)); the G module pairs are
// stored once and reused at every step that maps to them. Policies give c:
//   Cycle<G>     c(h) = h mod G           ABAB… (MoEUT's layer grouping, arXiv 2405.16039 §2.3)
//   All          c(h) = 0                 one pair for every step (ALBERT, Universal Transformer)
//   Blocks<G>    c(h) = h / (H / G)       AABB… (MoEUT's "AABB" ablation, for comparison)
//   Map<j0, j1, …>  c(h) = j_h            any c_share, one entry per step
// Share<Cycle<L>> over L pairs with H<L> is Dense<L> (c(h) = h): the same layout and results.
//
// Modules are numbered in the order of their first use: module j is first used after module
// j-1 (c(i) ≤ max_{i' < i} c(i') + 1, c(0) = 0). Identifying module j with the step s_j of its
// first use, c_share(i) = s_{c(i)} ≤ i, which is eq. (10)'s j ≤ i; an entry j > i is a map that
// "points forward" (step i would use a module owned by a later step). Numbering by first use
// also keeps the parameter layout in step order (module j is named h.<base + j>).
#include <array>
#include <concepts>
#include <string>
#include <string_view>

#include "mom/core/meta.hpp"
#include "mom/routers/router.hpp"

namespace mom {

// ---- sharing policies: c(h) for step h of `steps` ---------------------------------------------

template <int G>
struct Cycle {
  static constexpr bool is_sharing_policy = true;
  static constexpr int group = G;
  static constexpr int module(int step, int /*steps*/) { return G > 0 ? step % G : 0; }
  static std::string name() { return "Cycle<" + std::to_string(G) + ">"; }
};

struct All {
  static constexpr bool is_sharing_policy = true;
  static constexpr int group = 1;
  static constexpr int module(int /*step*/, int /*steps*/) { return 0; }
  static std::string name() { return "All"; }
};

template <int G>
struct Blocks {
  static constexpr bool is_sharing_policy = true;
  static constexpr int group = G;
  static constexpr int module(int step, int steps) {
    const int block = G > 0 ? steps / G : 0;
    return block > 0 ? step / block : 0;
  }
  static std::string name() { return "Blocks<" + std::to_string(G) + ">"; }
};

template <int... js>
struct Map {
  static constexpr bool is_sharing_policy = true;
  static constexpr int length = int(sizeof...(js));
  static constexpr std::array<int, sizeof...(js)> entries{js...};
  static constexpr int module(int step, int /*steps*/) {
    return step < length ? entries[static_cast<std::size_t>(step)] : 0;
  }
  static std::string name() {
    std::string s = "Map<";
    ((s += std::to_string(js) + ", "), ...);
    if (length > 0) s.resize(s.size() - 2);
    return s + ">";
  }
};

template <class P>
concept SharingPolicy = requires {
  requires P::is_sharing_policy;
  { P::module(0, 1) } -> std::convertible_to<int>;
};

namespace detail {
template <class P>
inline constexpr bool is_sharing_policy = SharingPolicy<P>;

template <class P>
struct sharing_kind {
  static constexpr bool cycle = false, all = false, blocks = false, map = false;
};
template <int G>
struct sharing_kind<Cycle<G>> {
  static constexpr bool cycle = true, all = false, blocks = false, map = false;
};
template <>
struct sharing_kind<All> {
  static constexpr bool cycle = false, all = true, blocks = false, map = false;
};
template <int G>
struct sharing_kind<Blocks<G>> {
  static constexpr bool cycle = false, all = false, blocks = true, map = false;
};
template <int... js>
struct sharing_kind<Map<js...>> {
  static constexpr bool cycle = false, all = false, blocks = false, map = true;
};

// The first rule a (policy, module set, K, H) breaks, in the order the checks are reported,
// so that one mistake gives one message.
enum class ShareError {
  none,
  k_not_one,
  has_skip,
  uneven_pairs,
  group_below_one,
  group_exceeds_modules,
  cycle_longer_than_h,
  blocks_not_dividing,
  all_needs_one_pair,
  map_length,
  map_out_of_range,
  map_points_forward,
  map_not_first_use_order,
  module_unused,
};

template <class P, int n_attention, int n_ffn, bool has_skip, int k, int steps>
constexpr ShareError share_error() {
  if (k != 1) return ShareError::k_not_one;
  if (has_skip) return ShareError::has_skip;
  if (n_attention != n_ffn || n_attention < 1) return ShareError::uneven_pairs;
  constexpr int n = n_attention;
  using Kind = sharing_kind<P>;
  if constexpr (Kind::cycle || Kind::blocks) {
    if (P::group < 1) return ShareError::group_below_one;
    if (P::group > n) return ShareError::group_exceeds_modules;
    if (Kind::cycle && P::group > steps) return ShareError::cycle_longer_than_h;
    if (Kind::blocks && steps % P::group != 0) return ShareError::blocks_not_dividing;
  }
  if constexpr (Kind::all) {
    if (n != 1) return ShareError::all_needs_one_pair;
  }
  if constexpr (Kind::map) {
    if (P::length != steps) return ShareError::map_length;
  }
  // The rules of eq. (10) on the map itself (they hold by construction for Cycle / All / Blocks
  // once the checks above pass; for Map they are the checks).
  int highest = -1;  // the highest module used so far
  for (int i = 0; i < steps; ++i) {
    const int j = P::module(i, steps);
    if (j < 0 || j >= n) return ShareError::map_out_of_range;
    if (j > i) return ShareError::map_points_forward;
    if (j > highest + 1) return ShareError::map_not_first_use_order;
    highest = j > highest ? j : highest;
  }
  if (highest != n - 1) return ShareError::module_unused;
  return ShareError::none;
}
}  // namespace detail

template <class P>
struct Share {
  static_assert(detail::is_sharing_policy<P>,
                "mom::Share<P>: P must be a sharing policy: Cycle<G>, All, Blocks<G> or Map<j0, j1, ...>");
  static constexpr bool is_router_policy = true;
  static constexpr std::string_view name = "Share";
  using sharing = P;

  // c(h) for h = 0..steps-1: the module pair step h runs (eq. (10)'s c_share).
  template <int steps>
  static constexpr std::array<int, steps> step_map() {
    std::array<int, steps> c{};
    if constexpr (detail::is_sharing_policy<P>)
      for (int h = 0; h < steps; ++h) c[std::size_t(h)] = P::module(h, steps);
    return c;
  }
  static std::string label() {
    if constexpr (detail::is_sharing_policy<P>) return "Share<" + P::name() + ">";
    else return "Share<?>";
  }

  template <class Set, int k, int h>
  struct Drives {
    using E = detail::ShareError;
    static constexpr E error = [] {
      if constexpr (detail::is_sharing_policy<P>)
        return detail::share_error<P, Set::n_attention, Set::n_ffn, Set::has_skip, k, h>();
      else return E::none;  // Share<P> itself has reported it
    }();
    static_assert(error != E::k_not_one, "mom::Router<Share<P>> runs exactly one module pair per step: use K<1>");
    static_assert(error != E::has_skip, "mom::Router<Share<P>> never picks Skip: remove Skip from the ModuleSet");
    static_assert(error != E::uneven_pairs,
                  "mom::Router<Share<P>> shares attention+FFN pairs: the ModuleSet needs MHA<G> and FFN<G> with the "
                  "same G, e.g. ModuleSet<MHA<2>, FFN<2>>");
    static_assert(error != E::group_below_one, "mom::Share<Cycle<G>> / Share<Blocks<G>>: G must be >= 1");
    static_assert(error != E::group_exceeds_modules,
                  "mom::Share<Cycle<G>> / Share<Blocks<G>>: G is larger than the number of module pairs in the "
                  "ModuleSet: use ModuleSet<MHA<G>, FFN<G>>");
    static_assert(error != E::cycle_longer_than_h,
                  "mom::Share<Cycle<G>>: G is larger than H, so modules H..G-1 would never run");
    static_assert(error != E::blocks_not_dividing,
                  "mom::Share<Blocks<G>>: G must divide H (each of the G modules runs H/G consecutive steps)");
    static_assert(error != E::all_needs_one_pair,
                  "mom::Share<All> runs one module pair at every step: use ModuleSet<MHA<1>, FFN<1>>");
    static_assert(error != E::map_length,
                  "mom::Share<Map<j...>>: the map needs one entry per assembly step: its length must equal H");
    static_assert(error != E::map_out_of_range,
                  "mom::Share<Map<j...>>: an entry is not a module of the set: each j must be in [0, G) for "
                  "ModuleSet<MHA<G>, FFN<G>>");
    static_assert(error != E::map_points_forward,
                  "mom::Share<Map<j...>>: the sharing map points forward: step i uses module j > i (eq. (10) needs "
                  "c_share(i) = j <= i)");
    static_assert(error != E::map_not_first_use_order,
                  "mom::Share<Map<j...>>: modules must be numbered in the order of their first use: a step uses "
                  "module j before module j-1 has run");
    static_assert(error != E::module_unused,
                  "mom::Router<Share<P>>: a module of the ModuleSet is never used by the sharing map: use fewer "
                  "modules (ModuleSet<MHA<G>, FFN<G>> with G = the modules the map uses)");
    static constexpr bool ok = error == E::none;
  };
};

}  // namespace mom

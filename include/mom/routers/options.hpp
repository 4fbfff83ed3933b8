#pragma once
// Router options shared by the router policies (Router<Policy, Options...>): each is a small
// type carrying a compile-time value; a policy lists the ones it accepts and checks them.
//   Width<w>            hidden size of a router with a state (GRU)
//   Temperature<p, q>   softmax temperature tau = p / q
//   BalanceCoef<p, q>   coefficient of the Switch-style load-balancing loss, p / q (0: off)
//   Renormalise<b>      renormalise the K picked weights to sum 1
//   ZLoss<p, q>         coefficient of the router z-loss (ST-MoE, arXiv 2202.08906), p / q (0: off, the default)
#include <type_traits>

#include "mom/core/meta.hpp"

namespace mom {

template <int w>
struct Width {
  static constexpr int value = w;
};
template <long long num, long long den = 1>
struct Temperature {
  static constexpr long long numerator = num, denominator = den;
  static constexpr double value = den != 0 ? double(num) / double(den) : 0.0;
};
template <long long num, long long den = 1>
struct BalanceCoef {
  static constexpr long long numerator = num, denominator = den;
  static constexpr double value = den != 0 ? double(num) / double(den) : 0.0;
};
template <bool on>
struct Renormalise {
  static constexpr bool value = on;
};
template <long long num, long long den = 1>
struct ZLoss {
  static constexpr long long numerator = num, denominator = den;
  static constexpr double value = den != 0 ? double(num) / double(den) : 0.0;
};

// ---- one option mechanism for every router policy ----------------------------------------------
// An option is identified by its template (Width<64> and Width<128> are both "Width"; Capacity<1, 8>
// is "Capacity") or, when it has no parameters, by itself (EarlyExit). A policy looks its options up
// by a default of the same kind, so an option list is read the same way everywhere (GRU, TopK,
// BlockChoice, Skipping, a user's policy):
//   option_t<Width<256>, Os...>        the Width among Os, or Width<256>
//   has_option<EarlyExit, Os...>       whether Os holds an EarlyExit
//   options_known<TypeList<Known...>, Os...>, options_unique<Os...>   for the policy's checks
template <template <auto...> class Tpl>
struct ValueOptionKey {};
template <template <class...> class Tpl>
struct TypeOptionKey {};
template <class O>
struct option_key {
  using type = O;
};
template <template <auto...> class Tpl, auto... v>
struct option_key<Tpl<v...>> {
  using type = ValueOptionKey<Tpl>;
};
template <template <class...> class Tpl, class... Ts>
struct option_key<Tpl<Ts...>> {
  using type = TypeOptionKey<Tpl>;
};
// A and B are options of the same kind.
template <class A, class B>
inline constexpr bool same_option = std::is_same_v<typename option_key<A>::type, typename option_key<B>::type>;

template <class Default, class... Os>
struct find_option {
  using type = Default;
};
template <class Default, class O, class... Os>
struct find_option<Default, O, Os...> {
  using type = std::conditional_t<same_option<Default, O>, O, typename find_option<Default, Os...>::type>;
};
template <class Default, class... Os>
using option_t = typename find_option<Default, Os...>::type;

template <class Kind, class... Os>
inline constexpr int option_count = (0 + ... + (same_option<Kind, Os> ? 1 : 0));
template <class Kind, class... Os>
inline constexpr bool has_option = option_count<Kind, Os...> > 0;

template <class KnownList, class... Os>
inline constexpr bool options_known = false;
template <class... Known, class... Os>
inline constexpr bool options_known<TypeList<Known...>, Os...> = ((option_count<Os, Known...> > 0) && ...);
template <class... Os>
inline constexpr bool options_unique = ((option_count<Os, Os...> == 1) && ...);

}  // namespace mom

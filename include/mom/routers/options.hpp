#pragma once
// Router options shared by the router policies (Router<Policy, Options...>): each is a small
// type carrying a compile-time value; a policy lists the ones it accepts and checks them.
//   Width<w>            hidden size of a router with a state (GRU)
//   Temperature<p, q>   softmax temperature tau = p / q
//   BalanceCoef<p, q>   coefficient of the Switch-style load-balancing loss, p / q (0: off)
//   Renormalise<b>      renormalise the K picked weights to sum 1
#include <type_traits>

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

namespace detail {
// The kind of an option: 0 not an option, 1 Width, 2 Temperature, 3 BalanceCoef, 4 Renormalise.
template <class T>
inline constexpr int option_kind = 0;
template <int w>
inline constexpr int option_kind<Width<w>> = 1;
template <long long a, long long b>
inline constexpr int option_kind<Temperature<a, b>> = 2;
template <long long a, long long b>
inline constexpr int option_kind<BalanceCoef<a, b>> = 3;
template <bool on>
inline constexpr int option_kind<Renormalise<on>> = 4;

// The option of kind `kind` among Os, or Fallback.
template <int kind, class Fallback, class... Os>
struct pick_option {
  using type = Fallback;
};
template <int kind, class Fallback, class O, class... Os>
struct pick_option<kind, Fallback, O, Os...> {
  using type = std::conditional_t<option_kind<O> == kind, O, typename pick_option<kind, Fallback, Os...>::type>;
};
}  // namespace detail

}  // namespace mom

#pragma once
// Compile-time vocabulary of the 5-tuple <M, R, phi, K, H> (MoM paper §3.1): the counts K
// (modules picked per step) and H (assembly steps), type lists, and the small traits the
// rest of the library uses to recognise its own templates.
#include <cstddef>
#include <type_traits>

namespace mom {

// K<n>: number of modules a router picks per token per step (paper §3.2, TopK).
template <int n>
struct K {
  static constexpr int value = n;
};
// H<n>: number of assembly steps (paper §3.2: "the assembly process lasts H steps").
template <int n>
struct H {
  static constexpr int value = n;
};

template <class T>
inline constexpr bool is_k = false;
template <int n>
inline constexpr bool is_k<K<n>> = true;
template <class T>
inline constexpr bool is_h = false;
template <int n>
inline constexpr bool is_h<H<n>> = true;

template <class... Ts>
struct TypeList {
  static constexpr std::size_t size = sizeof...(Ts);
};

// Number of types in Ts... for which Pred<T>::value holds.
template <template <class> class Pred, class... Ts>
inline constexpr int count_if = (0 + ... + (Pred<Ts>::value ? 1 : 0));

// Always-false value that depends on T: for static_assert in a template that must not be used.
template <class...>
inline constexpr bool dependent_false = false;

}  // namespace mom

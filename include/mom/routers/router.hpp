#pragma once
// Router<Policy>: the paper's R (§3.1, §3.3), the part of the 5-tuple that decides, per token
// and step, which K modules of the set run and with what weights. A policy is a tag type
// with `is_router_policy = true`, a `name`, and a nested
//   template <class Set, int k, int h> struct Drives { static constexpr bool ok; };
// whose static_asserts reject module sets / K / H the policy cannot drive, and (for routers
// with parameters) their tensor specs, declared once by the policy (GRU::tensors, an ExpertGate's
// tensors, ...). How an Assembly executes a policy lives in assembly/ (Executor specialisations,
// keyed on the policy or, for expert gates, on phi::MoE), so dependencies point down.
#include <concepts>
#include <cstddef>
#include <string_view>

#include "mom/core/dims.hpp"
#include "mom/core/layout.hpp"
#include "mom/core/meta.hpp"

namespace mom {

template <class Policy, class... Options>
struct Router {
  using policy = Policy;
  using options = TypeList<Options...>;
};

template <class T>
inline constexpr bool is_router = false;
template <class P, class... O>
inline constexpr bool is_router<Router<P, O...>> = true;

template <class P>
concept RouterPolicy = requires {
  requires P::is_router_policy;
  { P::name } -> std::convertible_to<std::string_view>;
};

}  // namespace mom

// Every router policy of the library, by its name (P::name; a template's arguments as <P> or <...>), in one
// place: Assembly's "unknown router policy" message prints it (assembly/assembly.hpp; a static_assert message
// is a string literal, hence a macro), and lint.router_policies (scripts/check_router_policies.sh) fails when
// a policy under include/mom is missing from it or it names one that no longer exists.
#define MOM_ROUTER_POLICY_NAMES                                                                              \
  "Sequential, GRU, Share<P>, TopK<Softmax>, TopK<Sigmoid>, TopC<Softmax>, BlockChoice<...>, Skipping<...>, " \
  "Recursion<...>"

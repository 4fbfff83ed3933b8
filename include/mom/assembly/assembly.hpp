#pragma once
// Assembly<R, M, K, H, Phi>: the paper's 5-tuple <M, R, phi, K, H> (§3.1) as one class
// template. A model architecture is one Assembly or a Chunked sequence of them; the special
// cases of §3.5 are specialisations or aliases of this template (Dense<L> below).
//
// Everything that can be known from the type is checked here, when the type is used
// (e.g. by LM<dims, Arch>), with messages in the user's terms.
#include <concepts>
#include <cstddef>
#include <span>
#include <type_traits>

#include "mom/assembly/phi.hpp"
#include "mom/core/meta.hpp"
#include "mom/modules/module_set.hpp"
#include "mom/routers/router.hpp"
#include "mom/routers/sequential.hpp"
#include "mom/routers/share.hpp"

namespace mom {

// How an Assembly with router policy P computes (forward, backward, cost). Specialised per
// policy in assembly/ (assembly/sequential.hpp for Router<Sequential>), or per phi for every policy
// of a kind (assembly/moe.hpp: phi::MoE for every policy with an ExpertGate). A user's policy gets its
// executor by the same means.
template <class Policy, class A, Dims D>
struct Executor;

// The executor contract (what LM<dims, Arch> and ModelInstance call), for one part at dims D:
//   tensor_count, specs(TensorSpec* out, index_t layer_base)   the part's tensors in layout order
//   params                                                     their total size
//   flops_per_token(seq), backward_flops_per_token(seq)         cost model (upper bounds for routed parts)
//   Plan plan(Arena&, batch, seq), scratch(batch, seq)          workspace
//   forward(be, p, ws, plan, x, scratch, batch, seq, tokens) -> MatrixView<const T>   the part's output
//   backward(be, p, g, ws, plan, x, dres, scratch, batch, seq)   dres: dL/dout on entry, dL/dx on exit
// and optionally has_aux_loss (Plan::aux: a loss added to the model's), the routing read-back
// (ReportsRouting below) and depth read-back (models/depth_stats.hpp).
template <class E>
concept AssemblyExecutor = requires(Arena& a, index_t i, TensorSpec* out) {
  { E::tensor_count } -> std::convertible_to<std::size_t>;
  { E::params } -> std::convertible_to<index_t>;
  E::specs(out, i);
  { E::flops_per_token(i) } -> std::convertible_to<index_t>;
  { E::backward_flops_per_token(i) } -> std::convertible_to<index_t>;
  typename E::Plan;
  { E::plan(a, i, i) } -> std::same_as<typename E::Plan>;
  { E::scratch(i, i) } -> std::convertible_to<index_t>;
};
template <class E, class Be, class T = typename Be::scalar>
concept AssemblyExecutorOn = AssemblyExecutor<E> && requires(Be& be, const T* p, T* g, T* ws, const typename E::Plan& plan,
                                                             MatrixView<const T> x, MatrixView<T> dres, index_t i,
                                                             std::span<const token_t> tokens) {
  { E::forward(be, p, ws, plan, x, g, i, i, tokens) } -> std::convertible_to<MatrixView<const T>>;
  E::backward(be, p, g, ws, plan, x, dres, g, i, i);
};
// Member by member, one message naming the missing one.
template <class E>
struct VerifyExecutor {
  static_assert(requires { { E::tensor_count } -> std::convertible_to<std::size_t>; },
                "mom::Executor: missing `static constexpr std::size_t tensor_count`");
  static_assert(requires { { E::params } -> std::convertible_to<index_t>; }, "mom::Executor: missing `static constexpr index_t params`");
  static_assert(requires(TensorSpec* out, index_t i) { E::specs(out, i); },
                "mom::Executor: missing `static constexpr void specs(TensorSpec* out, index_t layer_base)`");
  static_assert(requires(index_t i) { { E::flops_per_token(i) } -> std::convertible_to<index_t>; },
                "mom::Executor: missing `static constexpr index_t flops_per_token(index_t seq)`");
  static_assert(requires(index_t i) { { E::backward_flops_per_token(i) } -> std::convertible_to<index_t>; },
                "mom::Executor: missing `static constexpr index_t backward_flops_per_token(index_t seq)`");
  static_assert(requires(Arena& a, index_t i) { E::plan(a, i, i); },
                "mom::Executor: missing `struct Plan` or `static constexpr Plan plan(Arena&, index_t batch, index_t seq)`");
  static_assert(requires(index_t i) { { E::scratch(i, i) } -> std::convertible_to<index_t>; },
                "mom::Executor: missing `static constexpr index_t scratch(index_t batch, index_t seq)`");
  static constexpr bool ok = AssemblyExecutor<E>;
};

// Routing read-back of executors whose routers pick modules per token (MoM's GRU routers, MoE's
// top-K routers): `routing_routers` router families, routing_info(r) describing family r, and
//   read_picks(be, ws, plan, step, r, n, std::span<token_t> out)   step's n×K class ids (SKIP last)
//   routed_flops(batch, seq, picks)   forward FLOPs for the routing picks(step, r) returns
// Used by models/routing_stats.hpp, realised_forward_flops and mom-train's routing statistics.
// (An auxiliary loss is a separate property: `has_aux_loss` with Plan::aux.)
struct RoutingInfo {
  const char* name;  // "attn", "ffn"
  int classes = 0, steps = 0, k = 0;
  bool skip = false;  // the last class is SKIP
};
template <class E>
concept ReportsRouting = requires {
  { E::routing_routers } -> std::convertible_to<int>;
  { E::routing_info(0) } -> std::convertible_to<RoutingInfo>;
};

namespace detail {
template <class T, template <int> class Tpl>
struct int_arg {
  static constexpr int value = 0;
};
template <int n, template <int> class Tpl>
struct int_arg<Tpl<n>, Tpl> {
  static constexpr int value = n;
};

template <class R>
struct policy_of {
  using type = void;
};
template <class P, class... O>
struct policy_of<Router<P, O...>> {
  using type = P;
};

template <class R, class M, int k, int h, class Phi>
constexpr bool assembly_drivable() {
  if constexpr (is_router<R> && is_module_set<M> && AssemblingFunction<Phi> && k >= 1 && h >= 1) {
    if constexpr (RouterPolicy<typename R::policy> && M::valid) {
      constexpr bool phi_ok = Phi::template Verify<M, k, h>::ok;
      // Check the router only when phi accepted K, so one mistake gives one message.
      if constexpr (phi_ok) return R::policy::template Drives<M, k, h>::ok;
      else return false;
    } else {
      return false;
    }
  } else {
    return false;
  }
}
}  // namespace detail

template <class R, class M, class Kn, class Hn, class Phi = phi::MoM>
struct Assembly {
  static_assert(is_router<R>, "mom::Assembly<R, M, K, H, Phi>: R must be a router, e.g. Router<Sequential>");
  static_assert(is_module_set<M>, "mom::Assembly<R, M, K, H, Phi>: M must be a ModuleSet<...>, e.g. ModuleSet<MHA<4>, FFN<4>, Skip>");
  static_assert(!(is_h<Kn> && is_k<Hn>), "mom::Assembly<R, M, K, H, Phi>: K and H are swapped: write Assembly<R, M, K<k>, H<h>>");
  static_assert(is_k<Kn> || (is_h<Kn> && is_k<Hn>), "mom::Assembly<R, M, K, H, Phi>: the third argument must be K<n>");
  static_assert(is_h<Hn> || (is_h<Kn> && is_k<Hn>), "mom::Assembly<R, M, K, H, Phi>: the fourth argument must be H<n>");
  static_assert(AssemblingFunction<Phi>, "mom::Assembly<R, M, K, H, Phi>: Phi must be an assembling function, e.g. phi::MoM");

  using router = R;
  using module_set = M;
  using phi_type = Phi;
  static constexpr int k = detail::int_arg<Kn, K>::value;
  static constexpr int h = detail::int_arg<Hn, H>::value;
  static_assert(!is_k<Kn> || k >= 1, "mom::Assembly: K must be >= 1 (modules picked per token per step)");
  static_assert(!is_h<Hn> || h >= 1, "mom::Assembly: H must be >= 1 (assembly steps)");
  static constexpr bool declares_policy = requires { requires detail::policy_of<R>::type::is_router_policy; };
  static_assert(!is_router<R> || !declares_policy || RouterPolicy<typename detail::policy_of<R>::type>,
                "mom router policy: missing `static constexpr std::string_view name` (what describe<> and the "
                "checkpoints print; routers/router.hpp)");
  static_assert(!is_router<R> || declares_policy || RouterPolicy<typename detail::policy_of<R>::type>,
                "mom::Assembly: unknown router policy; known: " MOM_ROUTER_POLICY_NAMES
                ", or a policy of your own that declares is_router_policy (routers/router.hpp)");

  // True when the router can drive this module set with this K and H (the static_asserts of
  // phi and of the router policy have fired otherwise).
  static constexpr bool valid = detail::assembly_drivable<R, M, k, h, Phi>();

  // Layer names "h.<base>".."h.<base + depth - 1>" (the dense layers this part corresponds to)
  // and the number of assembly steps actually run.
  static constexpr int depth = [] {
    if constexpr (is_module_set<M>) return M::depth;
    else return 0;
  }();
  static constexpr int steps = h;
  // Layers a token passes through, as describe<> prints them: the layer names, except under φ_MoE, whose
  // FFN family may be an expert pool larger than the stack (MoE(share): FFN<E> shared by H<L> layers), where
  // each attention module is one layer.
  static constexpr int layers = [] {
    if constexpr (!is_module_set<M>) return 0;
    else if constexpr (std::is_same_v<Phi, phi::MoE>) return M::n_attention;
    else return M::depth;
  }();

  template <Dims D>
  using executor = Executor<typename detail::policy_of<R>::type, Assembly, D>;
};

template <class T>
inline constexpr bool is_assembly = false;
template <class R, class M, class Kn, class Hn, class Phi>
inline constexpr bool is_assembly<Assembly<R, M, Kn, Hn, Phi>> = true;

// The vanilla L-layer transformer is the MoM special case with a fixed sequential router
// (paper §3.5): step h runs MHA h then FFN h.
template <int L>
using Dense = Assembly<Router<Sequential>, ModuleSet<MHA<L>, FFN<L>>, K<1>, H<L>>;
// One vanilla pre-norm block (attention then FFN, each x + f(LN(x))).
using Layer = Dense<1>;

}  // namespace mom

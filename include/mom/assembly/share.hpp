#pragma once
// Executor of Assembly<Router<Share<Policy>>, ModuleSet<MHA<G>, FFN<G>>, K<1>, H<L>>: parameter
// sharing (MoM paper §3.5, eq. (10)), phi_parameter-sharing(M, R^X, x_h) = m^X_{c_share(h)}:
//   u_h     = x_h + m^A_{c(h)}(x_h)
//   x_{h+1} = u_h + m^F_{c(h)}(u_h)
// i.e. the dense stack's executor (assembly/sequential.hpp) with the step -> module map c of the
// sharing policy (routers/share.hpp) in place of c(h) = h. Cost model: the G module pairs'
// parameters are counted once (the set's layout), FLOPs and saved activations once per step.
#include "mom/assembly/sequential.hpp"
#include "mom/routers/share.hpp"

namespace mom {

template <class P, class A, Dims D>
struct Executor<Share<P>, A, D> : detail::FixedRouteExecutor<A, D, Share<P>::template step_map<A::h>()> {
  // c(h) for every step, for describe<> and the tests.
  static constexpr std::array<int, A::h> step_map = Share<P>::template step_map<A::h>();
};

}  // namespace mom

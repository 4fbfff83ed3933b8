// Rejected at compile time: a router policy that says it gates MoE experts but whose gate is not an
// ExpertGate (routers/gate.hpp).
// EXPECT: mom::phi::MoE: the router's gate is not a mom::ExpertGate
#include <mom/mom.hpp>
using namespace mom;
struct NotAGate {};
struct BadPolicy {
  static constexpr bool is_router_policy = true;
  static constexpr bool gates_experts = true;
  static constexpr std::string_view name = "BadPolicy";
  template <class Set, int k, int h>
  struct Drives {
    static constexpr bool ok = true;
  };
  template <Dims D, int E, int K, bool Skip, class Options>
  using gate = NotAGate;
};
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<BadPolicy>, ModuleSet<MHA<2>, Experts<FFN, 4, PerStep>>, K<1>, H<2>, phi::MoE>;
static_assert(LM<dims, Bad>::params > 0);

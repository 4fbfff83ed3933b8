// Rejected at compile time: a user's router policy for MoE steps that forgot `gates_experts` (so no expert gate is
// used and no Executor exists for it): one message naming what to add (models/lm.hpp, ExecutorDefined), not one
// per executor member.
// EXPECT: mom::Executor<Policy, Assembly, Dims>: this router policy has no executor: a policy for MoE experts \(phi::MoE\) declares `static constexpr bool gates_experts = true`
#include <mom/mom.hpp>
#include <string_view>
using namespace mom;
struct MyRouting {
  static constexpr bool is_router_policy = true;
  static constexpr std::string_view name = "MyRouting";
  template <class Set, int k, int h>
  struct Drives {
    static constexpr bool ok = true;
  };
};
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<MyRouting>, ModuleSet<MHA<2>, Experts<FFN, 3, PerStep>>, K<1>, H<2>, phi::MoE>;
static_assert(LM<dims, Bad>::params > 0);

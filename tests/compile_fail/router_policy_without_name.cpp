// Rejected at compile time: a user's router policy that declares is_router_policy but no `name`: the message
// names the missing member (not "unknown router policy").
// EXPECT: mom router policy: missing `static constexpr std::string_view name`
#include <mom/mom.hpp>
using namespace mom;
struct Unnamed {
  static constexpr bool is_router_policy = true;
  static constexpr bool gates_experts = true;
  template <Dims D, int E, int K, bool Skip, class Options>
  using gate = SoftmaxTopKGate<D, E, K, Skip, Options>;
  template <class Set, int k, int h>
  struct Drives {
    static constexpr bool ok = true;
  };
};
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<Unnamed>, ModuleSet<MHA<2>, Experts<FFN, 4, PerStep>>, K<1>, H<2>, phi::MoE>;
static_assert(LM<dims, Bad>::params > 0);

// Rejected at compile time: a user's expert gate without `selection(plan)`; the message names the missing
// member (routers/gate.hpp, VerifyExpertGate), the note above it the gate's type.
// EXPECT: mom::ExpertGate: missing `static constexpr dispatch::Selection selection\(const Plan&\)`
#include <mom/mom.hpp>
using namespace mom;
template <Dims D, int E, int K, bool Skip, class Options>
struct NoSelection : SoftmaxTopKGate<D, E, K, Skip, Options> {
  static constexpr int selection = 0;  // hides the top-K gate's selection(plan): not a function
};
struct MyGating {
  static constexpr bool is_router_policy = true;
  static constexpr bool gates_experts = true;
  static constexpr std::string_view name = "MyGating";
  template <class Set, int k, int h>
  struct Drives {
    static constexpr bool ok = true;
  };
  template <Dims D, int E, int K, bool Skip, class Options>
  using gate = NoSelection<D, E, K, Skip, Options>;
};
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<MyGating>, ModuleSet<MHA<2>, Experts<FFN, 4, PerStep>>, K<1>, H<2>, phi::MoE>;
static_assert(LM<dims, Bad>::params > 0);

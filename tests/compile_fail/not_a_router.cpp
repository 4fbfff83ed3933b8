// Rejected at compile time: a policy passed without Router<...>.
// EXPECT: R must be a router
#include <mom/models/lm.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Sequential, ModuleSet<MHA<2>, FFN<2>>, K<1>, H<2>>;
static_assert(LM<dims, Bad>::params > 0);

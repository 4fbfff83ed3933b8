// Rejected at compile time: Cycle<0>.
// EXPECT: G must be >= 1
#include <mom/models/lm.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<Share<Cycle<0>>>, ModuleSet<MHA<1>, FFN<1>>, K<1>, H<4>>;
static_assert(LM<dims, Bad>::params > 0);

// Rejected at compile time: Router<Share<...>> with K != 1.
// EXPECT: Share<P>> runs exactly one module pair per step: use K<1>
#include <mom/models/lm.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<Share<Cycle<2>>>, ModuleSet<MHA<2>, FFN<2>>, K<2>, H<4>>;
static_assert(LM<dims, Bad>::params > 0);

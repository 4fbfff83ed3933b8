// Rejected at compile time: Router<Share<...>> over unequal MHA and FFN counts.
// EXPECT: shares attention.FFN pairs
#include <mom/models/lm.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<Share<Cycle<2>>>, ModuleSet<MHA<2>, FFN<3>>, K<1>, H<4>>;
static_assert(LM<dims, Bad>::params > 0);

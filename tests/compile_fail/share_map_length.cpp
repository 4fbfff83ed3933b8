// Rejected at compile time: a sharing map with fewer entries than H.
// EXPECT: its length must equal H
#include <mom/models/lm.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<Share<Map<0, 1, 0>>>, ModuleSet<MHA<2>, FFN<2>>, K<1>, H<4>>;
static_assert(LM<dims, Bad>::params > 0);

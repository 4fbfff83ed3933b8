// Rejected at compile time: a sharing map entry that is not a module of the set (module 2 of a set of 2).
// EXPECT: an entry is not a module of the set
#include <mom/models/lm.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<Share<Map<0, 1, 2>>>, ModuleSet<MHA<2>, FFN<2>>, K<1>, H<3>>;
static_assert(LM<dims, Bad>::params > 0);

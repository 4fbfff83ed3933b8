// Rejected at compile time: Cycle<G> over a set with more than G pairs (pairs 2, 3 never used).
// EXPECT: a module of the ModuleSet is never used
#include <mom/models/lm.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<Share<Cycle<2>>>, ModuleSet<MHA<4>, FFN<4>>, K<1>, H<8>>;
static_assert(LM<dims, Bad>::params > 0);

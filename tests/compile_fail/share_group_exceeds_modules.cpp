// Rejected at compile time: Cycle<G> with G larger than the number of module pairs in the set.
// EXPECT: G is larger than the number of module pairs
#include <mom/models/lm.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<Share<Cycle<4>>>, ModuleSet<MHA<2>, FFN<2>>, K<1>, H<8>>;
static_assert(LM<dims, Bad>::params > 0);

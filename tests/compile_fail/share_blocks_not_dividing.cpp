// Rejected at compile time: Blocks<G> with G not dividing H.
// EXPECT: G must divide H
#include <mom/models/lm.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<Share<Blocks<3>>>, ModuleSet<MHA<3>, FFN<3>>, K<1>, H<8>>;
static_assert(LM<dims, Bad>::params > 0);

// Rejected at compile time: Cycle<G> with G > H (modules H..G-1 would never run).
// EXPECT: G is larger than H
#include <mom/models/lm.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<Share<Cycle<4>>>, ModuleSet<MHA<4>, FFN<4>>, K<1>, H<3>>;
static_assert(LM<dims, Bad>::params > 0);

// Rejected at compile time: Share<P> with P not a sharing policy.
// EXPECT: P must be a sharing policy
#include <mom/models/lm.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<Share<int>>, ModuleSet<MHA<2>, FFN<2>>, K<1>, H<4>>;
static_assert(LM<dims, Bad>::params > 0);

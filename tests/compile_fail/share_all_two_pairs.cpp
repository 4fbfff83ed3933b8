// Rejected at compile time: Share<All> over a set with more than one module pair.
// EXPECT: Share<All> runs one module pair at every step
#include <mom/models/lm.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<Share<All>>, ModuleSet<MHA<2>, FFN<2>>, K<1>, H<4>>;
static_assert(LM<dims, Bad>::params > 0);

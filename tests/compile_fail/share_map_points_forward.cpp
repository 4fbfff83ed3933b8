// Rejected at compile time: a sharing map that points forward (step 0 uses module 1: c_share(i) = j > i, eq. (10)).
// EXPECT: sharing map points forward
#include <mom/models/lm.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<Share<Map<1, 0, 1>>>, ModuleSet<MHA<2>, FFN<2>>, K<1>, H<3>>;
static_assert(LM<dims, Bad>::params > 0);

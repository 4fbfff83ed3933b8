// Rejected at compile time: a sharing map whose modules are not numbered in the order of first use (module 2 runs before module 1).
// EXPECT: numbered in the order of their first use
#include <mom/models/lm.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<Share<Map<0, 0, 2, 1>>>, ModuleSet<MHA<3>, FFN<3>>, K<1>, H<4>>;
static_assert(LM<dims, Bad>::params > 0);

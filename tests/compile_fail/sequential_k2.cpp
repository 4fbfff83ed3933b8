// Rejected at compile time: Router<Sequential> with K != 1.
// EXPECT: Sequential. picks exactly one module per step
#include <mom/models/lm.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<Sequential>, ModuleSet<MHA<3>, FFN<3>>, K<2>, H<3>>;
static_assert(LM<dims, Bad>::params > 0);

// Rejected at compile time: a ModuleSet element that is not a module family.
// EXPECT: every element must be a module family
#include <mom/models/lm.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<Sequential>, ModuleSet<MHA<2>, FFN<2>, int>, K<1>, H<2>>;
static_assert(LM<dims, Bad>::params > 0);

// Rejected at compile time: a module of the set that the sharing map never uses (module 2 of 3).
// EXPECT: a module of the ModuleSet is never used
#include <mom/models/lm.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<Share<Map<0, 1, 0, 1>>>, ModuleSet<MHA<3>, FFN<3>>, K<1>, H<4>>;
static_assert(LM<dims, Bad>::params > 0);

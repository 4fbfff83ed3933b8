// Rejected at compile time: a GRU router of width 0.
// EXPECT: Width<w> needs w >= 1
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<GRU, Width<0>>, ModuleSet<MHA<4>, FFN<4>, Skip>, K<2>, H<6>>;
static_assert(LM<dims, Bad>::params > 0);

// Rejected at compile time: a GRU router over a set without FFN modules.
// EXPECT: routes attention and FFN modules
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<GRU>, ModuleSet<MHA<4>, Skip>, K<2>, H<6>>;
static_assert(LM<dims, Bad>::params > 0);

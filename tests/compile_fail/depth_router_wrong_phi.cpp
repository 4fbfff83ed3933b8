// Rejected at compile time: a depth router assembled with phi::MoM.
// EXPECT: assemble with phi::LayerSkip
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<BlockChoice<>>, ModuleSet<Block<4>, Skip>, K<1>, H<4>>;
static_assert(LM<dims, Bad>::params > 0);

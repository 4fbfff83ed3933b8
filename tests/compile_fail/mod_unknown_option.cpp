// Rejected at compile time: an option BlockChoice does not know (a GRU option).
// EXPECT: BlockChoice<Options...>: unknown option
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<BlockChoice<Capacity<1, 8>, Width<4>>>, ModuleSet<Block<4>, Skip>, K<1>, H<4>, phi::LayerSkip>;
static_assert(LM<dims, Bad>::params > 0);

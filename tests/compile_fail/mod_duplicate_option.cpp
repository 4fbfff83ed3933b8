// Rejected at compile time: the same BlockChoice option twice.
// EXPECT: BlockChoice<Options...>: each option may be given at most once
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<BlockChoice<Capacity<1, 8>, Capacity<1, 4>>>, ModuleSet<Block<4>, Skip>, K<1>, H<4>, phi::LayerSkip>;
static_assert(LM<dims, Bad>::params > 0);

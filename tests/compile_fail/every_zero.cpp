// Rejected at compile time: Every<0> (route every 0-th block).
// EXPECT: Every<k>: k must be >= 1
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<BlockChoice<Every<0>>>, ModuleSet<Block<4>, Skip>, K<1>, H<4>, phi::LayerSkip>;
static_assert(LM<dims, Bad>::params > 0);

// Rejected at compile time: phi::LayerSkip with H different from the number of layers.
// EXPECT: H must equal the number of layers
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<BlockChoice<>>, ModuleSet<Block<4>, Skip>, K<1>, H<3>, phi::LayerSkip>;
static_assert(LM<dims, Bad>::params > 0);

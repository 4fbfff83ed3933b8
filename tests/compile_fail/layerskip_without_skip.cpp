// Rejected at compile time: phi::LayerSkip over a module set without Skip.
// EXPECT: phi::LayerSkip needs Skip in the ModuleSet
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<BlockChoice<>>, ModuleSet<Block<4>>, K<1>, H<4>, phi::LayerSkip>;
static_assert(LM<dims, Bad>::params > 0);

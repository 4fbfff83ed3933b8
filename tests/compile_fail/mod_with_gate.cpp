// Rejected at compile time: a layer-skip criterion given to BlockChoice.
// EXPECT: LinearGate / Never are layer-skip criteria: use Router<Skipping<...>>
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<BlockChoice<LinearGate>>, ModuleSet<Block<4>, Skip>, K<1>, H<4>, phi::LayerSkip>;
static_assert(LM<dims, Bad>::params > 0);

// Rejected at compile time: phi::LayerSkip with K = 2.
// EXPECT: phi::LayerSkip runs layer h or SKIP at step h: use K<1>
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<Skipping<LinearGate>>, ModuleSet<MHA<4>, FFN<4>, Skip>, K<2>, H<4>, phi::LayerSkip>;
static_assert(LM<dims, Bad>::params > 0);

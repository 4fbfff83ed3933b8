// Rejected at compile time: a negative layer-skip cost.
// EXPECT: SkipCost<p, q>: the coefficient p/q must be >= 0
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<Skipping<LinearGate, SkipCost<-1, 10>>>, ModuleSet<MHA<4>, FFN<4>, Skip>, K<1>, H<4>, phi::LayerSkip>;
static_assert(LM<dims, Bad>::params > 0);

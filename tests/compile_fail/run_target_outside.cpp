// Rejected at compile time: a layer-skip run target above 1 (more tokens than there are).
// EXPECT: RunTarget<p, q, c, e>: the target fraction p/q must be in \(0, 1\]
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<Skipping<LinearGate, RunTarget<3, 2>>>, ModuleSet<MHA<4>, FFN<4>, Skip>, K<1>, H<4>, phi::LayerSkip>;
static_assert(LM<dims, Bad>::params > 0);

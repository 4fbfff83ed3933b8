// Rejected at compile time: two layer-skip criteria.
// EXPECT: give one criterion, LinearGate or Never, not both
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<Skipping<LinearGate, Never>>, ModuleSet<MHA<4>, FFN<4>, Skip>, K<1>, H<4>, phi::LayerSkip>;
static_assert(LM<dims, Bad>::params > 0);

// Rejected at compile time: a capacity given to a skip criterion.
// EXPECT: Capacity, Weighting and the causal-sampling options belong to BlockChoice
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<Skipping<LinearGate, Capacity<1, 2>>>, ModuleSet<MHA<4>, FFN<4>, Skip>, K<1>, H<4>, phi::LayerSkip>;
static_assert(LM<dims, Bad>::params > 0);

// Rejected at compile time: both causal-sampling methods at once.
// EXPECT: choose one causal-sampling method
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<BlockChoice<CausalAux<>, CausalPredictor<>>>, ModuleSet<Block<4>, Skip>, K<1>, H<4>, phi::LayerSkip>;
static_assert(LM<dims, Bad>::params > 0);

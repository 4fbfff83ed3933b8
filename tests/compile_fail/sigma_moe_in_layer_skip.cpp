// Rejected at compile time: a module with an auxiliary loss (σ-MoE) in a layer-skip stack, whose executor
// does not add module losses to the objective.
// EXPECT: mom::phi::LayerSkip: modules with an auxiliary loss \(SigmaMoE, SwitchHead\) run in the dense stack
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<Skipping<LinearGate>>, ModuleSet<MHA<2>, FFN<2, SigmaMoE<8, 2, 16>::type>, Skip>, K<1>, H<2>,
                     phi::LayerSkip>;
static_assert(LM<dims, Bad>::params > 0);

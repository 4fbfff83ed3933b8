// Rejected at compile time: a layer-skip gate in front of per-step experts (only MoD routes before experts).
// EXPECT: Router<Skipping> with Experts<FFN, E, PerStep>: only Mixture-of-Depths routes before experts
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<Skipping<LinearGate>>, ModuleSet<MHA<4>, Experts<FFN, 4, PerStep>, Skip>, K<2>, H<4>,
                     phi::LayerSkip>;
static_assert(LM<dims, Bad>::params > 0);

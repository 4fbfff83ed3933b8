// Rejected at compile time: an option ExpertChoice does not know (a GRU option).
// EXPECT: ExpertChoice<Options...>: unknown option
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<ExpertChoice<Capacity<1, 8>, Width<4>>>, ModuleSet<Block<4>, Skip>, K<1>, H<4>, phi::LayerSkip>;
static_assert(LM<dims, Bad>::params > 0);

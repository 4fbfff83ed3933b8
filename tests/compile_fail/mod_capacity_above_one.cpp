// Rejected at compile time: a Mixture-of-Depths capacity above 1.
// EXPECT: Capacity<p, q> must be in \(0, 1\]
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<BlockChoice<Capacity<9, 8>>>, ModuleSet<Block<4>, Skip>, K<1>, H<4>, phi::LayerSkip>;
static_assert(LM<dims, Bad>::params > 0);

// Rejected at compile time: a capacity that gives 0 tokens per sequence at the model's context (64 / 128).
// EXPECT: gives C = floor\(p/q \* context\) = 0 tokens
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<BlockChoice<Capacity<1, 128>>>, ModuleSet<Block<4>, Skip>, K<1>, H<4>, phi::LayerSkip>;
static_assert(LM<dims, Bad>::params > 0);

// Rejected at compile time: MoDE staged with top-3 of 2 experts per layer.
// EXPECT: K<k> is the top-k of each layer's E experts: k must be <= E
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<BlockChoice<>>, ModuleSet<MHA<4>, Experts<FFN, 2, PerStep>, Skip>, K<3>, H<4>,
                     phi::LayerSkip>;
static_assert(LM<dims, Bad>::params > 0);

// Rejected at compile time: BlockChoice's ExpertRouter<R> (the router of MoDE staged's experts) on a
// Mixture-of-Depths over plain blocks, which has no experts to route.
// EXPECT: mom::ExpertRouter<R> routes the experts of MoDE staged
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<BlockChoice<ExpertRouter<Router<TopK<Softmax>>>>>, ModuleSet<Block<4>, Skip>, K<1>, H<4>,
                     phi::LayerSkip>;
static_assert(LM<dims, Bad>::params > 0);

// Rejected at compile time: expert-choice depth routing over separate MHA and FFN families.
// EXPECT: Router<BlockChoice> routes whole blocks: use ModuleSet<Block<L>, Skip>
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<BlockChoice<>>, ModuleSet<MHA<4>, FFN<4>, Skip>, K<1>, H<4>, phi::LayerSkip>;
static_assert(LM<dims, Bad>::params > 0);

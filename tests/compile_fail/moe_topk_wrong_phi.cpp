// Rejected at compile time: the top-K router executes phi::MoE only.
// EXPECT: a router whose policy gates experts .* assembles with phi::MoE
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<TopK<Softmax>>, ModuleSet<MHA<4>, FFN<4>>, K<2>, H<4>>;
static_assert(LM<dims, Bad>::params > 0);

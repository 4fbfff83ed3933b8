// Rejected at compile time: the GRU router cannot drive per-layer expert sets.
// EXPECT: Router<GRU> routes one flat module set: Experts<FFN, E, PerStep> needs Router<TopK<Softmax>>
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<GRU>, ModuleSet<MHA<4>, Experts<FFN, 4, PerStep>>, K<2>, H<4>>;
static_assert(LM<dims, Bad>::params > 0);

// Rejected at compile time: experts must be token mixers (FFN-like), not attention.
// EXPECT: experts are token mixers
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<TopK<Softmax>>, ModuleSet<MHA<4>, Experts<MHA, 4, PerStep>>, K<2>, H<4>, phi::MoE>;
static_assert(LM<dims, Bad>::params > 0);

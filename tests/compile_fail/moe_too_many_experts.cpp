// Rejected at compile time: more experts per step than the grouped ops' parameter table holds.
// EXPECT: at most 256 experts per step
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 8, .heads = 2, .d_ff = 8, .vocab = 16, .context = 8};
using Bad = Assembly<Router<TopK<Softmax>>, ModuleSet<MHA<1>, Experts<FFN, 257, PerStep>>, K<2>, H<1>, phi::MoE>;
static_assert(LM<dims, Bad>::params > 0);

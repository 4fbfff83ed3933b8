// Rejected at compile time: a layer with no experts.
// EXPECT: E \(experts per step\) must be >= 1
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<TopK<Softmax>>, ModuleSet<MHA<4>, Experts<FFN, 0, PerStep>>, K<1>, H<4>, phi::MoE>;
static_assert(LM<dims, Bad>::params > 0);

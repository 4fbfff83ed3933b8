// Rejected at compile time: top-3 among 2 experts per layer (Skip would make it 3 choices).
// EXPECT: K is larger than the number of experts per step
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<TopK<Softmax>>, ModuleSet<MHA<4>, Experts<FFN, 2, PerStep>>, K<3>, H<4>, phi::MoE>;
static_assert(LM<dims, Bad>::params > 0);

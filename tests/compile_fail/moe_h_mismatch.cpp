// Rejected at compile time: phi::MoE runs attention module h at step h, so H = L.
// EXPECT: phi::MoE runs attention module h at step h: H must equal the number of MHA modules
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<TopK<Softmax>>, ModuleSet<MHA<4>, Experts<FFN, 4, PerStep>>, K<2>, H<6>, phi::MoE>;
static_assert(LM<dims, Bad>::params > 0);

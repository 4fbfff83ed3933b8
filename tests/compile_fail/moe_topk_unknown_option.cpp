// Rejected at compile time: Width<w> is a GRU option; the top-K router has no state.
// EXPECT: Router<TopK<Softmax>, Options...>: unknown option; known: Temperature
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<TopK<Softmax>, Width<64>>, ModuleSet<MHA<4>, FFN<4>>, K<2>, H<4>, phi::MoE>;
static_assert(LM<dims, Bad>::params > 0);

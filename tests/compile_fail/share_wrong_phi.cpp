// Rejected at compile time: parameter sharing with phi::MoE (it used to compile and silently run as
// the shared dense stack).
// EXPECT: Router<Sequential> and Router<Share<P>> run one module per step with weight 1: they assemble with phi::MoM
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<Share<Cycle<2>>>, ModuleSet<MHA<2>, FFN<2>>, K<1>, H<2>, phi::MoE>;
static_assert(LM<dims, Bad>::params > 0);

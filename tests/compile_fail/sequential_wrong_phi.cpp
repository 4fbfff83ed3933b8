// Rejected at compile time: the dense router with an assembling function it does not run (it used to
// compile and silently run as the dense stack).
// EXPECT: Router<Sequential> and Router<Share<P>> run one module per step with weight 1: they assemble with phi::MoM
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<Sequential>, ModuleSet<MHA<2>, FFN<2>>, K<1>, H<2>, phi::MoE>;
static_assert(LM<dims, Bad>::params > 0);

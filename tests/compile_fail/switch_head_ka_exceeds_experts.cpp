// Rejected at compile time: SwitchHead activating more experts per head than it has.
// EXPECT: mom::SwitchHead<H, N_A, K_A>: K_A \(active experts per head\) must be in 1..N_A
#include <mom/models/lm.hpp>
#include <mom/modules/switch_head.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<Sequential>, ModuleSet<MHA<2, SwitchHead<2, 3, 4, 32>::type>, FFN<2>>, K<1>, H<2>>;
static_assert(LM<dims, Bad>::params > 0);

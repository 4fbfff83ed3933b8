// Rejected at compile time: SwitchHead heads of odd width under rotary positions (RoPE rotates pairs).
// EXPECT: mom::SwitchHead<H, N_A, K_A, d_head>: rotary positions need an even d_head
#include <mom/models/lm.hpp>
#include <mom/modules/switch_head.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<Sequential>, ModuleSet<MHA<2, SwitchHead<2, 3, 2, 15>::type>, FFN<2>>, K<1>, H<2>>;
static_assert(LM<with_rope(dims), Bad>::params > 0);

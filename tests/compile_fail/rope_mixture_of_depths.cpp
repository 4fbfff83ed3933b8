// Rejected at compile time: Mixture-of-Depths (expert choice, trained over C selected tokens per sequence)
// with RoPE: its routed blocks' dense attention over the selected tokens would rotate them by rank.
// EXPECT: mom::Router<BlockChoice> \(Mixture-of-Depths\) does not support RoPE positions yet
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
static_assert(LM<with_rope(dims), MoD<4>>::params > 0);

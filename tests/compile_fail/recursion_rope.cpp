// Rejected at compile time: Mixture-of-Recursions with RoPE positions (the recursion block's dense attention over
// the selected tokens would rotate them by rank).
// EXPECT: mom::Router<Recursion> does not support RoPE positions yet
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64, .positions = Positions::RoPE};
using Bad = MoR<2, 2>;
static_assert(LM<dims, Bad>::params > 0);

// Rejected at compile time: token-choice Mixture-of-Recursions given expert choice's capacities (each token's
// depth is its router's choice).
// EXPECT: mom::Recursion<TokenChoice<R>>: each token's depth is its router's choice, weighted by the gate
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = MoR<2, 2, TokenChoice<Router<TopK<Softmax>>>, Capacities<2, 2, 1>>;
static_assert(LM<dims, Bad>::params > 0);

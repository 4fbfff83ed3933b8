// Rejected at compile time: a Mixture-of-Recursions capacity that grows with the recursion (hierarchical
// filtering only lets a token continue if it ran the recursion before).
// EXPECT: mom::Recursion: Capacities<q, p_1, ..., p_Nr> needs one capacity p_r/q in \(0, 1\] per recursion
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = MoR<2, 2, Capacities<2, 1, 2>>;
static_assert(LM<dims, Bad>::params > 0);

// Rejected at compile time: Capacities with two entries for three recursions.
// EXPECT: mom::Recursion: Capacities<q, p_1, ..., p_Nr> needs one capacity p_r/q in \(0, 1\] per recursion \(H<Nr> of them\)
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = MoR<2, 3, Capacities<3, 3, 2>>;
static_assert(LM<dims, Bad>::params > 0);

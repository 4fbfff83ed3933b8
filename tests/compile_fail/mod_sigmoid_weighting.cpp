// Rejected at compile time: Mixture-of-Depths with Mixture-of-Recursions' sigmoid weighting.
// EXPECT: mom::BlockChoice: Weighting<RouterWeight::Sigmoid> is Mixture-of-Recursions'
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = MoD<4, 1, 8, 2, Weighting<RouterWeight::Sigmoid>>;
static_assert(LM<dims, Bad>::params > 0);

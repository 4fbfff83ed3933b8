// Rejected at compile time: the same module kind twice.
// EXPECT: may appear at most once
#include <mom/models/lm.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<Sequential>, ModuleSet<MHA<1>, MHA<1>, FFN<2>>, K<1>, H<2>>;
static_assert(LM<dims, Bad>::params > 0);

// Rejected at compile time: MHA<0>.
// EXPECT: MHA<N> and FFN<N> need N >= 1
#include <mom/models/lm.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<Sequential>, ModuleSet<MHA<0>, FFN<2>>, K<1>, H<2>>;
static_assert(LM<dims, Bad>::params > 0);

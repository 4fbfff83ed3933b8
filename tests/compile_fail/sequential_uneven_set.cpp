// Rejected at compile time: Router<Sequential> over unequal MHA and FFN counts.
// EXPECT: H must equal the number of MHA and of FFN modules
#include <mom/models/lm.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<Sequential>, ModuleSet<MHA<4>, FFN<2>>, K<1>, H<4>>;
static_assert(LM<dims, Bad>::params > 0);

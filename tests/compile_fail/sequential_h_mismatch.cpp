// Rejected at compile time: Router<Sequential> with H != module count.
// EXPECT: H must equal the number of MHA and of FFN modules
#include <mom/models/lm.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<Sequential>, ModuleSet<MHA<4>, FFN<4>>, K<1>, H<3>>;
static_assert(LM<dims, Bad>::params > 0);

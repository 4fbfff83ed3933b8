// Rejected at compile time: K larger than the selectable modules, SKIP included.
// EXPECT: K is larger than the number of selectable modules
#include <mom/models/lm.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<Sequential>, ModuleSet<MHA<2>, FFN<2>, Skip>, K<4>, H<2>>;
static_assert(LM<dims, Bad>::params > 0);

// Rejected at compile time: a module family passed without ModuleSet<...>.
// EXPECT: M must be a ModuleSet
#include <mom/models/lm.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<Sequential>, MHA<2>, K<1>, H<2>>;
static_assert(LM<dims, Bad>::params > 0);

// Rejected at compile time: a module set with nothing but Skip.
// EXPECT: needs at least one computing module
#include <mom/models/lm.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<Sequential>, ModuleSet<Skip>, K<1>, H<1>>;
static_assert(LM<dims, Bad>::params > 0);

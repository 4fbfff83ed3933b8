// Rejected at compile time: LM over something that is not an architecture.
// EXPECT: Arch must be an Assembly
#include <mom/models/lm.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
static_assert(LM<dims, ModuleSet<MHA<2>, FFN<2>>>::params > 0);

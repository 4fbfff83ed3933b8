// Rejected at compile time: a chunk part that is not an Assembly.
// EXPECT: every part must be an Assembly
#include <mom/models/lm.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
static_assert(LM<dims, Chunked<Layer, ModuleSet<MHA<2>, FFN<2>>, Layer>>::params > 0);

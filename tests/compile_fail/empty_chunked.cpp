// Rejected at compile time: an empty chunking.
// EXPECT: a chunking needs at least one part
#include <mom/models/lm.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
static_assert(LM<dims, Chunked<>>::params > 0);

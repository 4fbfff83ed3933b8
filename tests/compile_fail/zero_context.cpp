// Rejected at compile time: context = 0.
// EXPECT: mom::Dims: context must be > 0
#include <mom/models/lm.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
constexpr Dims bad{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256};
static_assert(LM<bad, Dense<2>>::params > 0);

// Rejected at compile time: RoPE with an odd head dimension (24 / 8 = 3 columns per head).
// EXPECT: mom::Dims: RoPE rotates pairs of columns: the head dimension d_model / heads must be even
#include <mom/models/lm.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 24, .heads = 8, .d_ff = 96, .vocab = 256, .context = 64};
static_assert(LM<with_rope(dims), Dense<2>>::params > 0);

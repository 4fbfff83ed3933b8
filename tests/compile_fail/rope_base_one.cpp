// Rejected at compile time: a RoPE base of 1 (every pair would rotate at the same frequency).
// EXPECT: mom::Dims: rope_base must be > 1
#include <mom/models/lm.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
static_assert(LM<with_rope(dims, 1), Dense<2>>::params > 0);

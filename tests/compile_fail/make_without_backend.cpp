// Rejected at compile time: a model made on something that is not a backend.
// EXPECT: Be must be a backend
#include <mom/models/lm.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
auto model = LM<dims, Dense<2>>::make<float>(1);

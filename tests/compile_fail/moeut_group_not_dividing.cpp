// Rejected at compile time: a MoEUT layer group that does not divide the depth.
// EXPECT: mom::MoEUT<dims, L, G>: the group size G must divide the depth L
#include <mom/models/lm.hpp>
#include <mom/models/moeut_models.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 256, .heads = 8, .d_ff = 1024, .vocab = 256, .context = 64};
static_assert(LM<dims, MoEUT<dims, 8, 3>>::params > 0);

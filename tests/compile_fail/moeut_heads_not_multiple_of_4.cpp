// Rejected at compile time: the MoEUT recipe takes H/4 heads of the dense baseline.
// EXPECT: mom::MoEUT<dims, L, G>: the dense baseline's heads must be a multiple of 4
#include <mom/models/lm.hpp>
#include <mom/models/moeut_models.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 256, .heads = 2, .d_ff = 1024, .vocab = 256, .context = 64};
static_assert(LM<dims, MoEUT<dims, 8, 2>>::params > 0);

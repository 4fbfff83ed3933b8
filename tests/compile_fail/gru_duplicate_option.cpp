// Rejected at compile time: the same router option twice.
// EXPECT: each option may be given at most once
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<GRU, Width<64>, Width<128>>, ModuleSet<MHA<4>, FFN<4>, Skip>, K<2>, H<6>>;
static_assert(LM<dims, Bad>::params > 0);

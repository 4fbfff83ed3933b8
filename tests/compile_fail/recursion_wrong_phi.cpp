// Rejected at compile time: the recursion router assembled with phi::MoM.
// EXPECT: mom::Router<Recursion> assembles with phi::Recursion
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<Recursion<>>, ModuleSet<Block<2>, Skip>, K<1>, H<3>>;
static_assert(LM<dims, Bad>::params > 0);

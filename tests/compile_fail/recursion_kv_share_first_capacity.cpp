// Rejected at compile time: recursive KV sharing with a first recursion that does not run every token (the
// deeper recursions read the first recursion's keys of every token).
// EXPECT: mom::Recursion<KVShare>: the deeper recursions share the first recursion's keys and values
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = MoR<2, 2, KVShare, Capacities<4, 3, 1>>;
static_assert(LM<dims, Bad>::params > 0);

// Rejected at compile time: Mixture-of-Recursions over separate attention and FFN modules (it recurses over
// one shared block).
// EXPECT: mom::phi::Recursion recurses over one shared block and exits by SKIP: use ModuleSet<Block<B>, Skip>
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<Recursion<>>, ModuleSet<MHA<2>, FFN<2>, Skip>, K<1>, H<3>, phi::Recursion>;
static_assert(LM<dims, Bad>::params > 0);

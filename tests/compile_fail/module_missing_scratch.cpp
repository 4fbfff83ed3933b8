// Rejected at compile time: a user's token mixer that lacks a member of the module contract; the
// message names the member.
// EXPECT: mom module: missing `static constexpr index_t scratch\(index_t batch, index_t seq\)`
#include <mom/mom.hpp>
using namespace mom;
template <Dims D>
struct NoScratch : modules::FeedForward<D> {
  static constexpr int scratch = 0;  // hides FeedForward::scratch: not a function
};
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<Sequential>, ModuleSet<MHA<2>, FFN<2, NoScratch>>, K<1>, H<2>>;
static_assert(LM<dims, Bad>::params > 0);

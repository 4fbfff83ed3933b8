// Rejected at compile time: a router policy the library does not know.
// EXPECT: unknown router policy; known: Sequential, GRU, Share<P>, TopK<Softmax>, TopK<Sigmoid>, TopC<Softmax>, BlockChoice<...>, Skipping<...>, Recursion<...>
#include <mom/models/lm.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
struct MyPolicy {};
using Bad = Assembly<Router<MyPolicy>, ModuleSet<MHA<2>, FFN<2>>, K<1>, H<2>>;
static_assert(LM<dims, Bad>::params > 0);

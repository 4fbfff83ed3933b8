// Rejected at compile time: a top-K expert router over a set without FFN experts.
// EXPECT: Router<TopK<Softmax>> routes each step's FFN experts after its attention module
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<TopK<Softmax>>, ModuleSet<MHA<4>, Skip>, K<1>, H<4>, phi::MoE>;
static_assert(LM<dims, Bad>::params > 0);

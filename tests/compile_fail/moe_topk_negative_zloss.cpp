// Rejected at compile time: the router z-loss's coefficient is a penalty, >= 0.
// EXPECT: mom::Router<TopK<Softmax>>: ZLoss<p, q> must be >= 0
#include <mom/models/lm.hpp>
#include <mom/models/moe_models.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 2, .d_ff = 128, .vocab = 256, .context = 64};
static_assert(LM<dims, MoEStack<2, 4, 2, Router<TopK<Softmax>, ZLoss<-1, 100>>>>::params > 0);

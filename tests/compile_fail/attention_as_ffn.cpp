// Rejected at compile time: GPT-2's attention module placed where a feed-forward module belongs (FFN<N, Impl>);
// its single_role says it is a sequence mixer (modules/module.hpp).
// EXPECT: mom::FFN<N, Impl>: Impl is a sequence mixer \(attention-like; its single_role says so\)
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<Sequential>, ModuleSet<MHA<2>, FFN<2, modules::Attention>>, K<1>, H<2>>;
static_assert(LM<dims, Bad>::params > 0);

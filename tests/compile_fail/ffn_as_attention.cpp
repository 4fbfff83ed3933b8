// Rejected at compile time: GPT-2's feed-forward module placed where attention belongs (MHA<N, Impl>); its
// single_role says it is a token mixer (modules/module.hpp).
// EXPECT: mom::MHA<N, Impl>: Impl is a token mixer \(its single_role says so\), not attention: put it in FFN<N, Impl>
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<Sequential>, ModuleSet<MHA<2, modules::FeedForward>, FFN<2>>, K<1>, H<2>>;
static_assert(LM<dims, Bad>::params > 0);

// Rejected at compile time: a norm scheme that is not PeriNorm, PreNorm or PostNorm.
// EXPECT: mom::SigmaMoE: the norm scheme must be PeriNorm, PreNorm or PostNorm
#include <mom/models/lm.hpp>
#include <mom/modules/sigma_moe.hpp>
using namespace mom;
struct SandwichNorm {};
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<Sequential>, ModuleSet<MHA<2>, FFN<2, SigmaMoE<8, 2, 16, SandwichNorm>::type>>, K<1>, H<2>>;
static_assert(LM<dims, Bad>::params > 0);

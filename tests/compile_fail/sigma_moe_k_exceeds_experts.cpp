// Rejected at compile time: σ-MoE choosing more experts than it has.
// EXPECT: mom::SigmaMoE<N_E, K>: K \(active experts\) must be in 1..N_E
#include <mom/models/lm.hpp>
#include <mom/modules/sigma_moe.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<Sequential>, ModuleSet<MHA<2>, FFN<2, SigmaMoE<4, 5>::type>>, K<1>, H<2>>;
static_assert(LM<dims, Bad>::params > 0);

// Rejected at compile time: top-k of an SMoE layer cannot pick more experts than it has.
// EXPECT: mom::SMoE<N_ffd, k>: k \(active experts\) must be in 1..N_ffd
#include <mom/models/lm.hpp>
#include <mom/models/moduleformer_models.hpp>
using namespace mom;
constexpr Dims dims = without_positions(Dims{.d_model = 64, .heads = 2, .d_ff = 128, .vocab = 256, .context = 64});
static_assert(LM<dims, ModuleFormer<2, MoA<4, 2, 32>, SMoE<4, 5, 64>>>::params > 0);

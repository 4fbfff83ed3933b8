// Rejected at compile time: the router's loss is one of ModuleFormer's (eq. (7) or (8)) or none.
// EXPECT: mom: ModuleFormer's router loss must be MutualInformation<g>, LoadConcentration<g> or NoRouterLoss
#include <mom/models/lm.hpp>
#include <mom/models/moduleformer_models.hpp>
using namespace mom;
constexpr Dims dims = without_positions(Dims{.d_model = 64, .heads = 2, .d_ff = 128, .vocab = 256, .context = 64});
struct Balance {};
static_assert(LM<dims, ModuleFormer<2, MoA<4, 2, 32>, SMoE<4, 2, 64, 16, Balance>>>::params > 0);

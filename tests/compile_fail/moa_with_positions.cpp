// Rejected at compile time: stick-breaking heads encode order themselves; a learned wpe (or RoPE) beside
// them would be a different model than ModuleFormer's (arXiv 2306.04640 §3.2).
// EXPECT: mom::MoA: stick-breaking attention encodes order itself: use dims without positions
#include <mom/models/lm.hpp>
#include <mom/models/moduleformer_models.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 2, .d_ff = 128, .vocab = 256, .context = 64};
static_assert(LM<dims, ModuleFormer<2, MoA<4, 2, 32>, SMoE<4, 2, 64>>>::params > 0);

// Rejected at compile time: warm-starting a MoM model from a dense model of another depth.
// EXPECT: the chunking does not add up to the dense model
#include <mom/models/mom_models.hpp>
#include <mom/models/warm_start.hpp>
#include <mom/backend/cpu.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using MoM = LM<dims, Strategy_11411<MoM_P<>>>;  // 8 layers
using Dense6 = LM<dims, Dense<6>>;
void f(ModelInstance<MoM, cpu::Backend<float>>& m, const ModelInstance<Dense6, cpu::Backend<float>>& d) { warm_start(m, d); }

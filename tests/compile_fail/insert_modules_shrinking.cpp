// Rejected at compile time: module insertion only grows a model; a model with fewer experts cannot hold
// the trained one's tensors.
// EXPECT: mom::insert_modules: a tensor of the trained model has no same-named tensor of at least its shape
#include <mom/models/lm.hpp>
#include <mom/backend/cpu.hpp>
#include <mom/models/module_surgery.hpp>
#include <mom/models/moduleformer_models.hpp>
using namespace mom;
constexpr Dims dims = without_positions(Dims{.d_model = 64, .heads = 2, .d_ff = 128, .vocab = 256, .context = 64});
using Spec = ModuleFormerSpec<2, MoA<4, 2, 32>, SMoE<6, 2, 64>>;
using Big = LM<dims, Spec::type>;
using Smaller = LM<dims, Spec::compacted<4, 4>::type>;
void f(decltype(Smaller::make<cpu::Backend<float>>(1))& to, const decltype(Big::make<cpu::Backend<float>>(1))& from) {
  insert_modules(to, from);
}

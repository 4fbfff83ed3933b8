// Rejected at compile time through a function template that makes the model (a user's generic code;
// only mom's messages, no GCC-internal 'range_expr' line): an option Router<GRU> does not know.
// EXPECT: unknown option; known: Width
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<GRU, K<2>>, ModuleSet<MHA<4>, FFN<4>, Skip>, K<2>, H<6>>;
template <class Model>
auto build(std::uint64_t seed) {
  return Model::template make<cpu::Backend<float>>(seed);
}
int main() { return int(build<LM<dims, Bad>>(1).params().size()); }

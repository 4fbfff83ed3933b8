// Rejected at compile time through a function template that makes the model (a user's generic code;
// only mom's messages, no GCC-internal 'range_expr' line): K larger than the selectable modules, SKIP included.
// EXPECT: K is larger than the number of selectable modules
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<Sequential>, ModuleSet<MHA<2>, FFN<2>, Skip>, K<4>, H<2>>;
template <class Model>
auto build(std::uint64_t seed) {
  return Model::template make<cpu::Backend<float>>(seed);
}
int main() { return int(build<LM<dims, Bad>>(1).params().size()); }

// Rejected at compile time through a function template that makes the model (a user's generic code;
// only mom's messages, no GCC-internal 'range_expr' line): a user's token mixer that lacks a member of the module contract; the
// message names the member.
// EXPECT: mom module: missing `static constexpr index_t scratch\(index_t batch, index_t seq\)`
#include <mom/mom.hpp>
using namespace mom;
template <Dims D>
struct NoScratch : modules::FeedForward<D> {
  static constexpr int scratch = 0;  // hides FeedForward::scratch: not a function
};
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<Sequential>, ModuleSet<MHA<2>, FFN<2, NoScratch>>, K<1>, H<2>>;
template <class Model>
auto build(std::uint64_t seed) {
  return Model::template make<cpu::Backend<float>>(seed);
}
int main() { return int(build<LM<dims, Bad>>(1).params().size()); }

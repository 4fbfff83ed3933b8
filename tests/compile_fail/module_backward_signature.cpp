// Rejected at compile time: a user's token mixer whose backward does not take the contract's arguments (here it
// drops the input gradient and the scratch); the message names the member and its parameters, the note above it
// the module's type (modules/checked.hpp).
// EXPECT: mom module: no member `static void backward\(Be&, const T\* p, T\* g, const T\* ws
#include <mom/mom.hpp>
using namespace mom;
template <Dims D>
struct BadBackward : modules::FeedForward<D> {
  template <class Be, class T>
  static void backward(Be&, const T*, T*, const T*, const typename modules::FeedForward<D>::Saved&, MatrixView<const T>,
                       index_t, index_t) {}
};
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<Sequential>, ModuleSet<MHA<2>, FFN<2, BadBackward>>, K<1>, H<2>>;
void step(std::span<const token_t> tokens) {
  auto m = LM<dims, Bad>::make<cpu::Backend<float>>(1);
  m.reserve(1, 8);
  m.forward(tokens, tokens, 1, 8);
  m.backward();
}

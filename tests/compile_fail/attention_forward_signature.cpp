// Rejected at compile time: a user's attention whose forward takes its input as a mutable matrix (the contract
// gives MatrixView<const T> x); the message names the member, the note above it the module's type
// (modules/checked.hpp), here reached through Mixture-of-Depths' blocks over (batch, C).
// EXPECT: mom module: no member `static void forward\(Be&, const T\* p, T\* ws, const Saved&, MatrixView<const T> x
#include <mom/mom.hpp>
using namespace mom;
template <Dims D>
struct MutableInput : modules::Attention<D> {
  template <class Be, class T>
  static void forward(Be&, const T*, T*, const typename modules::Attention<D>::Saved&, MatrixView<T>, MatrixView<T>,
                      index_t, index_t) {}
};
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<BlockChoice<Capacity<1, 2>>>, ModuleSet<Block<2, MutableInput>, Skip>, K<1>, H<2>,
                     phi::LayerSkip>;
void step(std::span<const token_t> tokens) {
  auto m = LM<dims, Bad>::make<cpu::Backend<float>>(1);
  m.reserve(1, 8);
  m.forward(tokens, tokens, 1, 8);
}

// Rejected at compile time: a user's token mixer that declares reads_rows_in_place (here inherited from the GPT-2
// FFN) but hides the members that read the rows through an index list, run as a routed FFN (MoE's experts); the
// message names the missing member (modules/checked.hpp), the note above it the module's type.
// EXPECT: mom module: reads_rows_in_place is set, but no member `static void forward_grouped\(Be&, PerGroup<const T> p
#include <mom/mom.hpp>
using namespace mom;
template <Dims D>
struct HidesInPlace : modules::FeedForward<D> {
  using Base = modules::FeedForward<D>;
  template <class Be, class T>
  static void forward_grouped(Be& be, PerGroup<const T> p, T* ws, const typename Base::Saved& s, MatrixView<const T> x,
                              MatrixView<T> f_out, RowGroups g) {
    Base::forward_grouped(be, p, ws, s, x, f_out, g);
  }
};
template <int N>
using Family = FFN<N, HidesInPlace>;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<TopK<Softmax>>, ModuleSet<MHA<2>, Experts<Family, 4, PerStep>>, K<2>, H<2>, phi::MoE>;
void step(std::span<const token_t> tokens) {
  auto m = LM<dims, Bad>::make<cpu::Backend<float>>(1);
  m.reserve(1, 8);
  m.forward(tokens, tokens, 1, 8);
}

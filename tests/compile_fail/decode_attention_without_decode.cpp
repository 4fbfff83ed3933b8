// Rejected at compile time: a Decoder over a dense model whose attention module has no decode members; the
// error names the member (modules/module.hpp, explain_decoding_sequence_mixer) and the note above it the module.
// EXPECT: the attention module has no 'using DecodeSaved = \.\.\.' and 'static DecodeSaved plan_decode\(Arena&, index_t rows\)'
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
template <Dims D>
struct NoDecode : modules::Attention<D> {
  static constexpr int plan_decode = 0;  // hides the library attention's decode members
};
using Arch = Assembly<Router<Sequential>, ModuleSet<MHA<2, NoDecode>, FFN<2>>, K<1>, H<2>>;
void sample() {
  auto model = LM<dims, Arch>::make<cpu::Backend<float>>(1);
  infer::Decoder dec(model, 1);
}

// Rejected at compile time: a KV-cache Decoder for an architecture whose executor has no incremental
// decode yet (a Mixture-of-Modules chunk with its GRU router; infer/decoder.hpp, AssemblyDecoderOn).
// EXPECT: mom::infer::Decoder: a part of this architecture has no incremental decode yet
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Model = LM<dims, Assembly<Router<GRU>, ModuleSet<MHA<4>, FFN<4>, Skip>, K<2>, H<6>>>;
int main() {
  auto model = Model::make<cpu::Backend<float>>(1);
  infer::Decoder dec(model, 1);
  return int(dec.slots());
}

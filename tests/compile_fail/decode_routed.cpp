// Rejected at compile time: a KV-cache Decoder for Mixture-of-Depths trained with expert-choice top-C
// routing, which is not causal (a token's selection depends on the later tokens of its sequence); the
// message names the causal methods to decode with instead (infer/decoder.hpp, routes_causally).
// EXPECT: mom::infer::Decoder: this architecture's routing is not causal
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Model = LM<dims, MoD<4>>;
int main() {
  auto model = Model::make<cpu::Backend<float>>(1);
  infer::Decoder dec(model, 1);
  return int(dec.slots());
}

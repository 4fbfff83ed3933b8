// Rejected at compile time: a KV-cache Decoder for Mixture-of-Recursions' expert-choice routing, whose top-k per
// recursion ranks a token against the later tokens of its sequence.
// EXPECT: mom::infer::Decoder: this architecture's routing is not causal
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Model = LM<dims, MoRMiddleCycle<2, 3>>;
int main() {
  auto model = Model::make<cpu::Backend<float>>(1);
  infer::Decoder dec(model, 1);
  return int(dec.slots());
}

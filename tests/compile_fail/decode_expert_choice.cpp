// Rejected at compile time: a KV-cache Decoder for expert-choice MoE, whose experts pick tokens by the whole
// batch (later tokens included), so a new token cannot be routed as in training (routers/expert_topc.hpp).
// EXPECT: mom::infer::Decoder: this architecture's routing is not causal
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Model = LM<dims, ExpertChoiceMoEStack<2, 4>>;
int main() {
  auto model = Model::make<cpu::Backend<float>>(1);
  infer::Decoder dec(model, 1);
  return int(dec.slots());
}

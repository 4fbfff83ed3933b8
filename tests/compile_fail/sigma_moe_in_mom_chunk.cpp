// Rejected at compile time: σ-MoE routes inside itself and has no row-group members, so it cannot be a
// MoM chunk's routed FFN.
// EXPECT: forward_grouped
#include <mom/mom.hpp>
#include <mom/modules/sigma_moe.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<GRU>, ModuleSet<MHA<2>, FFN<2, SigmaMoE<8, 2, 16>::type>, Skip>, K<2>, H<2>>;
template <class M>
void run() {
  auto m = M::template make<cpu::Backend<float>>(1);
  m.reserve(1, 4);
  std::vector<token_t> t(4, 1);
  m.forward(t, t, 1, 4);
}
template void run<LM<dims, Bad>>();

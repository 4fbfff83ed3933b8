// Rejected at compile time: a user's expert gate whose backward does not take the contract's arguments (it drops
// the weight gradients dwp); the message names the member and its parameters (routers/gate.hpp,
// VerifyExpertGateOn), the note above it the gate's type.
// EXPECT: mom::ExpertGate: no member `static void backward\(Be&, const T\* p, T\* g, const T\* ws
#include <mom/mom.hpp>
using namespace mom;
template <Dims D, int E, int K, bool Skip, class Options>
struct NoWeightGradients : SoftmaxTopKGate<D, E, K, Skip, Options> {
  using Plan = typename SoftmaxTopKGate<D, E, K, Skip, Options>::Plan;
  template <class Be, class T>
  static void backward(Be&, const T*, T*, const T*, const Plan&, MatrixView<const T>, MatrixView<T>, T*) {}
};
struct MyGating {
  static constexpr bool is_router_policy = true;
  static constexpr bool gates_experts = true;
  static constexpr std::string_view name = "MyGating";
  template <class Set, int k, int h>
  struct Drives {
    static constexpr bool ok = true;
  };
  template <Dims D, int E, int K, bool Skip, class Options>
  using gate = NoWeightGradients<D, E, K, Skip, Options>;
};
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Bad = Assembly<Router<MyGating>, ModuleSet<MHA<2>, Experts<FFN, 4, PerStep>>, K<1>, H<2>, phi::MoE>;
void step(std::span<const token_t> tokens) {
  auto m = LM<dims, Bad>::make<cpu::Backend<float>>(1);
  m.reserve(1, 8);
  m.forward(tokens, tokens, 1, 8);
  m.backward();
}

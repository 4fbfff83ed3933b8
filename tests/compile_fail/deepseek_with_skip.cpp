// Rejected: the DeepSeekMoE router over a module set with Skip (it has no SKIP class).
// EXPECT: mom::Router<TopK<Sigmoid>>: no SKIP class
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Model = LM<dims, Assembly<Router<TopK<Sigmoid>>, ModuleSet<MHA<2>, Experts<FFN, 4, PerStep>, Skip>, K<2>, H<2>,
                                phi::MoE>>;
int main() { return int(Model::params > 0); }

// Rejected: expert-choice routing with K<2> over 4 experts: a token may be taken by every expert, so a row needs
// one slot per expert (routers/expert_topc.hpp).
// EXPECT: mom::Router<TopC<Softmax>>: K<k> must equal the experts per step E
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Model = LM<dims, Assembly<Router<TopC<Softmax>>, ModuleSet<MHA<2>, Experts<FFN, 4, PerStep>>, K<2>, H<2>, phi::MoE>>;
int main() { return int(Model::params > 0); }

// Rejected: group-limited routing whose group count does not divide the routed experts (7 routed, 2 groups).
// EXPECT: mom::Router<TopK<Sigmoid>, GroupLimited<G, M>>: G must divide the routed experts
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Model = LM<dims, DeepSeekMoEStack<2, 1, 7, 2, 4, GroupLimited<2, 1>>>;
int main() { return int(Model::params > 0); }

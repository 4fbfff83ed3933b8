// Rejected: MoDE staged whose experts' router keeps a selection bias: the depth executors do not apply its
// update between optimizer steps (assembly/depth_block.hpp).
// EXPECT: mom::ExpertRouter<Router<TopK<Sigmoid>>> \(MoDE staged\): the depth executors do not apply
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Model = LM<dims, MoDEStaged<2, 4, 2, 1, 2, 2, ExpertRouter<Router<TopK<Sigmoid>>>>>;
int main() { return int(Model::params > 0); }

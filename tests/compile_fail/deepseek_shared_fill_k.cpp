// Rejected: Router<TopK<Sigmoid>, SharedExperts<2>> with K<2>: the shared experts take every slot and no
// routed expert is picked (routers/affinity.hpp).
// EXPECT: mom::Router<TopK<Sigmoid>, SharedExperts<n>>: K<k> must exceed the shared experts n
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
using Model = LM<dims, DeepSeekMoEStack<2, 2, 6, 0, 4>>;
int main() { return int(Model::params > 0); }

// AttendToSkipped is a layer-skip option: a Mixture-of-Depths block attends among its selected tokens.
// EXPECT: AttendToSkipped is a layer-skip option
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 32, .heads = 2, .d_ff = 64, .vocab = 64, .context = 32};
using Arch = Assembly<Router<BlockChoice<Capacity<1, 4>, AttendToSkipped>>, ModuleSet<Block<2>, Skip>, K<1>, H<2>,
                      phi::LayerSkip>;
int main() { return int(LM<dims, Arch>::params); }

// Rejected at compile time: the GRU router with an assembling function it cannot execute.
// EXPECT: assembles with phi::MoM or phi::MoMRoutedKV
#include <mom/mom.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
namespace mine { struct Phi : phi::MoM {}; }
using Bad = Assembly<Router<GRU>, ModuleSet<MHA<4>, FFN<4>, Skip>, K<2>, H<6>, mine::Phi>;
static_assert(LM<dims, Bad>::params > 0);

// Rejected at compile time: MoM K5 over 4 modules plus SKIP is fine, K6 is not.
// EXPECT: K is larger than the number of selectable modules
#include <mom/models/mom_models.hpp>
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
static_assert(LM<dims, Strategy_11411<KaHbS<5, 2>>>::params > 0);
static_assert(LM<dims, Strategy_11411<KaHbS<6, 2>>>::params > 0);

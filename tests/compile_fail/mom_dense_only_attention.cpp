// Rejected at compile time: a sequence mixer with only the dense members (the grouped-query attention
// of tests/extending) in a MoM chunk, which runs attention over row groups.
// EXPECT: mom::RoutedSequenceMixer: missing `template <int G> struct GroupedSaved`
#include <mom/mom.hpp>
#include "../extending/gqa.hpp"
using namespace mom;
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
template <Dims D>
using GQA2 = ext::GroupedQuery<2>::type<D>;
using Bad = Assembly<Router<GRU>, ModuleSet<MHA<4, GQA2>, FFN<4>, Skip>, K<2>, H<4>>;
static_assert(LM<dims, Bad>::params > 0);

// describe<> spells a GRU router's options that differ from the defaults (routers/gru.hpp: Width<256>,
// Temperature<1, 5>, BalanceCoef<1, 100>, Renormalise<true>), so two models that differ only in their
// router options get different describe lines (they are written into checkpoints as mom.describe).
#include <catch2/catch.hpp>

#include <string>

#include "mom/models/mom_models.hpp"
#include "mom/mom.hpp"

using namespace mom;

namespace {
constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
template <class R>
std::string chunk_line() {
  return describe<LM<dims, KaHbS<2, 3, 3, R>>>();
}
}  // namespace

TEST_CASE("describe<> prints the GRU router's non-default options in the type's spelling", "[describe][gru]") {
  CHECK_THAT(chunk_line<Router<GRU>>(), Catch::Contains("Assembly<Router<GRU>, ModuleSet<MHA<3>, FFN<3>, Skip>"));
  using R1 = Router<GRU, Width<5>, Temperature<1, 2>, BalanceCoef<1, 10>>;
  CHECK_THAT(chunk_line<R1>(), Catch::Contains("Router<GRU, Width<5>, Temperature<1, 2>, BalanceCoef<1, 10>>, ModuleSet"));
  // Options are printed in a fixed order whatever the order written; integer ratios without "/ 1".
  using R2 = Router<GRU, Renormalise<false>, BalanceCoef<0>, Temperature<1>>;
  CHECK_THAT(chunk_line<R2>(), Catch::Contains("Router<GRU, Temperature<1>, BalanceCoef<0>, Renormalise<false>>, ModuleSet"));
  // The defaults spelled out are the defaults: Temperature<2, 10> = 1/5, Width<256>, Renormalise<true>.
  using R3 = Router<GRU, Width<256>, Temperature<2, 10>, Renormalise<true>, BalanceCoef<1, 100>>;
  CHECK_THAT(chunk_line<R3>(), Catch::Contains("Assembly<Router<GRU>, ModuleSet"));
  using R4 = Router<GRU, Width<64>>;
  CHECK(chunk_line<R4>() != chunk_line<Router<GRU>>());
}

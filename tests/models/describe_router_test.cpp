// describe<> spells a GRU router's options that differ from the defaults (routers/gru.hpp: Width<min(256, d_model)>,
// Temperature<1, 5>, BalanceCoef<1, 100>, Renormalise<true>), so two models that differ only in their
// router options get different describe lines (they are written into checkpoints as mom.describe).
#include <catch2/catch.hpp>

#include <string>
#include <type_traits>

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
  // The defaults spelled out are the defaults: Temperature<2, 10> = 1/5, Width<64> (= d_model 64 < 256),
  // Renormalise<true>.
  using R3 = Router<GRU, Width<64>, Temperature<2, 10>, Renormalise<true>, BalanceCoef<1, 100>>;
  CHECK_THAT(chunk_line<R3>(), Catch::Contains("Assembly<Router<GRU>, ModuleSet"));
  using R4 = Router<GRU, Width<256>>;
  CHECK(chunk_line<R4>() != chunk_line<Router<GRU>>());
  CHECK_THAT(chunk_line<R4>(), Catch::Contains("Router<GRU, Width<256>>"));
}

TEST_CASE("Router<GRU>'s default width follows the model: min(256, d_model)", "[describe][gru]") {
  using Cfg = GRUConfig<TypeList<>>;
  STATIC_REQUIRE(Cfg::width_for(8) == 8);
  STATIC_REQUIRE(Cfg::width_for(256) == 256);
  STATIC_REQUIRE(Cfg::width_for(768) == 256);
  STATIC_REQUIRE(GRUConfig<TypeList<Width<32>>>::width_for(768) == 32);
  // The router's parameters at d_model 64: two GRUs of width 64 (3·W·d + 3·W·W + 6·W) and their heads (E × W).
  constexpr index_t W = 64, d = 64;
  STATIC_REQUIRE(LM<dims, KaHbS<2, 3, 3, Router<GRU>>>::params - LM<dims, KaHbS<2, 3, 3, Router<GRU, Width<1>>>>::params ==
                 2 * (3 * (W - 1) * d + 3 * (W * W - 1) + 6 * (W - 1)) + (4 + 4) * (W - 1));
}

// BlockChoice (Mixture-of-Depths' router, routers/depth.hpp) was called ExpertChoice: describe<> keeps that
// spelling (its describe_name), so checkpoints written before the rename still load; the old name is a
// deprecated alias of the new one. The one use of the alias in the repository.
TEST_CASE("BlockChoice is described as ExpertChoice, and the deprecated ExpertChoice names BlockChoice",
          "[describe][mod]") {
  using MoD4 = LM<dims, MoD<4>>;
  CHECK_THAT(describe<MoD4>(),
             Catch::Contains("Assembly<Router<ExpertChoice<Capacity<1,8>, Every<2>>>, ModuleSet<Block<4>, Skip>, K<1>, "
                             "H<4>, phi::LayerSkip>"));
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  STATIC_REQUIRE(std::is_same_v<ExpertChoice<Capacity<1, 4>, Every<1>>, BlockChoice<Capacity<1, 4>, Every<1>>>);
#pragma GCC diagnostic pop
}

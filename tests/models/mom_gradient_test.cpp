// Mixture-of-Modules end to end in double: whole-model central finite differences through the
// GRU routers, the grouped dispatch and both attention key/value semantics, with routing fixed
// (the test proves that no top-K decision flips inside any finite difference).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "mom/models/mom_models.hpp"
#include "mom/mom.hpp"
#include "models/routed_gradient_check.hpp"

using namespace mom;

namespace {

using test::gradient_check;

constexpr Dims tiny{.d_model = 8, .heads = 2, .d_ff = 12, .vocab = 11, .context = 6};
using SmallRouter = Router<GRU, Width<5>, Temperature<1, 2>, BalanceCoef<1, 10>>;

}  // namespace

TEST_CASE("MoM: whole-model gradient equals finite differences (phi::MoM, K2H3S)", "[mom][gradcheck]") {
  gradient_check<LM<tiny, Chunked<Layer, KaHbS<2, 3, 3, SmallRouter>, Layer>>>(3, 4);
}

TEST_CASE("MoM: whole-model gradient equals finite differences (phi::MoMRoutedKV, K2H2S)", "[mom][gradcheck]") {
  gradient_check<LM<tiny, Chunked<KaHbS<2, 2, 3, SmallRouter, phi::MoMRoutedKV>, Layer>>>(4, 4);
}

TEST_CASE("MoM: gradient check without renormalisation and without SKIP (K1H2)", "[mom][gradcheck]") {
  using R = Router<GRU, Width<4>, Renormalise<false>>;
  gradient_check<LM<tiny, KaHb<1, 2, 2, R>>>(5, 2);
}

TEST_CASE("MoM with the router z-loss on both GRU routers: gradient equals finite differences", "[mom][gradcheck][zloss]") {
  using R = Router<GRU, Width<5>, Temperature<1, 2>, BalanceCoef<1, 10>, ZLoss<1, 5>>;
  gradient_check<LM<tiny, KaHbS<2, 2, 3, R>>>(6, 4);
}

// Mixture-of-Experts end to end in double: whole-model central finite differences through the
// top-K softmax routers (their LayerNorm and W, the balance loss), the grouped expert dispatch and
// the attention layers, with routing fixed (models/routed_gradient_check.hpp counts any top-K flip).
#include <catch2/catch.hpp>

#include "mom/models/moe_models.hpp"
#include "mom/mom.hpp"
#include "models/routed_gradient_check.hpp"

using namespace mom;

namespace {
using test::gradient_check;
constexpr Dims tiny{.d_model = 8, .heads = 2, .d_ff = 12, .vocab = 11, .context = 6};
using SmallRouter = Router<TopK<Softmax>, Temperature<1, 2>, BalanceCoef<1, 10>>;
}  // namespace

TEST_CASE("MoE: whole-model gradient equals finite differences (2 layers x 3 experts, top-2, between dense layers)",
          "[moe][gradcheck]") {
  gradient_check<LM<tiny, Chunked<Layer, MoEStack<2, 3, 2, SmallRouter>, Layer>>>(3, 3);
}

TEST_CASE("MoE(share): whole-model gradient equals finite differences (3 shared experts, top-2)", "[moe][gradcheck]") {
  gradient_check<LM<tiny, MoEShareStack<2, 3, 2, SmallRouter>>>(4, 3);
}

TEST_CASE("MoDE integrated: whole-model gradient equals finite differences (2 experts + Skip, top-2)",
          "[moe][gradcheck]") {
  gradient_check<LM<tiny, MoDEIntegrated<2, 2, 2, SmallRouter>>>(5, 3);
}

TEST_CASE("MoE: gradient check without renormalisation, top-1 (Switch style)", "[moe][gradcheck]") {
  gradient_check<LM<tiny, MoEStack<2, 3, 1, Router<TopK<Softmax>, Renormalise<false>>>>>(6, 3);
}

TEST_CASE("MoE with the router z-loss (ST-MoE): gradient equals finite differences, the objective includes it",
          "[moe][gradcheck][zloss]") {
  using ZRouter = Router<TopK<Softmax>, Temperature<1, 2>, BalanceCoef<1, 10>, ZLoss<1, 5>>;
  using Z = LM<tiny, MoEStack<2, 3, 2, ZRouter>>;
  using NoZ = LM<tiny, MoEStack<2, 3, 2, SmallRouter>>;
  gradient_check<Z>(4, 3);
  static_assert(Z::params == NoZ::params);
  auto z = Z::make<cpu::Backend<double>>(8);
  auto noz = NoZ::make<cpu::Backend<double>>(8);
  test::randomise(z, 9, 0.5);
  std::copy(z.params().begin(), z.params().end(), noz.params().begin());
  const auto tokens = test::random_tokens(12, tiny.vocab, 3), targets = test::random_tokens(12, tiny.vocab, 4);
  z.reserve(2, 6);
  noz.reserve(2, 6);
  const double with = z.forward(tokens, targets, 2, 6), without = noz.forward(tokens, targets, 2, 6);
  double zsum = 0;  // each step's z-loss, read from its selection
  for (const auto& step : std::get<0>(z.plan().parts).step) zsum += z.workspace_data()[step.gate.sel.zloss];
  CHECK(zsum > 0);
  CHECK(with == Approx(without + zsum).epsilon(1e-12));
}

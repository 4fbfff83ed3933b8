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

// Expert-choice MoE as a type (routers/expert_topc.hpp, models/moe_models.hpp): Router<TopC<Softmax>> over
// phi::MoE. Whole-model gradient in double (routing fixed); every expert takes exactly c = ⌊n·cf/E⌋ tokens;
// with cf = E every expert takes every token, which is TopK<Softmax> with K = E, no renormalisation and no
// balance loss (the same parameters, names and shapes); FLOPs executed equal the cost model for the realised
// routing; the decoder refuses it (tests/compile_fail/decode_expert_choice.cpp).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

#include "mom/mom.hpp"
#include "mom/models/routing_stats.hpp"
#include "models/counting_backend.hpp"
#include "models/routed_gradient_check.hpp"

using namespace mom;
using test::random_tokens;
using test::randomise;

namespace {
constexpr Dims tiny{.d_model = 8, .heads = 2, .d_ff = 12, .vocab = 11, .context = 6};
constexpr Dims dims{.d_model = 16, .heads = 2, .d_ff = 32, .vocab = 23, .context = 8};

template <class List>
struct first_of;
template <class F, class... R>
struct first_of<TypeList<F, R...>> {
  using type = F;
};
}  // namespace

TEST_CASE("expert-choice MoE: whole-model gradient equals finite differences", "[expert-choice][gradcheck]") {
  test::gradient_check<LM<tiny, ExpertChoiceMoEStack<2, 4>>>(3, 4);
  test::gradient_check<LM<tiny, Chunked<Layer, ExpertChoiceMoEStack<1, 3, 3, 2>>>>(4, 3);
  // With the router z-loss (ST-MoE eq. (5)) on its logits.
  test::gradient_check<LM<tiny, Assembly<Router<TopC<Softmax>, ZLoss<1, 2>>, ModuleSet<MHA<2>, Experts<FFN, 4, PerStep>>,
                                         K<4>, H<2>, phi::MoE>>>(5, 4);
}

TEST_CASE("expert-choice MoE: ZLoss adds the router z-loss, the routing unchanged", "[expert-choice]") {
  using Set = ModuleSet<MHA<1>, Experts<FFN, 4, PerStep>>;
  using Plain = LM<tiny, Assembly<Router<TopC<Softmax>>, Set, K<4>, H<1>, phi::MoE>>;
  using Z4 = LM<tiny, Assembly<Router<TopC<Softmax>, ZLoss<1, 4>>, Set, K<4>, H<1>, phi::MoE>>;
  using Z2 = LM<tiny, Assembly<Router<TopC<Softmax>, ZLoss<1, 2>>, Set, K<4>, H<1>, phi::MoE>>;
  static_assert(Plain::params == Z4::params && Plain::params == Z2::params);
  auto a = Plain::make<cpu::Backend<double>>(6);
  auto b = Z4::make<cpu::Backend<double>>(6);
  auto c = Z2::make<cpu::Backend<double>>(6);
  test::randomise(a, 7);
  std::copy(a.params().begin(), a.params().end(), b.params().begin());
  std::copy(a.params().begin(), a.params().end(), c.params().begin());
  const index_t batch = 3, seq = 6;
  a.reserve(batch, seq);
  b.reserve(batch, seq);
  c.reserve(batch, seq);
  const auto tokens = test::random_tokens(batch * seq, tiny.vocab, 8), targets = test::random_tokens(batch * seq, tiny.vocab, 9);
  const double la = a.forward(tokens, targets, batch, seq), lb = b.forward(tokens, targets, batch, seq),
               lc = c.forward(tokens, targets, batch, seq);
  // The same routing and cross-entropy: the difference is coef · mean (log Σ exp logits)², > 0 and linear in coef.
  CHECK(lb - la > 1e-6);
  CHECK(lc - la == Approx(2 * (lb - la)).epsilon(1e-10));
  CHECK(describe<Z4>().find("ZLoss<1, 4>") != std::string::npos);
}

TEST_CASE("expert-choice MoE: every expert takes exactly c tokens, cf = E is top-E softmax routing",
          "[expert-choice]") {
  using EC = LM<dims, ExpertChoiceMoEStack<2, 4>>;  // cf 2: c = n / 2
  using E0 = typename first_of<typename EC::core::executors>::type;
  auto m = EC::make<cpu::Backend<double>>(1);
  randomise(m, 2, 0.5);
  const index_t batch = 3, seq = 8, n = batch * seq;
  m.reserve(batch, seq);
  m.forward(random_tokens(n, dims.vocab, 4), random_tokens(n, dims.vocab, 5), batch, seq);
  std::vector<token_t> picks(std::size_t(n * 4));
  RoutingStats stats;
  stats.accumulate(m);
  REQUIRE(stats.routers.size() == 1);
  for (int h = 0; h < 2; ++h) {
    E0::read_picks(m.backend(), m.workspace_data(), std::get<0>(m.plan().parts), h, 0, n, std::span(picks));
    std::vector<int> load(5, 0), per_token(std::size_t(n), 0);
    for (index_t i = 0; i < n * 4; ++i) {
      ++load[std::size_t(picks[std::size_t(i)])];
      per_token[std::size_t(i / 4)] += picks[std::size_t(i)] < 4;
    }
    for (int e = 0; e < 4; ++e) CHECK(load[std::size_t(e)] == n / 2);  // c = ⌊24 · 2 / 4⌋
    CHECK(*std::min_element(per_token.begin(), per_token.end()) < 2);  // tokens get 0 .. E experts
    CHECK(*std::max_element(per_token.begin(), per_token.end()) > 2);
    // The routing statistics count the dropped tokens (taken by no expert) as idle.
    CHECK(stats.routers[0].idle[std::size_t(h)] == std::count(per_token.begin(), per_token.end(), 0));
  }

  using All = LM<dims, ExpertChoiceMoEStack<2, 4, 4>>;  // cf = E: every expert takes every token
  using TopE = LM<dims, MoEStack<2, 4, 4, Router<TopK<Softmax>, Renormalise<false>, BalanceCoef<0>>>>;
  static_assert(All::params == TopE::params);
  auto a = All::make<cpu::Backend<double>>(1);
  auto b = TopE::make<cpu::Backend<double>>(1);
  randomise(a, 6, 0.5);
  for (std::size_t i = 0; i < All::layout.size(); ++i) REQUIRE(All::layout[i].name == TopE::layout[i].name);
  std::copy(a.params().begin(), a.params().end(), b.params().begin());
  const auto tokens = random_tokens(n, dims.vocab, 7), targets = random_tokens(n, dims.vocab, 8);
  a.reserve(batch, seq);
  b.reserve(batch, seq);
  const double la = a.forward(tokens, targets, batch, seq), lb = b.forward(tokens, targets, batch, seq);
  CHECK(la == Approx(lb).epsilon(1e-13));
  a.zero_grad();
  b.zero_grad();
  a.backward();
  b.backward();
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < a.grads().size(); ++i) {
    worst = std::max(worst, std::abs(a.grads()[i] - b.grads()[i]));
    scale = std::max(scale, std::abs(b.grads()[i]));
  }
  CHECK(worst <= 1e-12 * scale);
}

TEST_CASE("expert-choice MoE: FLOPs executed equal the cost model for the realised routing", "[expert-choice][cost]") {
  using EC = LM<dims, ExpertChoiceMoEStack<2, 4>>;
  auto m = EC::make<test::CountingBackend<float>>(1);
  randomise(m, 2, 0.5);
  for (auto [batch, seq] : {std::pair<index_t, index_t>{2, 8}, {3, 5}}) {
    m.reserve(batch, seq);
    const auto tokens = random_tokens(batch * seq, dims.vocab, 3);
    m.backend().flops = 0;
    m.forward(tokens, tokens, batch, seq);
    CHECK(m.backend().flops == realised_forward_flops(m));
    CHECK(m.backend().flops <= EC::forward_flops(batch, seq));  // cf = 2 experts per token at most on average
  }
  static_assert(!infer::routes_causally<EC> && !infer::decodes<EC, cpu::Backend<float>>);
}

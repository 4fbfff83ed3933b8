// The proof that mom's vocabulary is open: a project outside the library (built against the installed
// package, find_package(mom)) adds (a) a token mixer, SwiGLU, used in a dense model and inside a MoM
// chunk; (b) a sequence mixer, grouped-query attention, used in a dense model; (c) two router policies
// for MoE expert steps, hash routing and a threshold router that gives tokens a variable number of
// experts. None of them touches include/. Each: gradient check in double (whole model, central
// differences; the new modules also alone, with their workspace guarded), the cost model's FLOPs equal the
// FLOPs executed (a counting backend), and 20 AdamW steps lower the loss. The checks are the installed kit's
// (<mom/testing.hpp>), asserted here with Catch2. docs/extending.md walks through the same code.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include <mom/models/mom_models.hpp>
#include <mom/mom.hpp>
#include <mom/testing.hpp>

#include "gqa.hpp"
#include "routers.hpp"
#include "swiglu.hpp"
#include "topk_experts.hpp"

using namespace mom;

namespace {
// Gradient checks: tiny shapes (every parameter is perturbed). Training: small ones.
constexpr Dims tiny{.d_model = 8, .heads = 2, .d_ff = 12, .vocab = 11, .context = 6};
constexpr Dims gqa_tiny{.d_model = 12, .heads = 4, .d_ff = 16, .vocab = 11, .context = 6};
constexpr Dims small{.d_model = 32, .heads = 4, .d_ff = 64, .vocab = 64, .context = 32};

template <Dims D>
using GQA2 = ext::GroupedQuery<2>::type<D>;  // 2 key/value heads

// (a) SwiGLU
using DenseSwiGLU = Assembly<Router<Sequential>, ModuleSet<MHA<2>, FFN<2, ext::SwiGLU>>, K<1>, H<2>>;
using MoMSwiGLU = Chunked<Layer, Assembly<Router<GRU>, ModuleSet<MHA<3>, FFN<3, ext::SwiGLU>, Skip>,
                                          K<2>, H<2>>>;
// (b) grouped-query attention
using DenseGQA = Assembly<Router<Sequential>, ModuleSet<MHA<2, GQA2>, FFN<2>>, K<1>, H<2>>;
// (c) routers
using HashMoE = Assembly<Router<ext::HashRouting>, ModuleSet<MHA<2>, Experts<FFN, 3, PerStep>>, K<1>, H<2>, phi::MoE>;
using ThresholdMoE =
    Assembly<Router<ext::ThresholdRouting<1, 2>>, ModuleSet<MHA<2>, Experts<FFN, 4, PerStep>>, K<3>, H<2>, phi::MoE>;

// (d) a module that routes rows itself, from the routing layer: 4 GELU experts of width 6, top-2
template <Dims D>
using TopKExperts4 = ext::TopKExperts<4, 2, 6>::type<D>;
using DenseTopKExperts = Assembly<Router<Sequential>, ModuleSet<MHA<2>, FFN<2, ext::TopKExperts<4, 2, 6>::type>>, K<1>, H<2>>;

static_assert(LM<tiny, DenseSwiGLU>::params == LM<tiny, Dense<2>>::params - 2 * (12 + 8) + 2 * 12 * 8);
static_assert(LM<gqa_tiny, DenseGQA>::params < LM<gqa_tiny, Dense<2>>::params);

// Whole-model central differences in double (routing held fixed for routed models).
template <class Model>
void gradient_checked(std::uint64_t seed, int min_classes_used = 0) {
  const testing::ModelGradientReport r = testing::gradient_check<Model>(seed);
  INFO(describe<Model>() << ": " << r.summary());
  CHECK(r.ok(0.005));
  CHECK(r.classes_used >= min_classes_used);
  if (min_classes_used == 0) CHECK(r.checked == int(Model::params));  // no routing: every parameter compared
}
// One module alone: its parameters and input, and no write outside its declared workspace and scratch.
template <class M>
void module_checked(std::uint64_t seed) {
  const testing::ModuleReport r = testing::module_gradient_check<M>(seed);
  INFO(r.summary());
  CHECK(r.ok());
  CHECK(r.checked == int(M::params) + 2 * 3 * int(M::d));
}

// The cost model against the FLOPs a counting backend executes (forward; routed: for the realised picks).
template <class Model>
void cost_matches(bool routed) {
  auto m = Model::template make<testing::CountingBackend<float>>(5);
  const index_t batch = 2, seq = 16;
  m.reserve(batch, seq);
  const auto tokens = testing::random_tokens(batch * seq, Model::dims.vocab, 1);
  const auto targets = testing::random_tokens(batch * seq, Model::dims.vocab, 2);
  m.backend().flops = 0;
  m.forward(tokens, targets, batch, seq);
  if (routed) {
    CHECK(m.backend().flops == realised_forward_flops(m));
    CHECK(m.backend().flops <= Model::forward_flops(batch, seq));
  } else {
    CHECK(m.backend().flops == Model::forward_flops(batch, seq));
    m.backend().flops = 0;
    m.backward();
    CHECK(m.backend().flops == Model::backward_flops_per_token(seq) * batch * seq);
  }
}

// 20 AdamW steps on a fixed, learnable batch: the loss goes down.
template <class Model>
void trains() {
  auto m = Model::template make<cpu::Backend<float>>(1);
  const index_t batch = 4, seq = 32;
  m.reserve(batch, seq);
  std::vector<token_t> tokens(std::size_t(batch * seq)), targets(tokens.size());
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = token_t((i * 7) % 23);
  for (std::size_t i = 0; i < tokens.size(); ++i) targets[i] = tokens[(i + 1) % tokens.size()];
  std::vector<float> m1(std::size_t(Model::params)), m2(std::size_t(Model::params));
  float first = 0, last = 0;
  for (int step = 1; step <= 20; ++step) {
    m.zero_grad();
    last = m.forward(tokens, targets, batch, seq);
    if (step == 1) first = last;
    m.backward();
    m.backend().adamw_step(m.params(), std::span<const float>(m.grads()), m1, m2, cpu::AdamWConfig{.lr = 3e-3}, step);
  }
  INFO(describe<Model>() << ": loss " << first << " -> " << last);
  CHECK(std::isfinite(last));
  CHECK(last < first - 0.5f);
}
}  // namespace

TEST_CASE("extending (a): SwiGLU in a dense model: gradient, cost, training", "[extending][swiglu]") {
  gradient_checked<LM<tiny, DenseSwiGLU>>(11);
  module_checked<ext::SwiGLU<tiny>>(21);
  cost_matches<LM<small, DenseSwiGLU>>(false);
  trains<LM<small, DenseSwiGLU>>();
  const std::string line = describe<LM<small, DenseSwiGLU>>();
  CHECK_THAT(line, Catch::Contains("FFN<2, SwiGLU>"));
}

TEST_CASE("extending (a): SwiGLU inside a MoM chunk: gradient (routing fixed), cost, training", "[extending][swiglu]") {
  gradient_checked<LM<tiny, MoMSwiGLU>>(12, 3);
  CHECK(testing::gradient_check<LM<tiny, MoMSwiGLU>>(12).max_router_grad > 1e-3);  // the router learns
  cost_matches<LM<small, MoMSwiGLU>>(true);
  trains<LM<small, MoMSwiGLU>>();
}

TEST_CASE("extending (d): a module that routes rows itself through the routing layer: gradient, cost, training",
          "[extending][routing]") {
  const testing::ModuleReport r = testing::module_gradient_check<TopKExperts4<tiny>>(24);
  INFO(r.summary());
  CHECK(r.ok());
  CHECK(r.checked > int(TopKExperts4<tiny>::params) / 2);  // only perturbations that flip a pick are skipped
  gradient_checked<LM<tiny, DenseTopKExperts>>(15, 2);
  cost_matches<LM<small, DenseTopKExperts>>(true);
  trains<LM<small, DenseTopKExperts>>();
  const std::string line = describe<LM<small, DenseTopKExperts>>();
  CHECK_THAT(line, Catch::Contains("FFN<2, TopKExperts>"));
}

TEST_CASE("extending (b): grouped-query attention in a dense model: gradient, cost, training", "[extending][gqa]") {
  gradient_checked<LM<gqa_tiny, DenseGQA>>(13);
  module_checked<GQA2<gqa_tiny>>(23);
  cost_matches<LM<small, DenseGQA>>(false);
  trains<LM<small, DenseGQA>>();
}

TEST_CASE("extending (c): hash routing: fixed experts per token id, gradient, cost, training", "[extending][router]") {
  using Model = LM<tiny, HashMoE>;
  auto m = Model::make<cpu::Backend<double>>(14);
  const testing::GradientCase c = testing::gradient_case(m, 14, 5);
  // The pick is the token id's hash, in every step.
  const auto picks = testing::all_picks(m);
  const std::size_t n = c.tokens.size();
  REQUIRE(picks.size() == 2 * n);
  for (std::size_t i = 0; i < n; ++i) {
    CHECK(picks[i] == token_t(ext::HashGate<tiny, 3, 1, false>::expert_of(c.tokens[i])));
    CHECK(picks[n + i] == picks[i]);
  }
  const testing::GradientReport t = testing::check_central_differences(
      m, c.grad, 1e-6, [&](const auto&) { return c.forward(m); }, [&] { return testing::all_picks(m); },
      [](const auto&, double, double) {});
  INFO(t.summary());
  CHECK(t.ok(0));
  CHECK(t.checked == int(Model::params));
  cost_matches<LM<small, HashMoE>>(true);
  trains<LM<small, HashMoE>>();
}

TEST_CASE("extending (c): threshold routing: a variable number of experts per token, gradient, cost, training",
          "[extending][router]") {
  using Model = LM<tiny, ThresholdMoE>;
  gradient_checked<Model>(15, 3);
  // Tokens do take different numbers of experts (1 .. K), and never an unused slot's class as an expert.
  auto m = Model::make<cpu::Backend<double>>(16);
  const testing::GradientCase c = testing::gradient_case(m, 16, 5);
  const auto picks = testing::all_picks(m);
  std::vector<int> per_token_counts(4, 0);
  for (std::size_t t = 0; t < picks.size() / 3; ++t) {
    int used = 0;
    for (int j = 0; j < 3; ++j) used += picks[t * 3 + j] < 4 ? 1 : 0;
    CHECK(used >= 1);
    ++per_token_counts[std::size_t(used)];
  }
  INFO("tokens taking 1, 2, 3 experts: " << per_token_counts[1] << ", " << per_token_counts[2] << ", "
                                         << per_token_counts[3]);
  CHECK(per_token_counts[1] > 0);
  CHECK(per_token_counts[2] + per_token_counts[3] > 0);
  cost_matches<LM<small, ThresholdMoE>>(true);
  trains<LM<small, ThresholdMoE>>();
}

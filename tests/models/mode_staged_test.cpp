// MoDE staged (MoD paper §4.3: Mixture-of-Depths routing before Mixture-of-Experts routing),
// assembly/depth.hpp with Experts<FFN, E, PerStep>: whole-model finite differences in double with
// both routers (the MoD router's top-C and each MoE step's top-k held fixed), the equivalence with
// MoEStack when the MoD router keeps every token with unit weight, and the forward FLOPs executed
// against the cost model.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "models/counting_backend.hpp"
#include "models/random_tokens.hpp"
#include "models/routed_gradient_check.hpp"
#include "mom/models/mom_models.hpp"
#include "mom/models/moe_models.hpp"
#include "mom/mom.hpp"

using namespace mom;
using test::random_tokens;
using test::randomise;

namespace {

constexpr Dims tiny{.d_model = 8, .heads = 2, .d_ff = 12, .vocab = 11, .context = 16};

// The executor of the model's only part.
template <class List>
struct first_of;
template <class T, class... Ts>
struct first_of<TypeList<T, Ts...>> {
  using type = T;
};
template <class Instance>
using Exec0 = typename first_of<typename Instance::model_type::core::executors>::type;

// Every routing decision of the last forward: per layer the MoD selection (routed layers), then the
// MoE step's picks over the rows that layer ran.
template <class Instance>
std::vector<token_t> routing(Instance& m) {
  using E = Exec0<Instance>;
  const auto& plan = std::get<0>(m.plan().parts);
  const index_t batch = m.batch(), seq = m.seq();
  std::vector<token_t> out;
  for (int h = 0; h < E::L; ++h) {
    index_t rows = batch * seq;
    if (E::routed(h)) {
      const auto sel = E::read_selected(m.backend(), m.workspace_data(), plan, h, batch, seq);
      out.insert(out.end(), sel.begin(), sel.end());
      rows = index_t(sel.size());
    }
    std::vector<token_t> picks(std::size_t(rows * E::Block::Step::real_k));
    E::Block::Step::read_picks(m.backend(), m.workspace_data(), plan.layer[std::size_t(h)].ffn, rows, std::span(picks));
    out.insert(out.end(), picks.begin(), picks.end());
  }
  return out;
}

template <class Model>
void gradient_check(std::uint64_t seed) {
  auto m = Model::template make<cpu::Backend<double>>(seed);
  const test::GradientCase c = test::gradient_case(m, seed, 8);
  double max_mod_router = 0, max_moe_router = 0;
  const test::FdTally t = test::check_central_differences(
      m, c.grad, 1e-6, [&](const auto&) { return c.forward(m); }, [&] { return routing(m); },
      [&](const auto& info, double, double g) {
        const std::string_view name(info.name);
        const bool mod_router = name.find("mod_router") != std::string_view::npos;
        if (mod_router) max_mod_router = std::max(max_mod_router, std::abs(g));
        if (!mod_router && name.find("router") != std::string_view::npos)
          max_moe_router = std::max(max_moe_router, std::abs(g));
      });
  INFO("checked " << t.checked << ", flipped " << t.flipped);
  CHECK(t.flipped <= t.checked / 100);
  CHECK(max_mod_router > 1e-4);  // the MoD router's weight r_i scales f(x̃)
  CHECK(max_moe_router > 1e-4);  // the MoE routers: expert weights and the balance loss
}

}  // namespace

TEST_CASE("MoDE staged: whole-model gradient equals finite differences, MoD and MoE routers included",
          "[mode][gradcheck]") {
  gradient_check<LM<tiny, MoDEStaged<4, 3, 2, 3, 8>>>(60);  // every 2nd layer routed, the others MoE over all
  gradient_check<LM<tiny, MoDEStaged<2, 4, 1, 1, 2, 1>>>(61);  // every layer routed, top-1
}

namespace {
// Staged with Capacity<1> and unit weights against the MoEStack `Stack` (same parameters by name).
template <class Stack, class Staged>
void check_against_stack(std::uint64_t seed) {
  auto stack = Stack::template make<cpu::Backend<double>>(seed);
  auto mode = Staged::template make<cpu::Backend<double>>(seed + 1);
  randomise(stack, seed + 2, 0.3);
  randomise(mode, seed + 3, 0.3);  // the MoD routers keep random weights: with Capacity<1> they select all
  for (const auto& p : Stack::layout) {  // every tensor of the stack, by name (MoEStack's names)
    const auto& q = Staged::find(p.name);
    REQUIRE(q.size() == p.size());
    std::copy_n(stack.params().begin() + p.offset, p.size(), mode.params().begin() + q.offset);
  }
  const index_t batch = 2, seq = 9;
  stack.reserve(batch, seq);
  mode.reserve(batch, seq);
  const auto tokens = random_tokens(batch * seq, tiny.vocab, seed + 4);
  const auto targets = random_tokens(batch * seq, tiny.vocab, seed + 5);
  stack.zero_grad();
  mode.zero_grad();
  const double ls = stack.forward(tokens, targets, batch, seq), lm = mode.forward(tokens, targets, batch, seq);
  CHECK(std::abs(ls - lm) < 1e-12);  // LM loss + the same balance losses
  const auto a = stack.logits(), b = mode.logits();
  double diff = 0;
  for (index_t i = 0; i < a.rows * a.cols; ++i) diff = std::max(diff, std::abs(a.data[i] - b.data[i]));
  CHECK(diff < 1e-12);
  stack.backward();
  mode.backward();
  for (const auto& p : Stack::layout) {
    const auto& q = Staged::find(p.name);
    double e = 0;
    for (index_t j = 0; j < p.size(); ++j)
      e = std::max(e, std::abs(stack.grads()[std::size_t(p.offset + j)] - mode.grads()[std::size_t(q.offset + j)]));
    INFO(p.name);
    CHECK(e < 1e-12);
  }
}
}  // namespace

TEST_CASE("MoDE staged with Capacity<1> and unit weights computes MoEStack (same parameters, same routing)",
          "[mode]") {
  using Stack = LM<tiny, MoEStack<3, 4, 2>>;
  using AllRouted = LM<tiny, MoDEStaged<3, 4, 2, 1, 1, 1, Weighting<RouterWeight::Unit>>>;
  using EveryOther = LM<tiny, MoDEStaged<3, 4, 2, 1, 1, 2, Weighting<RouterWeight::Unit>>>;
  static_assert(AllRouted::params == Stack::params + 3 * tiny.d_model);   // + one MoD router row per block
  static_assert(EveryOther::params == Stack::params + 1 * tiny.d_model);  // block 1 routed
  check_against_stack<Stack, AllRouted>(70);
  check_against_stack<Stack, EveryOther>(71);
}

TEST_CASE("MoDE staged: ExpertRouter<R> gives the MoE steps R's policy and options", "[mode]") {
  // The experts' router with non-default options: equal to the MoEStack with that router, and its gradient.
  using R = Router<TopK<Softmax>, Temperature<1, 2>, Renormalise<false>, BalanceCoef<1, 10>>;
  using Stack = LM<tiny, MoEStack<3, 4, 2, R>>;
  using Staged = LM<tiny, MoDEStaged<3, 4, 2, 1, 1, 1, Weighting<RouterWeight::Unit>, ExpertRouter<R>>>;
  check_against_stack<Stack, Staged>(72);
  // ... and not equal to the default router's model (the options do reach the gate).
  using Default = LM<tiny, MoDEStaged<3, 4, 2, 1, 1, 1, Weighting<RouterWeight::Unit>>>;
  auto a = Staged::make<cpu::Backend<double>>(73);
  auto b = Default::make<cpu::Backend<double>>(73);
  randomise(a, 74, 0.3);
  randomise(b, 74, 0.3);
  a.reserve(2, 9);
  b.reserve(2, 9);
  const auto tokens = random_tokens(18, tiny.vocab, 75), targets = random_tokens(18, tiny.vocab, 76);
  CHECK(std::abs(a.forward(tokens, targets, 2, 9) - b.forward(tokens, targets, 2, 9)) > 1e-6);
  gradient_check<LM<tiny, MoDEStaged<2, 4, 2, 1, 2, 1, ExpertRouter<R>>>>(62);
}

TEST_CASE("MoDE staged: forward FLOPs executed equal the cost model", "[mode][cost]") {
  using Model = LM<tiny, MoDEStaged<4, 3, 2, 1, 4>>;
  auto m = Model::make<test::CountingBackend<double>>(80);
  randomise(m, 81, 0.5);
  using E = Exec0<decltype(m)>;
  for (auto [batch, seq] : {std::pair<index_t, index_t>{2, 16}, {3, 7}, {1, 4}}) {
    m.reserve(batch, seq);
    const auto tokens = random_tokens(batch * seq, tiny.vocab, 82);
    m.backend().flops = 0;
    m.forward(tokens, tokens, batch, seq);
    INFO("batch " << batch << " seq " << seq);
    CHECK(m.backend().flops == realised_forward_flops(m));
    CHECK(m.backend().flops == batch * (E::flops_per_sequence(seq) + seq * 2 * tiny.d_model * tiny.vocab));
  }
  // The cost model by hand: a dense layer runs S tokens through attention and the MoE step (router
  // 2·d·E, k experts of 4·d·f), a routed layer C = S/4 tokens, plus its MoD score 2·d per token.
  constexpr index_t S = 16, C = 4, d = tiny.d_model, f = tiny.ff(), moe = 2 * d * 3 + 2 * 4 * d * f;
  constexpr index_t dense_layer = S * (8 * d * d + moe) + 2 * d * S * (S + 1);
  constexpr index_t routed_layer = C * (8 * d * d + moe) + 2 * d * C * (C + 1) + S * 2 * d;
  static_assert(E::flops_per_sequence(S) == 2 * dense_layer + 2 * routed_layer);
  static_assert(E::Block::params == 4 * (2 * d + 3 * d) && E::router_params == 2 * d);
}

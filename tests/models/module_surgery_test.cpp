// Module manipulation (models/module_surgery.hpp; ModuleFormer arXiv 2306.04640 §4.3, §5.3) in double:
// inserting modules keeps the trained model's function once the new modules are masked; a pruning mask
// removes modules from every token's choice; compaction into a smaller type computes exactly what the
// masked model computes, and refuses a layer that keeps more modules than the small type holds.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

#include "mom/models/module_surgery.hpp"
#include "mom/models/moduleformer_models.hpp"
#include "mom/mom.hpp"
#include "models/random_tokens.hpp"
#include "ops/grad_check.hpp"

using namespace mom;

namespace {
constexpr Dims tiny{.d_model = 8, .heads = 2, .d_ff = 12, .vocab = 11, .context = 8, .positions = Positions::None};
using Spec = ModuleFormerSpec<3, MoA<4, 2, 4, 3>, SMoE<5, 2, 6, 3>>;
using Base = LM<tiny, Spec::type>;
using Bigger = LM<tiny, Spec::inserted<2, 3, std::ratio<1, 10>>::type>;
using Small = LM<tiny, Spec::compacted<3, 4>::type>;
constexpr index_t B = 2, S = 8;

template <class Instance>
std::vector<double> logits_of(Instance& m, const std::vector<token_t>& tokens) {
  m.reserve(B, S);
  m.forward(tokens, {}, B, S);
  const auto l = m.logits().flat();
  return {l.begin(), l.end()};
}

// Every module pick of the last forward: [family][layer] → the n·k ids.
template <class Instance>
std::vector<std::vector<token_t>> picks_of(Instance& m) {
  using E = typename detail::SurgeryPart<typename Instance::model_type>::E;
  std::vector<std::vector<token_t>> out;
  const index_t n = m.batch() * m.seq();
  for (int router = 0; router < E::routing_routers; ++router)
    for (int h = 0; h < E::L; ++h) {
      std::vector<token_t> v(std::size_t(n * E::routing_info(router).k));
      E::read_picks(m.backend(), m.workspace_data(), std::get<0>(m.plan().parts), h, router, n, std::span(v));
      out.push_back(std::move(v));
    }
  return out;
}
}  // namespace

TEST_CASE("insert_modules: the trained weights move over, and with the new modules masked the model is unchanged",
          "[moduleformer][surgery]") {
  auto base = Base::make<cpu::Backend<double>>(1);
  test::randomise(base, 2, 0.3);
  auto big = Bigger::make<cpu::Backend<double>>(3);
  const std::vector<double> fresh(big.params().begin(), big.params().end());
  insert_modules(big, base);
  for (const auto& p : Base::layout) {
    const ParamInfo& q = Bigger::find(p.name);
    CHECK(std::equal(base.params().begin() + p.offset, base.params().begin() + p.offset + p.size(),
                     big.params().begin() + q.offset));
  }
  const ParamInfo& a_new = Bigger::find("h.1.smoe.router.w_a_new");  // fresh: the new model's own initialisation
  CHECK(std::equal(fresh.begin() + a_new.offset, fresh.begin() + a_new.offset + a_new.size(), big.params().begin() + a_new.offset));
  const auto tokens = test::random_tokens(B * S, tiny.vocab, 4);
  const std::vector<double> before = logits_of(base, tokens);
  CHECK(test::rel_error(logits_of(big, tokens), before) > 1e-6);  // the new modules take part
  PruneMask mask{{"attn", "ffn"}, {}};
  for (int f = 0; f < 2; ++f) {
    auto& fam = mask.keep.emplace_back();
    for (int layer = 0; layer < 3; ++layer) {
      std::vector<bool> keep(std::size_t(f == 0 ? 6 : 8), false);
      std::fill_n(keep.begin(), f == 0 ? 4 : 5, true);  // the old modules only
      fam.push_back(keep);
    }
  }
  apply_prune_mask(big, mask);
  CHECK(test::rel_error(logits_of(big, tokens), before) < 1e-12);
}

TEST_CASE("prune_mask and apply_prune_mask: pruned modules are never picked", "[moduleformer][surgery]") {
  auto m = Base::make<cpu::Backend<double>>(5);
  test::randomise(m, 6, 0.4);
  RoutingStats stats;
  for (std::uint64_t s = 0; s < 3; ++s) {
    logits_of(m, test::random_tokens(B * S, tiny.vocab, 10 + s));
    stats.accumulate(m);
  }
  const ModuleUsage usage = module_usage(stats);
  REQUIRE(usage.family == std::vector<std::string>{"attn", "ffn"});
  for (std::size_t f = 0; f < 2; ++f)
    for (const auto& layer : usage.normalised[f]) CHECK(*std::max_element(layer.begin(), layer.end()) == 1.0);
  const PruneMask none = prune_mask(usage, 0.0), all_but_k = prune_mask(usage, 1.0);
  CHECK(none.kept(0) == 3 * 4);
  CHECK(none.kept(1) == 3 * 5);
  CHECK(all_but_k.kept(0) == 3 * 2);  // at least k = 2 live modules per layer
  CHECK(all_but_k.kept(1) == 3 * 2);
  apply_prune_mask(m, all_but_k);
  logits_of(m, test::random_tokens(B * S, tiny.vocab, 20));
  const auto picks = picks_of(m);
  for (std::size_t i = 0; i < picks.size(); ++i) {
    const auto& keep = all_but_k.keep[i / 3][i % 3];
    for (token_t e : picks[i]) CHECK(keep[std::size_t(e)]);
  }
  CHECK_THROWS_WITH(prune_mask(usage, 1.5), Catch::Contains("threshold tau = 1.5"));
}

TEST_CASE("compact: the smaller type computes what the masked model computes, too many kept modules is an error",
          "[moduleformer][surgery]") {
  auto big = Bigger::make<cpu::Backend<double>>(7);
  test::randomise(big, 8, 0.4);
  PruneMask mask{{"attn", "ffn"}, {}};
  const std::vector<std::vector<int>> attn_keep{{0, 3, 5}, {1, 2}, {4, 5, 0}}, ffn_keep{{7, 1, 2, 3}, {0, 6}, {5, 4, 1}};
  for (const auto* lists : {&attn_keep, &ffn_keep}) {
    auto& fam = mask.keep.emplace_back();
    for (const auto& list : *lists) {
      std::vector<bool> keep(std::size_t(lists == &attn_keep ? 6 : 8), false);
      for (int e : list) keep[std::size_t(e)] = true;
      fam.push_back(keep);
    }
  }
  apply_prune_mask(big, mask);
  auto small = Small::make<cpu::Backend<double>>(9);
  compact(small, big, mask);
  const auto tokens = test::random_tokens(B * S, tiny.vocab, 12);
  CHECK(test::rel_error(logits_of(small, tokens), logits_of(big, tokens)) < 1e-12);
  static_assert(Small::params < Bigger::params);

  mask.keep[1][0][0] = true;  // layer 0 now keeps 5 FFN experts; Small holds 4
  CHECK_THROWS_WITH(compact(small, big, mask), Catch::Contains("layer 0 keeps 5 FFN modules; the compact type holds 4"));
}

TEST_CASE("RoutingStats::load: module shares, their coefficient of variation, SKIP apart", "[routing][zloss]") {
  RoutingStats::Router r;
  r.classes = 4;  // 3 modules + SKIP
  r.rounds = 2;
  r.skip = true;
  r.usage = {10, 10, 10, 30,  // round 0: balanced modules, half the picks SKIP
             30, 0, 0, 0};    // round 1: one module takes everything
  const auto a = RoutingStats::load(r, 0), b = RoutingStats::load(r, 1);
  CHECK(a.share == std::vector<double>{1.0 / 3, 1.0 / 3, 1.0 / 3});
  CHECK(a.cv == Approx(0.0).margin(1e-15));
  CHECK(a.skip_share == Approx(0.5));
  CHECK(b.max_share == 1.0);
  CHECK(b.cv == Approx(std::sqrt(2.0)));  // √(N − 1) for N = 3
  CHECK(b.skip_share == 0.0);
  // Tokens that ran no module in a round (idle; expert choice's dropped tokens), of all tokens.
  r.tokens = 40;
  r.idle = {6, 0};
  CHECK(RoutingStats::load(r, 0).idle_share == Approx(0.15));
  CHECK(RoutingStats::load(r, 1).idle_share == 0.0);
}

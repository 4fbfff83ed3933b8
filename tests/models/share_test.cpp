// Parameter sharing (MoM paper §3.5, eq. (10)): Router<Share<Cycle<G> | All | Blocks<G> | Map<...>>>.
// - the step -> module maps and the cost model (shared parameters once, FLOPs per use), at compile time;
// - Share<Cycle<L>> over L pairs is Dense<L>: same layout, bit-identical loss and gradients;
// - a shared module's gradient is the sum of its uses' gradients: the shared model against a Dense<H>
//   whose layer h is a copy of module c(h), loss equal and gradient = sum of the dense layers' gradients;
// - whole-model finite differences in double;
// - describe<> prints the sharing.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "models/routed_gradient_check.hpp"
#include "mom/mom.hpp"

using namespace mom;

namespace {

template <class Policy, int G, int Hs>
using Shared = Assembly<Router<Share<Policy>>, ModuleSet<MHA<G>, FFN<G>>, K<1>, H<Hs>>;

constexpr Dims tiny{.d_model = 8, .heads = 2, .d_ff = 12, .vocab = 11, .context = 6};
constexpr Dims small{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};

template <class A, Dims D = small>
constexpr auto route = A::template executor<D>::step_map;

// ---- step maps ---------------------------------------------------------------------------------
static_assert(route<Shared<Cycle<2>, 2, 8>> == std::array{0, 1, 0, 1, 0, 1, 0, 1});  // ABAB (MoEUT)
static_assert(route<Shared<Cycle<3>, 3, 7>> == std::array{0, 1, 2, 0, 1, 2, 0});
static_assert(route<Shared<Blocks<2>, 2, 8>> == std::array{0, 0, 0, 0, 1, 1, 1, 1});  // AABB
static_assert(route<Shared<All, 1, 4>> == std::array{0, 0, 0, 0});                    // ALBERT / UT
static_assert(route<Shared<Map<0, 1, 1, 0, 2>, 3, 5>> == std::array{0, 1, 1, 0, 2});
static_assert(route<Shared<Cycle<1>, 1, 4>> == route<Shared<All, 1, 4>>);

// ---- cost model: parameters once, FLOPs and activations per use --------------------------------
constexpr index_t layer_params = 12 * 64 * 64 + 13 * 64;  // d_ff = 4d
constexpr index_t outer_params = (256 + 64) * 64 + 2 * 64;  // wte, wpe, ln_f
using AllLM = LM<small, Shared<All, 1, 8>>;
using CycleLM = LM<small, Shared<Cycle<2>, 2, 8>>;
using BlocksLM = LM<small, Shared<Blocks<2>, 2, 8>>;
using Dense8LM = LM<small, Dense<8>>;
static_assert(AllLM::params == outer_params + 1 * layer_params);
static_assert(CycleLM::params == outer_params + 2 * layer_params);
static_assert(BlocksLM::params == CycleLM::params);
static_assert(Dense8LM::params == outer_params + 8 * layer_params);
static_assert(AllLM::depth == 1 && AllLM::steps == 8 && CycleLM::depth == 2 && CycleLM::steps == 8);
static_assert(AllLM::tensor_count == 4 + 12 && CycleLM::tensor_count == 4 + 24);
static_assert(AllLM::flops_per_token(64) == Dense8LM::flops_per_token(64));
static_assert(CycleLM::flops_per_token(17) == Dense8LM::flops_per_token(17));
static_assert(CycleLM::backward_flops_per_token(64) == Dense8LM::backward_flops_per_token(64));
static_assert(CycleLM::activation_elements(3, 64) == Dense8LM::activation_elements(3, 64));
// Chunks keep naming on from the shared part's depth (its G pairs), not its steps.
using ChunkedShare = LM<small, Chunked<Layer, Shared<Cycle<2>, 2, 6>, Layer>>;
static_assert(ChunkedShare::depth == 4 && ChunkedShare::steps == 8);
static_assert(ChunkedShare::find("h.3.mlp.w_fc").offset > ChunkedShare::find("h.2.attn.w_qkv").offset);
static_assert(ChunkedShare::params == outer_params + 4 * layer_params);

using test::random_tokens;

// Share<Cycle<L>> (and Blocks<L>, Map<0..L-1>) over L pairs with H<L> against Dense<L>.
template <class A, int L>
void check_equals_dense() {
  using S = LM<small, A>;
  using Dn = LM<small, Dense<L>>;
  static_assert(S::params == Dn::params && S::tensor_count == Dn::tensor_count && S::depth == Dn::depth);
  for (std::size_t i = 0; i < S::tensor_count; ++i) {
    CHECK(S::layout[i].name == Dn::layout[i].name);
    CHECK(S::layout[i].offset == Dn::layout[i].offset);
    CHECK(S::layout[i].rows == Dn::layout[i].rows);
    CHECK(S::layout[i].cols == Dn::layout[i].cols);
  }
  auto s = S::template make<cpu::Backend<float>>(7);
  auto dn = Dn::template make<cpu::Backend<float>>(7);
  REQUIRE(std::equal(s.params().begin(), s.params().end(), dn.params().begin()));
  const index_t batch = 2, seq = 32;
  s.reserve(batch, seq);
  dn.reserve(batch, seq);
  const auto tokens = random_tokens(batch * seq, small.vocab, 1), targets = random_tokens(batch * seq, small.vocab, 2);
  const float ls = s.forward(tokens, targets, batch, seq), ld = dn.forward(tokens, targets, batch, seq);
  CHECK(ls == ld);  // bit for bit: the same ops on the same data in the same order
  s.backward();
  dn.backward();
  CHECK(std::equal(s.grads().begin(), s.grads().end(), dn.grads().begin()));
}

// The shared model against Dense<H> whose layer h holds a copy of module pair c(h).
template <class A>
void check_gradient_is_sum_over_uses(std::uint64_t seed) {
  using S = LM<tiny, A>;
  constexpr int steps = A::h;
  using Dn = LM<tiny, Dense<steps>>;
  using Set = typename A::module_set;
  constexpr auto c = A::template executor<tiny>::step_map;
  constexpr index_t pair = Set::template attention_offset<tiny>(1);  // one attention + FFN pair
  static_assert(pair == Dense<1>::module_set::params<tiny>);
  constexpr index_t body_s = S::core::part_offset[0], body_d = Dn::core::part_offset[0];
  static_assert(body_s == body_d);  // wte, wpe first in both

  auto s = S::template make<cpu::Backend<double>>(seed);
  auto dn = Dn::template make<cpu::Backend<double>>(seed);
  std::mt19937_64 rng(seed + 3);
  std::normal_distribution<double> normal(0.0, 0.3);
  for (auto& p : s.params()) p = normal(rng);
  // Dense: wte, wpe, then layer h = pair c(h), then ln_f.
  auto sp = s.params();
  auto dp = dn.params();
  std::copy(sp.begin(), sp.begin() + body_s, dp.begin());
  for (int h = 0; h < steps; ++h)
    std::copy(sp.begin() + body_s + c[std::size_t(h)] * pair, sp.begin() + body_s + (c[std::size_t(h)] + 1) * pair,
              dp.begin() + body_d + h * pair);
  std::copy(sp.begin() + S::core::ln_f_offset, sp.end(), dp.begin() + Dn::core::ln_f_offset);

  const index_t batch = 2, seq = 5;
  s.reserve(batch, seq);
  dn.reserve(batch, seq);
  const auto tokens = random_tokens(batch * seq, tiny.vocab, seed + 1);
  const auto targets = random_tokens(batch * seq, tiny.vocab, seed + 2);
  const double ls = s.forward(tokens, targets, batch, seq), ld = dn.forward(tokens, targets, batch, seq);
  CHECK(ls == ld);
  s.backward();
  dn.backward();
  const auto sg = s.grads();
  const auto dg = dn.grads();

  // Expected shared gradient: wte / wpe / ln_f as is, pair j = sum over the steps h with c(h) = j.
  std::vector<double> expected(sg.size(), 0.0);
  std::copy(dg.begin(), dg.begin() + body_d, expected.begin());
  std::copy(dg.begin() + Dn::core::ln_f_offset, dg.end(), expected.begin() + S::core::ln_f_offset);
  for (int h = 0; h < steps; ++h)
    for (index_t i = 0; i < pair; ++i)
      expected[std::size_t(body_s + c[std::size_t(h)] * pair + i)] += dg[std::size_t(body_d + h * pair + i)];

  double max_err = 0, max_g = 0;
  for (std::size_t i = 0; i < sg.size(); ++i) {
    max_err = std::max(max_err, std::abs(sg[i] - expected[i]));
    max_g = std::max(max_g, std::abs(expected[i]));
  }
  INFO("max |shared - sum of dense| " << max_err << " (max |g| " << max_g << ")");
  CHECK(max_g > 1e-3);
  CHECK(max_err <= 1e-13 * max_g);
  // The sum is not trivially one use: a module used at several steps gets a gradient different from
  // any single use's.
  if (std::count(c.begin(), c.end(), c[0]) > 1) {
    double diff = 0;
    for (index_t i = 0; i < pair; ++i)
      diff = std::max(diff, std::abs(sg[std::size_t(body_s + c[0] * pair + i)] - dg[std::size_t(body_d + i)]));
    CHECK(diff > 1e-6);
  }
}

// Whole-model central finite differences over every parameter.
template <class A>
void gradient_check(std::uint64_t seed) {
  using Model = LM<tiny, A>;
  auto m = Model::template make<cpu::Backend<double>>(seed);
  const test::GradientCase c = test::gradient_case(m, seed, 5);
  double max_err = 0, max_g = 0;
  test::check_central_differences(
      m, c.grad, 1e-6, [&](const auto&) { return c.forward(m); }, test::no_routing,
      [&](const auto&, double fd, double g) {
        max_err = std::max(max_err, std::abs(fd - g));
        max_g = std::max(max_g, std::abs(fd));
      });
  INFO("max |backward - fd| " << max_err << ", max |fd| " << max_g);
  CHECK(max_g > 1e-2);
  CHECK(max_err < 1e-7 * max_g);
}

}  // namespace

TEST_CASE("Share<Cycle<L>>, Blocks<L>, Map<0..L-1> over L pairs equal Dense<L> (layout, loss, gradients)",
          "[share]") {
  check_equals_dense<Shared<Cycle<3>, 3, 3>, 3>();
  check_equals_dense<Shared<Blocks<3>, 3, 3>, 3>();
  check_equals_dense<Shared<Map<0, 1, 2>, 3, 3>, 3>();
  check_equals_dense<Shared<All, 1, 1>, 1>();
}

TEST_CASE("Share: a shared module's gradient is the sum of the dense layers' gradients over its uses", "[share]") {
  SECTION("Cycle<2>, H 4 (ABAB)") { check_gradient_is_sum_over_uses<Shared<Cycle<2>, 2, 4>>(11); }
  SECTION("All, H 3 (ALBERT)") { check_gradient_is_sum_over_uses<Shared<All, 1, 3>>(12); }
  SECTION("Blocks<2>, H 4 (AABB)") { check_gradient_is_sum_over_uses<Shared<Blocks<2>, 2, 4>>(13); }
  SECTION("Map<0, 1, 1, 0, 2>") { check_gradient_is_sum_over_uses<Shared<Map<0, 1, 1, 0, 2>, 3, 5>>(14); }
}

TEST_CASE("Share: whole-model gradient equals finite differences (double)", "[share][gradcheck]") {
  SECTION("Cycle<2>, H 4") { gradient_check<Shared<Cycle<2>, 2, 4>>(21); }
  SECTION("All, H 3") { gradient_check<Shared<All, 1, 3>>(22); }
  SECTION("Map<0, 1, 1, 0, 2> inside a Chunked") {
    gradient_check<Chunked<Layer, Shared<Map<0, 1, 1, 0, 2>, 3, 5>>>(23);
  }
}

TEST_CASE("Share: describe<> prints the sharing policy and c_share", "[share]") {
  const std::string d = describe<CycleLM>();
  INFO(d);
  CHECK(d.find("Router<Share<Cycle<2>>>, ModuleSet<MHA<2>, FFN<2>>, K<1>, H<8>>") != std::string::npos);
  CHECK(d.find("c_share=0,1,0,1,0,1,0,1") != std::string::npos);
  CHECK(d.find("depth 2, 8 steps") != std::string::npos);
  CHECK(describe<BlocksLM>().find("Share<Blocks<2>>") != std::string::npos);
  CHECK(describe<BlocksLM>().find("c_share=0,0,0,0,1,1,1,1") != std::string::npos);
  CHECK(describe<AllLM>().find("Share<All>") != std::string::npos);
  CHECK(describe<LM<small, Shared<Map<0, 1, 1, 0, 2>, 3, 5>>>().find("Share<Map<0, 1, 1, 0, 2>>") != std::string::npos);
  // The dense model's line is unchanged.
  CHECK(describe<Dense8LM>().find("Dense<8>: depth 8, 8 steps") != std::string::npos);
}

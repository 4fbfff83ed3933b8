// The MoM cost model: parameter counts with routers, worst-case FLOPs, realised FLOPs for the
// routing a forward actually took (counted op by op), the named configurations and strategies.
#include <catch2/catch.hpp>

#include <random>
#include <vector>

#include "mom/models/mom_models.hpp"
#include "mom/mom.hpp"
#include "models/random_tokens.hpp"
#include "models/counting_backend.hpp"

using namespace mom;

// ---- the named configurations ----------------------------------------------------------------
static_assert(std::is_same_v<MoM_P<>, Assembly<Router<GRU>, ModuleSet<MHA<4>, FFN<4>, Skip>, K<2>, H<6>>>);
static_assert(std::is_same_v<MoM_I<>, Assembly<Router<GRU>, ModuleSet<MHA<4>, FFN<4>, Skip>, K<3>, H<2>>>);
static_assert(std::is_same_v<MoM_E<>, Assembly<Router<GRU>, ModuleSet<MHA<4>, FFN<4>, Skip>, K<3>, H<1>>>);
static_assert(std::is_same_v<KaHbS<2, 6>, MoM_P<>>);

// ---- strategies keep the dense depth ----------------------------------------------------------
static_assert(LM<gpt2_small, MoMSmall<MoM_P<>>>::depth == gpt2_small_layers);
static_assert(LM<gpt2_medium, MoMMedium<MoM_P<>>>::depth == gpt2_medium_layers);
static_assert(LM<gpt2_large, MoMLarge<MoM_P<>>>::depth == gpt2_large_layers);
static_assert(LM<gpt2_large, MoMLargeAsPrinted<MoM_P<>>>::depth == 31);  // as printed in the paper
constexpr Dims d8{.d_model = 256, .heads = 8, .d_ff = 1024, .vocab = 512, .context = 256};
static_assert(LM<d8, Strategy_11411<MoM_P<>>>::depth == 8);

// ---- parameters: the dense model plus two GRU routers per chunk -------------------------------
// One router (width W, N + 1 classes): w_ih 3W·d, w_hh 3W·W, b_ih + b_hh 6W, w_out (N+1)·W.
constexpr index_t router_params(index_t W, index_t d, index_t E) { return 3 * W * d + 3 * W * W + 6 * W + E * W; }
static_assert(router_params(256, 768, 5) == 789'248);
static_assert(LM<gpt2_small, MoMSmall<MoM_P<>>>::params == GPT2Small::params + 2 * 2 * router_params(256, 768, 5));
static_assert(LM<gpt2_small, MoMSmall<MoM_P<>>>::params == 127'596'800);
static_assert(LM<gpt2_medium, MoMMedium<MoM_I<>>>::params == GPT2Medium::params + 4 * 2 * router_params(256, 1024, 5));
static_assert(LM<gpt2_large, MoMLarge<MoM_E<>>>::params == GPT2Large::params + 6 * 2 * router_params(256, 1280, 5));
// Without SKIP the heads have N rows; the width is an option.
static_assert(LM<d8, Strategy_11411<KaHb<2, 4, 4, Router<GRU, Width<64>>>>>::params ==
              LM<d8, Dense<8>>::params + 2 * router_params(64, 256, 4));

// ---- worst-case FLOPs per token ------------------------------------------------------------------
// Per round: two router steps, K attention queries (Q, O, causal attention), K/V projections of
// every attention module over every token (phi::MoM), K FFN passes.
constexpr index_t mom_round_flops(index_t d, index_t f, index_t W, index_t N, index_t K, index_t S, index_t E,
                                  bool routed_kv) {
  const index_t router = 2 * d * 3 * W + 2 * W * 3 * W + 2 * W * E;
  return 2 * router + (routed_kv ? K : N) * 4 * d * d + K * (4 * d * d + 2 * d * (S + 1)) + K * 4 * d * f;
}
using P8 = LM<d8, Strategy_11411<MoM_P<>>>;
static_assert(P8::flops_per_token(256) ==
              LM<d8, Dense<4>>::flops_per_token(256) +  // 4 plain layers + head
                  6 * mom_round_flops(256, 1024, 256, 4, 2, 256, 5, false));
static_assert(LM<d8, Strategy_11411<MoM_P<Router<GRU>, phi::MoMRoutedKV>>>::flops_per_token(256) ==
              LM<d8, Dense<4>>::flops_per_token(256) + 6 * mom_round_flops(256, 1024, 256, 4, 2, 256, 5, true));

namespace {

using test::CountingBackend;

using test::random_tokens;

template <class Model>
void check_executed_flops(std::uint64_t seed) {
  auto m = Model::template make<CountingBackend<float>>(seed);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  for (auto& p : m.params()) p = normal(rng);  // O(1) router weights: varied routing
  for (auto [batch, seq] : {std::pair<index_t, index_t>{2, 16}, {3, 7}, {1, 1}}) {
    m.reserve(batch, seq);
    const auto tokens = random_tokens(batch * seq, Model::dims.vocab, seed + 1);
    m.backend().flops = 0;
    m.forward(tokens, tokens, batch, seq);
    INFO("batch " << batch << " seq " << seq);
    CHECK(m.backend().flops == realised_forward_flops(m));
    CHECK(m.backend().flops <= Model::forward_flops(batch, seq));  // worst case bounds it
    if (batch * seq > 4) CHECK(m.backend().flops < Model::forward_flops(batch, seq));  // SKIP saved work
  }
}

}  // namespace

TEST_CASE("MoM: FLOPs executed equal the cost model for the realised routing (phi::MoM)", "[mom][cost]") {
  constexpr Dims dims{.d_model = 32, .heads = 4, .d_ff = 64, .vocab = 40, .context = 16};
  check_executed_flops<LM<dims, Chunked<Layer, KaHbS<2, 3, 4, Router<GRU, Width<8>>>, Layer>>>(1);
}

TEST_CASE("MoM: FLOPs executed equal the cost model for the realised routing (phi::MoMRoutedKV)", "[mom][cost]") {
  constexpr Dims dims{.d_model = 32, .heads = 4, .d_ff = 64, .vocab = 40, .context = 16};
  check_executed_flops<LM<dims, Chunked<KaHbS<3, 2, 4, Router<GRU, Width<8>>, phi::MoMRoutedKV>, Layer>>>(2);
}

TEST_CASE("MoM: describe names the chunking", "[mom][cost]") {
  const std::string s = describe<LM<d8, Strategy_11411<MoM_P<>>>>();
  CHECK(s.find("[1-1-4-1-1]") != std::string::npos);
  CHECK(s.find("Router<GRU>") != std::string::npos);
  CHECK(s.find("K<2>, H<6>") != std::string::npos);
}

// docs/design.md "A model is a type" (what a user writes), with the dense architecture in the chunk's
// place (tests/models/mom_model_test.cpp trains the GRU chunk itself): the type compiles, its parameter
// count is a compile-time constant, and it trains.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include <mom/mom.hpp>
using namespace mom;

constexpr Dims dims{.d_model = 256, .heads = 8, .d_ff = 1024, .vocab = 50257, .context = 256};

using Chunk = Dense<4>;  // later: Assembly<Router<GRU>, ModuleSet<MHA<4>, FFN<4>, Skip>, K<2>, H<6>>
using Arch = Chunked<Layer, Layer, Chunk, Layer, Layer>;  // strategy [1-1-4-1-1]
using Model = LM<dims, Arch>;

// wte 50257*256 + wpe 256*256 + 8 layers * (12*256^2 + 13*256) + ln_f 2*256
static_assert(Model::params == 19'249'920);
static_assert(Model::depth == 8);
static_assert(Model::params == LM<dims, Dense<8>>::params);

TEST_CASE("design.md example: the dense [1-1-4-1-1] model trains a few steps", "[model][example]") {
  auto model = Model::make<cpu::Backend<float>>(/*seed=*/1);
  const index_t batch = 2, seq = 32;
  model.reserve(batch, seq);
  // A fixed batch of text-like data: a repeating pattern the model can pick up quickly.
  std::vector<token_t> tokens(std::size_t(batch * seq)), targets(tokens.size());
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = token_t((i * 7919) % 97 + 100);
  for (std::size_t i = 0; i < tokens.size(); ++i) targets[i] = i + 1 < tokens.size() ? tokens[i + 1] : tokens[0];

  std::vector<float> m1(std::size_t(Model::params)), m2(std::size_t(Model::params));
  std::vector<float> losses;
  for (int step = 1; step <= 6; ++step) {
    model.zero_grad();
    losses.push_back(model.forward(tokens, targets, batch, seq));
    model.backward();
    model.backend().adamw_step(model.params(), std::span<const float>(model.grads()), m1, m2,
                               cpu::AdamWConfig{.lr = 1e-3}, step);
  }
  INFO("losses " << losses[0] << " ... " << losses.back());
  CHECK(losses[0] == Approx(std::log(50257.0)).epsilon(0.02));  // near-uniform prediction at init
  for (std::size_t i = 1; i < losses.size(); ++i) CHECK(losses[i] < losses[i - 1]);
  CHECK(losses.back() < losses[0] - 1.0f);
}

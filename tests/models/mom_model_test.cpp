// Mixture-of-Modules semantics: a GRU router forced into the sequential order reproduces the
// dense stack; a chunk whose routers always pick SKIP is the identity; permuting module
// storage together with the router's rows changes nothing; the FLOPs executed equal the cost
// model's figure for the realised routing; both attention key/value semantics; overfitting.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "mom/models/mom_models.hpp"
#include "mom/models/routing_stats.hpp"
#include "mom/models/warm_start.hpp"
#include "mom/mom.hpp"
#include "models/random_tokens.hpp"

using namespace mom;

namespace {

using test::random_tokens;

template <class Instance>
double& param_at(Instance& m, std::string_view name, index_t r, index_t c) {
  using Model = typename Instance::model_type;
  const auto& info = Model::find(name);
  return m.params()[static_cast<std::size_t>(info.offset + r * info.cols + c)];
}

// Copies every tensor of `to` that `from` has under the same name, with layer index
// shifted: to's h.<i> takes from's h.<map(i)>.
template <class A, class B, class Map>
void copy_by_name(const A& from, B& to, Map map) {
  using MA = typename A::model_type;
  using MB = typename B::model_type;
  for (const auto& info : MB::layout) {
    std::string name(info.name);
    if (name.rfind("h.", 0) == 0) {
      const auto dot = name.find('.', 2);
      name = "h." + std::to_string(map(std::stoi(name.substr(2, dot - 2)))) + name.substr(dot);
    }
    const auto it = std::find_if(MA::layout.begin(), MA::layout.end(), [&](const ParamInfo& p) { return p.name == name; });
    if (it == MA::layout.end()) continue;  // e.g. router tensors the dense model does not have
    const ParamInfo& src = *it;
    REQUIRE(src.size() == info.size());
    std::copy_n(from.params().begin() + src.offset, info.size(), to.params().begin() + info.offset);
  }
}

// Router parameters that make a GRU router pick module h at round h (h < N), for any input:
// w_ih = w_hh = 0, so the state follows its biases only. State dim 0 saturates at c0 (z ~ 0);
// dim 1 is s_h = c1 (1 - 2^-(h+1)) (z = 1/2). Logit i is the tangent line of u^2 at
// u_i = 1 - 2^-(i+1), evaluated at u = s_1 / c1, so the largest logit is the nearest u_i.
template <class Instance>
void force_sequential(Instance& m, const std::string& prefix, int N, int E) {
  const double c0 = std::tanh(1.0), c1 = std::tanh(1.0), scale = 50;
  using Model = typename Instance::model_type;
  for (const char* t : {".w_ih", ".w_hh", ".b_ih", ".b_hh", ".w_out"}) {
    const auto& info = Model::find(prefix + t);
    std::fill_n(m.params().begin() + info.offset, info.size(), 0.0);
  }
  const index_t W = 2;
  param_at(m, prefix + ".b_ih", 0, W + 0) = -30;  // z of dim 0: ~0
  param_at(m, prefix + ".b_ih", 0, 2 * W + 0) = 1;  // n of dim 0: tanh(1)
  param_at(m, prefix + ".b_ih", 0, 2 * W + 1) = 1;  // n of dim 1: tanh(1)
  for (int i = 0; i < N; ++i) {
    const double ui = 1 - std::pow(0.5, i + 1);
    param_at(m, prefix + ".w_out", i, 0) = -scale * ui * ui / c0;
    param_at(m, prefix + ".w_out", i, 1) = scale * 2 * ui / c1;
  }
  for (int i = N; i < E; ++i) param_at(m, prefix + ".w_out", i, 0) = -1000;  // never SKIP
}

}  // namespace

constexpr Dims dims{.d_model = 16, .heads = 2, .d_ff = 32, .vocab = 23, .context = 8};

TEST_CASE("MoM with a router forced into sequential order, K=1, H=N, computes the dense stack", "[mom]") {
  using R = Router<GRU, Width<2>, BalanceCoef<0>>;
  using Dense4 = LM<dims, Dense<4>>;
  using MoM4 = LM<dims, KaHb<1, 4, 4, R>>;
  using MoM4kv = LM<dims, KaHb<1, 4, 4, R, phi::MoMRoutedKV>>;
  auto dense = Dense4::make<cpu::Backend<double>>(8);
  auto mom = MoM4::make<cpu::Backend<double>>(1);
  auto momkv = MoM4kv::make<cpu::Backend<double>>(1);
  copy_by_name(dense, mom, [](int i) { return i; });
  copy_by_name(mom, momkv, [](int i) { return i; });
  force_sequential(mom, "h.0.router_attn", 4, 4);
  force_sequential(mom, "h.0.router_ffn", 4, 4);
  force_sequential(momkv, "h.0.router_attn", 4, 4);
  force_sequential(momkv, "h.0.router_ffn", 4, 4);
  const index_t batch = 3, seq = 8;
  for (auto* m : {&dense}) m->reserve(batch, seq);
  mom.reserve(batch, seq);
  momkv.reserve(batch, seq);
  const auto tokens = random_tokens(batch * seq, dims.vocab, 3);
  const auto targets = random_tokens(batch * seq, dims.vocab, 4);
  const double ld = dense.forward(tokens, targets, batch, seq);
  const double lm = mom.forward(tokens, targets, batch, seq);
  const double lk = momkv.forward(tokens, targets, batch, seq);
  // Round h picked module h for every token.
  std::vector<token_t> picks(std::size_t(batch * seq));
  using Ex = KaHb<1, 4, 4, R>::executor<dims>;
  for (int h = 0; h < 4; ++h)
    for (bool ffn : {false, true}) {
      Ex::read_picks(mom.backend(), mom.workspace_data(), std::get<0>(mom.plan().parts), h, ffn, batch * seq,
                     std::span(picks));
      for (token_t p : picks) REQUIRE(p == h);
    }
  for (index_t i = 0; i < batch * seq * dims.vocab; ++i) {
    REQUIRE(mom.logits().data[i] == Approx(dense.logits().data[i]).margin(1e-12));
    REQUIRE(momkv.logits().data[i] == Approx(dense.logits().data[i]).margin(1e-12));
  }
  CHECK(lm == Approx(ld).epsilon(1e-13));
  CHECK(lk == Approx(ld).epsilon(1e-13));
  dense.backward();
  mom.backward();
  for (const auto& info : Dense4::layout) {
    const auto& other = MoM4::find(info.name);
    for (index_t j = 0; j < info.size(); ++j)
      REQUIRE(mom.grads()[std::size_t(other.offset + j)] ==
              Approx(dense.grads()[std::size_t(info.offset + j)]).margin(1e-11));
  }
}

TEST_CASE("a chunk whose routers always pick SKIP leaves the residual stream unchanged", "[mom]") {
  using R = Router<GRU, Width<3>>;
  auto run = [&]<class Phi>(Phi) {
    using WithChunk = LM<dims, Chunked<Layer, KaHbS<1, 3, 3, R, Phi>, Layer>>;
    using Without = LM<dims, Chunked<Layer, Layer>>;
    auto a = WithChunk::template make<cpu::Backend<double>>(5);
    auto b = Without::template make<cpu::Backend<double>>(6);
    copy_by_name(a, b, [](int i) { return i == 0 ? 0 : 4; });  // b's h.1 is a's h.4
    for (const char* r : {"h.1.router_attn", "h.1.router_ffn"}) {
      // No path from the residual stream into the router (w_ih = 0), so the balance loss's
      // gradient cannot reach the other layers either.
      const auto& w_ih = WithChunk::find(std::string(r) + ".w_ih");
      std::fill_n(a.params().begin() + w_ih.offset, w_ih.size(), 0.0);
      // State s_h > 0 from the biases; only SKIP's row (the last, 3) of W_out is positive.
      param_at(a, std::string(r) + ".b_ih", 0, 2 * 3 + 0) = 2;
      param_at(a, std::string(r) + ".b_ih", 0, 2 * 3 + 1) = 2;
      param_at(a, std::string(r) + ".b_ih", 0, 2 * 3 + 2) = 2;
      for (int i = 0; i < 4; ++i)
        for (int c = 0; c < 3; ++c) param_at(a, std::string(r) + ".w_out", i, c) = i == 3 ? 5.0 : 0.0;
    }
    a.reserve(2, 8);
    b.reserve(2, 8);
    const auto tokens = random_tokens(16, dims.vocab, 7);
    const double la = a.forward(tokens, tokens, 2, 8);
    const double lb = b.forward(tokens, tokens, 2, 8);
    for (index_t i = 0; i < 16 * dims.vocab; ++i) REQUIRE(a.logits().data[i] == b.logits().data[i]);  // bitwise
    CHECK(la > lb);  // the balance loss of an all-SKIP routing is positive
    a.backward();
    b.backward();
    for (const char* name : {"h.0.attn.w_qkv", "wte", "ln_f.w"})
      for (index_t j = 0; j < 16; ++j)
        REQUIRE(a.grads()[std::size_t(WithChunk::find(name).offset + j)] ==
                b.grads()[std::size_t(Without::find(name).offset + j)]);
    // The skipped chunk's modules get no gradient.
    const auto& w = WithChunk::find("h.2.mlp.w_fc");
    CHECK(std::all_of(a.grads().begin() + w.offset, a.grads().begin() + w.offset + w.size(),
                      [](double g) { return g == 0.0; }));
  };
  run(phi::MoM{});
  run(phi::MoMRoutedKV{});
}

TEST_CASE("permuting module storage with the matching router rows changes nothing", "[mom]") {
  using R = Router<GRU, Width<4>, Temperature<1, 2>>;
  using Model = LM<dims, Chunked<Layer, KaHbS<2, 3, 3, R>>>;
  auto a = Model::make<cpu::Backend<double>>(11);
  std::mt19937_64 rng(2);
  std::normal_distribution<double> normal(0.0, 0.3);
  for (auto& p : a.params()) p = normal(rng);
  auto b = Model::make<cpu::Backend<double>>(11);
  std::copy(a.params().begin(), a.params().end(), b.params().begin());
  const int perm[3] = {2, 0, 1};  // module m of a is stored as module perm[m] in b
  using Ex = modules::Attention<dims>;
  using Fx = modules::FeedForward<dims>;
  using Set = ModuleSet<MHA<3>, FFN<3>, Skip>;
  const index_t base = Model::find("h.1.ln_1.w").offset;
  for (int m = 0; m < 3; ++m) {
    std::copy_n(a.params().begin() + base + Set::attention_offset<dims>(m), Ex::params,
                b.params().begin() + base + Set::attention_offset<dims>(perm[m]));
    std::copy_n(a.params().begin() + base + Set::ffn_offset<dims>(m), Fx::params,
                b.params().begin() + base + Set::ffn_offset<dims>(perm[m]));
    for (const char* r : {"h.1.router_attn.w_out", "h.1.router_ffn.w_out"})
      for (int c = 0; c < 4; ++c) param_at(b, r, perm[m], c) = param_at(a, r, m, c);
  }
  a.reserve(2, 8);
  b.reserve(2, 8);
  const auto tokens = random_tokens(16, dims.vocab, 12);
  const double la = a.forward(tokens, tokens, 2, 8);
  const double lb = b.forward(tokens, tokens, 2, 8);
  CHECK(la == Approx(lb).epsilon(1e-13));
  for (index_t i = 0; i < 16 * dims.vocab; ++i) REQUIRE(a.logits().data[i] == Approx(b.logits().data[i]).margin(1e-12));
  // And the storage really differs (the test is not vacuous).
  CHECK(!std::equal(a.params().begin(), a.params().end(), b.params().begin()));
  a.backward();
  b.backward();
  for (int m = 0; m < 3; ++m)
    for (index_t j = 0; j < Fx::params; j += 7)
      REQUIRE(a.grads()[std::size_t(base + Set::ffn_offset<dims>(m) + j)] ==
              Approx(b.grads()[std::size_t(base + Set::ffn_offset<dims>(perm[m]) + j)]).margin(1e-12));
}

TEST_CASE("the two attention key/value semantics agree when no token skips and differ when some do", "[mom]") {
  using R = Router<GRU, Width<4>, Temperature<1, 2>>;
  using All = LM<dims, KaHbS<2, 2, 3, R>>;
  using Routed = LM<dims, KaHbS<2, 2, 3, R, phi::MoMRoutedKV>>;
  auto a = All::make<cpu::Backend<double>>(21);
  auto b = Routed::make<cpu::Backend<double>>(21);
  std::mt19937_64 rng(3);
  std::normal_distribution<double> normal(0.0, 0.3);
  for (auto& p : a.params()) p = normal(rng);
  std::copy(a.params().begin(), a.params().end(), b.params().begin());
  a.reserve(2, 8);
  b.reserve(2, 8);
  const auto tokens = random_tokens(16, dims.vocab, 22);
  // Random routing: tokens skip and split over modules, so keys differ.
  CHECK(std::abs(a.forward(tokens, tokens, 2, 8) - b.forward(tokens, tokens, 2, 8)) > 1e-6);
  // K = N + 1 = 4 with SKIP: every token is routed to every module, so every module's keys are
  // all tokens under both semantics.
  using All4 = LM<dims, KaHbS<4, 2, 3, R>>;
  using Routed4 = LM<dims, KaHbS<4, 2, 3, R, phi::MoMRoutedKV>>;
  auto c = All4::make<cpu::Backend<double>>(21);
  auto e = Routed4::make<cpu::Backend<double>>(21);
  for (auto& p : c.params()) p = normal(rng);
  std::copy(c.params().begin(), c.params().end(), e.params().begin());
  c.reserve(2, 8);
  e.reserve(2, 8);
  CHECK(c.forward(tokens, tokens, 2, 8) == Approx(e.forward(tokens, tokens, 2, 8)).epsilon(1e-13));
}

TEST_CASE("overfitting one batch with a MoM_P model ([1-1-4-1-1], K2H6S) with AdamW", "[mom][train]") {
  constexpr Dims small{.d_model = 32, .heads = 4, .d_ff = 64, .vocab = 32, .context = 16};
  using Model = LM<small, Strategy_11411<MoM_P<Router<GRU, Width<16>>>>>;
  auto m = Model::make<cpu::Backend<float>>(42);
  const index_t batch = 4, seq = 16;
  m.reserve(batch, seq);
  const auto tokens = random_tokens(batch * seq, small.vocab, 100);
  const auto targets = random_tokens(batch * seq, small.vocab, 101);
  std::vector<float> m1(std::size_t(Model::params)), m2(std::size_t(Model::params));
  cpu::AdamWConfig cfg{.lr = 1e-2, .weight_decay = 0.0};
  float first = 0, loss = 0;
  int step = 1;
  for (; step <= 300; ++step) {
    m.zero_grad();
    loss = m.forward(tokens, targets, batch, seq);
    if (step == 1) first = loss;
    if (loss < 0.2f) break;
    m.backward();
    m.backend().adamw_step(m.params(), std::span<const float>(m.grads()), std::span<float>(m1), std::span<float>(m2),
                           cfg, step);
  }
  INFO("first loss " << first << ", loss " << loss << " after " << step << " steps");
  CHECK(first == Approx(std::log(32.0) + 0.01 * 2 * 6).epsilon(0.05));  // uniform + balance loss ~ coef per routing
  CHECK(loss < 0.2f);
}

TEST_CASE("routing statistics: usage per round and transitions between rounds", "[mom][stats]") {
  using R = Router<GRU, Width<2>, BalanceCoef<0>>;
  using Model = LM<dims, Chunked<Layer, KaHb<1, 4, 4, R>>>;
  auto m = Model::make<cpu::Backend<double>>(1);
  force_sequential(m, "h.1.router_attn", 4, 4);
  force_sequential(m, "h.1.router_ffn", 4, 4);
  m.reserve(2, 8);
  const auto tokens = random_tokens(16, dims.vocab, 5);
  RoutingStats stats;
  m.forward(tokens, {}, 2, 8);
  stats.accumulate(m);
  m.forward(std::span(tokens).first(8), {}, 1, 8);
  stats.accumulate(m);
  REQUIRE(stats.routers.size() == 2);
  for (const auto& r : stats.routers) {
    CHECK(r.tokens == 24);
    for (int h = 0; h < 4; ++h)
      for (int c = 0; c < 4; ++c) CHECK(r.usage[std::size_t(h * 4 + c)] == (c == h ? 24 : 0));  // module h in round h
    for (int a = 0; a < 4; ++a)
      for (int b = 0; b < 4; ++b) CHECK(r.transitions[std::size_t(a * 4 + b)] == (b == a + 1 ? 24 : 0));
  }
  CHECK(stats.routers[0].name == "part1.attn");
  const std::string json = stats.json();
  CHECK(json.find("\"name\": \"part1.ffn\"") != std::string::npos);
  CHECK(json.find("\"transitions\": [[0,24,0,0],[0,0,24,0],[0,0,0,24],[0,0,0,0]]") != std::string::npos);
  const std::string csv = stats.csv(1);
  CHECK(csv.rfind("from\\to,1,2,3,4\n1,0,24,0,0\n", 0) == 0);
}

TEST_CASE("routing statistics count K^2 transitions per token with SKIP as the last class", "[mom][stats]") {
  using Model = LM<dims, MoM_I<Router<GRU, Width<4>>>>;  // K3H2S
  auto m = Model::make<cpu::Backend<float>>(3);
  std::mt19937_64 rng(1);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  for (auto& p : m.params()) p = normal(rng);
  m.reserve(2, 8);
  const auto tokens = random_tokens(16, dims.vocab, 6);
  m.forward(tokens, {}, 2, 8);
  RoutingStats stats;
  stats.accumulate(m);
  for (const auto& r : stats.routers) {
    CHECK(r.classes == 5);
    long long used = 0, moves = 0;
    for (auto u : r.usage) used += u;
    for (auto t : r.transitions) moves += t;
    CHECK(used == 16 * 3 * 2);
    CHECK(moves == 16 * 3 * 3);
  }
  CHECK(stats.csv(0).find(",S\n") != std::string::npos);
}

TEST_CASE("warm_start copies a dense model into a MoM model of the same depth, routers stay fresh", "[mom]") {
  using DenseModel = LM<dims, Dense<8>>;
  using MoMModel = LM<dims, Strategy_11411<MoM_P<Router<GRU, Width<8>>>>>;
  auto dense = DenseModel::make<cpu::Backend<double>>(1);
  auto mom = MoMModel::make<cpu::Backend<double>>(2);
  const auto fresh = MoMModel::make<cpu::Backend<double>>(2);
  warm_start(mom, dense);
  for (const auto& p : DenseModel::layout) {
    const auto& q = MoMModel::find(p.name);
    REQUIRE(std::equal(dense.params().begin() + p.offset, dense.params().begin() + p.offset + p.size(),
                       mom.params().begin() + q.offset));
  }
  const auto& r = MoMModel::find("h.2.router_attn.w_ih");
  CHECK(std::equal(fresh.params().begin() + r.offset, fresh.params().begin() + r.offset + r.size(),
                   mom.params().begin() + r.offset));
  CHECK(MoMModel::params - DenseModel::params == 2 * (3 * 8 * 16 + 3 * 8 * 8 + 6 * 8 + 5 * 8));
}

TEST_CASE("MoM: smaller shapes than reserved give the same results, reruns are bit-identical", "[mom]") {
  using Model = LM<dims, Strategy_11411<MoM_P<Router<GRU, Width<8>>>>>;
  static_assert(Model::depth == 8 && Model::steps == 4 + 6);
  std::mt19937_64 rng(4);
  std::normal_distribution<float> normal(0.0f, 0.3f);
  auto a = Model::make<cpu::Backend<float>>(9);
  for (auto& p : a.params()) p = normal(rng);
  auto b = Model::make<cpu::Backend<float>>(9);
  std::copy(a.params().begin(), a.params().end(), b.params().begin());
  a.reserve(4, 8);
  b.reserve(2, 5);
  CHECK(a.workspace_size() == Model::activation_elements(4, 8));
  const auto tokens = random_tokens(10, dims.vocab, 8);
  const float la = a.forward(tokens, tokens, 2, 5);
  const float lb = b.forward(tokens, tokens, 2, 5);
  CHECK(la == lb);
  a.backward();
  b.backward();
  CHECK(std::equal(a.grads().begin(), a.grads().end(), b.grads().begin()));
  // Training twice from the same state gives bitwise the same losses.
  auto train = [&](auto& m) {
    std::vector<float> m1(std::size_t(Model::params)), m2(std::size_t(Model::params));
    std::vector<float> losses;
    cpu::AdamWConfig cfg{.lr = 3e-3, .weight_decay = 0.0};
    for (int step = 1; step <= 4; ++step) {
      const auto t = random_tokens(20, dims.vocab, std::uint64_t(step));
      m.zero_grad();
      losses.push_back(m.forward(t, t, 4, 5));
      m.backward();
      m.backend().adamw_step(m.params(), std::span<const float>(m.grads()), std::span<float>(m1), std::span<float>(m2),
                             cfg, step);
    }
    return losses;
  };
  auto c = Model::make<cpu::Backend<float>>(9);
  std::copy(b.params().begin(), b.params().end(), c.params().begin());
  c.reserve(4, 5);
  auto d = Model::make<cpu::Backend<float>>(9);
  std::copy(b.params().begin(), b.params().end(), d.params().begin());
  d.reserve(4, 5);
  CHECK(train(c) == train(d));
}

// Mixture-of-Recursions (assembly/recursion.hpp) in double: a hand-computed reference (naive loops
// over the nested selections), the special cases it must reduce to (every token at every recursion
// with unit weights: the recursive transformer, Router<Share<Cycle<B>>>; one recursion with raw
// weights: Mixture-of-Depths), middle-cycle's layout, whole-model finite-difference gradients, the
// FLOPs executed against the cost model, and the per-recursion statistics mom-train writes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "models/depth_test_support.hpp"
#include "models/naive_transformer.hpp"
#include "models/random_tokens.hpp"
#include "models/routed_gradient_check.hpp"
#include "mom/assembly/recursion.hpp"
#include "mom/models/depth_stats.hpp"
#include "mom/models/mom_models.hpp"
#include "mom/models/warm_start.hpp"
#include "mom/mom.hpp"

using namespace mom;
using test::logits_of;
using test::max_abs_diff;
using test::random_tokens;
using test::randomise;

namespace {

constexpr Dims tiny{.d_model = 8, .heads = 2, .d_ff = 12, .vocab = 11, .context = 16};
using Row = std::vector<double>;

std::vector<double> host(const auto& span) { return std::vector<double>(span.begin(), span.end()); }

using test::ExecOf;
using test::selections;

// MoR over Block<B> at layer names h.0..h.B-1, capacities caps[r] tokens per sequence (causal: run the
// candidates with a positive score, every one where caps[r] = seq), weight
// g = alpha·σ(l) (or alpha·l with raw), by naive loops: per sequence, the candidates of recursion r are the
// tokens recursion r−1 ran, the top caps[r] scores among them (ties by position) run the B layers in
// causal order among themselves, x += g·(y − x̃).
struct Naive : test::NaiveTransformer<tiny> {
  template <class Model>
  static std::vector<double> logits(const std::vector<double>& p, const std::vector<token_t>& tokens, index_t batch,
                                    index_t seq, int B, const std::vector<index_t>& caps, double alpha, bool raw,
                                    bool add_output = false, bool causal = false, bool share = false) {
    const std::size_t d = tiny.d_model;
    std::vector<Row> x = embed<Model>(p, tokens, batch, seq);
    for (index_t b = 0; b < batch; ++b) {
      std::vector<index_t> cand(static_cast<std::size_t>(seq));
      std::iota(cand.begin(), cand.end(), index_t(0));
      std::vector<std::vector<Row>> inputs0(static_cast<std::size_t>(B));  // KVShare: recursion 0's layer inputs
      for (std::size_t r = 0; r < caps.size(); ++r) {
        const double* w = at<Model>(p, "h.0.expert." + std::to_string(r) + ".router.w");
        std::vector<double> l(std::size_t(seq), 0.0);
        for (index_t s = 0; s < seq; ++s)
          for (std::size_t c = 0; c < d; ++c) l[s] += w[c] * x[b * seq + s][c];
        std::vector<index_t> S = cand;
        if (causal) {  // CausalRouting: the candidates whose score is positive (all of them at capacity 1)
          if (caps[r] < seq) S.erase(std::remove_if(S.begin(), S.end(), [&](index_t t) { return !(l[t] > 0); }), S.end());
        } else {
          std::stable_sort(S.begin(), S.end(), [&](index_t a, index_t c) { return l[a] > l[c]; });
          S.resize(std::size_t(caps[r]));
          std::sort(S.begin(), S.end());
        }
        std::vector<Row> xs;
        for (index_t s : S) xs.push_back(x[b * seq + s]);
        std::vector<Row> ys = xs;
        for (int j = 0; j < B; ++j) {
          if (share && r == 0) inputs0[std::size_t(j)] = ys;  // every token (capacity 1), in order
          ys = share && r > 0 ? block<Model>(p, j, ys, &inputs0[std::size_t(j)], &S) : block<Model>(p, j, ys);
        }
        for (std::size_t i = 0; i < S.size(); ++i) {
          const double g = alpha * (raw ? l[S[i]] : 1.0 / (1.0 + std::exp(-l[S[i]])));
          for (std::size_t c = 0; c < d; ++c) x[b * seq + S[i]][c] += g * (ys[i][c] - (add_output ? 0.0 : xs[i][c]));
        }
        cand = S;
      }
    }
    return head<Model>(p, x);
  }
};

using Mor23 = LM<tiny, MoR<2, 3, Alpha<1, 2>>>;  // 2 shared layers, 3 recursions: 3/3, 2/3, 1/3 of the tokens

// Two models that must compute the same function: the same loss (1e-12) and, for every tensor of a's layout,
// the same gradient in b's tensor of the mapped name.
template <class A, class B, class NameMap>
void expect_same_model(A& a, B& b, index_t batch, index_t seq, std::uint64_t seed, NameMap&& name_in_b) {
  a.reserve(batch, seq);
  b.reserve(batch, seq);
  const auto tokens = random_tokens(batch * seq, tiny.vocab, seed), targets = random_tokens(batch * seq, tiny.vocab, seed + 1);
  a.zero_grad();
  b.zero_grad();
  CHECK(std::abs(a.forward(tokens, targets, batch, seq) - b.forward(tokens, targets, batch, seq)) < 1e-12);
  CHECK(max_abs_diff(logits_of(a), logits_of(b)) < 1e-12);
  a.backward();
  b.backward();
  using MA = typename A::model_type;
  using MB = typename B::model_type;
  for (const auto& t : MA::layout) {
    const auto& q = MB::find(name_in_b(std::string(t.name)));
    INFO(t.name);
    CHECK(max_abs_diff(std::vector<double>(a.grads().begin() + t.offset, a.grads().begin() + t.offset + t.size()),
                       std::vector<double>(b.grads().begin() + q.offset, b.grads().begin() + q.offset + q.size())) < 1e-12);
  }
}
const auto same_name = [](const std::string& s) { return s; };
}  // namespace

TEST_CASE("MoR equals a hand-computed reference: nested top-k per recursion, shared block, sigmoid weights",
          "[recursion]") {
  static_assert(Mor23::params == LM<tiny, Dense<2>>::params + 3 * tiny.d_model);  // one block + a router per recursion
  auto m = Mor23::make<cpu::Backend<double>>(1);
  randomise(m, 2);
  for (auto [batch, seq] : {std::pair<index_t, index_t>{2, 16}, {3, 10}, {1, 4}}) {
    m.reserve(batch, seq);
    const auto tokens = random_tokens(batch * seq, tiny.vocab, 3 + seq);
    m.forward(tokens, {}, batch, seq);
    const std::vector<index_t> caps = {seq, seq * 2 / 3, seq / 3};
    INFO("batch " << batch << " seq " << seq);
    CHECK(max_abs_diff(logits_of(m), Naive::logits<Mor23>(host(m.params()), tokens, batch, seq, 2, caps, 0.5, false)) <
          1e-10);
    // k_r tokens of every sequence, ascending, and each recursion's tokens among the previous one's.
    const auto sel = selections(m);
    REQUIRE(sel.size() == 3);
    for (std::size_t r = 0; r < 3; ++r) {
      REQUIRE(index_t(sel[r].size()) == batch * caps[r]);
      CHECK(std::is_sorted(sel[r].begin(), sel[r].end()));
      for (index_t b = 0; b < batch; ++b)
        for (index_t j = 0; j < caps[r]; ++j) CHECK(sel[r][std::size_t(b * caps[r] + j)] / seq == b);
      if (r > 0) CHECK(std::includes(sel[r - 1].begin(), sel[r - 1].end(), sel[r].begin(), sel[r].end()));
    }
  }
  // Raw weights and explicit capacities.
  using Raw = LM<tiny, MoR<1, 2, Capacities<4, 3, 1>, Weighting<RouterWeight::Raw>>>;
  auto raw = Raw::make<cpu::Backend<double>>(3);
  randomise(raw, 4);
  raw.reserve(2, 12);
  const auto tokens = random_tokens(24, tiny.vocab, 5);
  raw.forward(tokens, {}, 2, 12);
  CHECK(max_abs_diff(logits_of(raw), Naive::logits<Raw>(host(raw.params()), tokens, 2, 12, 1, {9, 3}, 1.0, true)) < 1e-10);
  // The authors' update x + g·y (the block's output, residual included), with their α = 1/10.
  using Paper = LM<tiny, MoR<2, 3, AddBlockOutput, Alpha<1, 10>>>;
  auto paper = Paper::make<cpu::Backend<double>>(6);
  randomise(paper, 7);
  paper.reserve(2, 12);
  paper.forward(tokens, {}, 2, 12);
  CHECK(max_abs_diff(logits_of(paper),
                     Naive::logits<Paper>(host(paper.params()), tokens, 2, 12, 2, {12, 8, 4}, 0.1, false, true)) < 1e-10);
}

TEST_CASE("MoR with every token at every recursion and unit weights is the recursive transformer (Share<Cycle<B>>)",
          "[recursion]") {
  using Full = LM<tiny, MoR<2, 3, Capacities<1, 1, 1, 1>, Weighting<RouterWeight::Unit>>>;
  using Recursive = LM<tiny, Assembly<Router<Share<Cycle<2>>>, ModuleSet<MHA<2>, FFN<2>>, K<1>, H<6>>>;
  static_assert(Full::params == Recursive::params + 3 * tiny.d_model);
  auto rec = Recursive::make<cpu::Backend<double>>(6);
  auto mor = Full::make<cpu::Backend<double>>(7);
  randomise(rec, 8);
  warm_start(mor, rec);  // Block<2> has the names of MHA<2> + FFN<2>: h.<j>.attn.*, h.<j>.mlp.*
  expect_same_model(rec, mor, 2, 9, 9, same_name);
}

TEST_CASE("MoR with one recursion and raw weights is Mixture-of-Depths over one block", "[recursion]") {
  using One = LM<tiny, MoR<1, 1, Capacities<8, 3>, Weighting<RouterWeight::Raw>>>;
  using Mod = LM<tiny, MoD<1, 3, 8, 1>>;
  static_assert(One::params == Mod::params);
  auto mod = Mod::make<cpu::Backend<double>>(11);
  auto one = One::make<cpu::Backend<double>>(12);
  randomise(mod, 13);
  // Same layout but for the router's name: h.0.router.w vs h.0.expert.0.router.w.
  REQUIRE(One::find("h.0.expert.0.router.w").offset == Mod::find("h.0.router.w").offset);
  std::copy(mod.params().begin(), mod.params().end(), one.params().begin());
  expect_same_model(mod, one, 2, 16, 14, [](const std::string& s) {
    return s == "h.0.router.w" ? std::string("h.0.expert.0.router.w") : s;
  });
}

TEST_CASE("MoR middle-cycle: the first and last layers unshared, the layout of Dense<B + 2> plus the routers",
          "[recursion]") {
  using MC = LM<tiny, MoRMiddleCycle<2, 3>>;
  using Dense4 = LM<tiny, Dense<4>>;
  static_assert(MC::params == Dense4::params + 3 * tiny.d_model);
  for (const auto& t : Dense4::layout) CHECK(MC::find(t.name).size() == t.size());
  CHECK(std::string(MC::find("h.1.expert.2.router.w").name) == "h.1.expert.2.router.w");  // the block starts at h.1
  INFO(describe<MC>());
  CHECK(describe<MC>().find("Chunked[1-2-1](Layer, Assembly<Router<Recursion<>>, ModuleSet<Block<2>, Skip>, K<1>, H<3>, "
                            "phi::Recursion>, Layer)") != std::string::npos);
}

namespace {
// Whole-model central differences with the selections held fixed (a perturbation that changes one is a
// flip, skipped); the routers must receive gradient.
template <class Model, std::size_t Part = 0>
void gradient_check(std::uint64_t seed) {
  auto m = Model::template make<cpu::Backend<double>>(seed);
  const test::GradientCase c = test::gradient_case(m, seed, 9);
  double max_router_grad = 0;
  const test::FdTally t = test::check_central_differences(
      m, c.grad, 1e-6, [&](const auto&) { return c.forward(m); }, [&] { return selections<Part>(m); },
      [&](const auto& info, double, double g) {
        if (std::string_view(info.name).find("router") != std::string_view::npos)
          max_router_grad = std::max(max_router_grad, std::abs(g));
      });
  INFO("checked " << t.checked << ", flipped " << t.flipped);
  CHECK(t.checked > 500);
  CHECK(t.flipped <= t.checked / 200);
  CHECK(max_router_grad > 1e-4);
}
}  // namespace

TEST_CASE("MoR: whole-model gradient equals finite differences, routers included", "[recursion][gradcheck]") {
  gradient_check<Mor23>(20);
  gradient_check<LM<tiny, MoR<1, 3, CausalAux<1, 3>>>>(21);
  gradient_check<LM<tiny, MoR<2, 2, Capacities<4, 3, 2>, Weighting<RouterWeight::Raw>, Alpha<3, 2>>>>(22);
  gradient_check<LM<tiny, MoRMiddleCycle<1, 2, CausalAux<>>>, 1>(23);
  gradient_check<LM<tiny, MoR<2, 2, AddBlockOutput, Alpha<1, 10>>>>(24);
}

TEST_CASE("MoR: FLOPs executed equal the cost model, recursion r costing k_r/S of the block", "[recursion][cost]") {
  auto m = Mor23::make<cpu::Backend<double>>(30);
  randomise(m, 31);
  const index_t batch = 2, seq = 15;
  m.reserve(batch, seq);
  m.forward(random_tokens(batch * seq, tiny.vocab, 32), {}, batch, seq);
  const index_t n = batch * seq;
  using E = ExecOf<decltype(m)>;
  // The part's FLOPs per sequence exactly (flops_per_token rounds down), the rest of the model per token.
  CHECK(realised_forward_flops(m) == n * (Mor23::flops_per_token(seq) - E::flops_per_token(seq)) +
                                         batch * E::flops_per_sequence(seq));
  constexpr index_t S = 15, d = tiny.d_model, f = tiny.ff();
  constexpr auto layer = [](index_t k) { return k * (8 * d * d + 4 * d * f) + 2 * d * k * (k + 1); };
  static_assert(E::flops_per_sequence(S) == 2 * (layer(15) + layer(10) + layer(5)) + 3 * S * 2 * d);
}

TEST_CASE("MoR: DepthStats reports each recursion's run fraction and the causal decision's accuracy",
          "[recursion][stats]") {
  using Aux = LM<tiny, MoR<1, 3, CausalAux<1, 10>>>;
  auto m = Aux::make<cpu::Backend<double>>(40);
  randomise(m, 41);
  const index_t batch = 2, seq = 12;
  m.reserve(batch, seq);
  const auto tokens = random_tokens(batch * seq, tiny.vocab, 42), targets = random_tokens(batch * seq, tiny.vocab, 43);
  const double with_aux = m.forward(tokens, targets, batch, seq);
  DepthStats stats;
  stats.accumulate(m);
  REQUIRE(stats.layers.size() == 3);
  CHECK(stats.layers[0].run / stats.layers[0].tokens == Approx(1.0));
  CHECK(stats.layers[1].run / stats.layers[1].tokens == Approx(8.0 / 12));
  CHECK(stats.layers[2].run / stats.layers[2].tokens == Approx(4.0 / 12));
  CHECK(stats.layers[0].forwards == 0);  // capacity 1: nothing to predict
  CHECK(stats.layers[1].forwards == 1);
  const double acc = stats.causal_accuracy();
  CHECK(acc >= 0.0);
  CHECK(acc <= 1.0);
  // The model loss is the LM's plus 1/10 of the two BCEs (read back per recursion).
  using E = ExecOf<decltype(m)>;
  double bce = 0;
  for (const auto& c : E::read_causal(m.backend(), m.workspace_data(), std::get<0>(m.plan().parts), batch, seq))
    bce += c.bce;
  CHECK(stats.aux_loss() == Approx(bce / 10).epsilon(1e-12));
  CHECK(with_aux - stats.aux_loss() > 0);
}

TEST_CASE("MoR: a batch of two sequences equals each sequence alone", "[recursion]") {
  auto m = Mor23::make<cpu::Backend<double>>(50);
  randomise(m, 51);
  test::check_batch_independence(m, 12, 52, 53);
}

TEST_CASE("MoR with CausalRouting runs the candidates whose router score is positive, a variable count",
          "[recursion][causal]") {
  using Trained = MoR<2, 3, CausalAux<1, 10>>;
  using Sampling = LM<tiny, causal_sampling_arch<Trained>::type>;
  static_assert(std::is_same_v<causal_sampling_arch<Trained>::type, MoR<2, 3, CausalAux<1, 10>, CausalRouting>>);
  static_assert(Sampling::params == LM<tiny, Trained>::params);
  static_assert(!infer::routes_causally<LM<tiny, Trained>> && infer::routes_causally<Sampling>);
  auto m = Sampling::make<cpu::Backend<double>>(60);
  randomise(m, 61);
  const index_t batch = 3, seq = 13;
  m.reserve(batch, seq);
  const auto tokens = random_tokens(batch * seq, tiny.vocab, 62);
  m.forward(tokens, {}, batch, seq);
  CHECK(max_abs_diff(logits_of(m), Naive::logits<Sampling>(host(m.params()), tokens, batch, seq, 2, {seq, 8, 4}, 1.0,
                                                           false, false, true)) < 1e-10);
  // Nested, and the routed recursions both run and drop tokens.
  const auto sel = selections(m);
  CHECK(index_t(sel[0].size()) == batch * seq);
  for (std::size_t r = 1; r < 3; ++r) {
    INFO("recursion " << r << " ran " << sel[r].size());
    CHECK(std::includes(sel[r - 1].begin(), sel[r - 1].end(), sel[r].begin(), sel[r].end()));
    CHECK(sel[r].size() < sel[r - 1].size());
  }
  CHECK(!sel[1].empty());
  m.forward(tokens, random_tokens(batch * seq, tiny.vocab, 63), batch, seq);
  CHECK_THROWS_WITH(m.backward(), Catch::Contains("inference mode"));
}

namespace {
// Token-choice MoR by naive loops: the gate (LN_r, W [Nr × d], softmax, top-1 with ties to the lower depth)
// on the part's input picks each token's depth i and weight g; recursion r runs the tokens with i >= r in
// causal order among themselves, x += c·(y − x̃), c = g at r = i, 1 before.
std::vector<double> token_choice_logits(const auto& m, const std::vector<token_t>& tokens, index_t batch, index_t seq,
                                        int B, int Nr, std::vector<int>* depths = nullptr) {
  using Model = typename std::remove_cvref_t<decltype(m)>::model_type;
  using N = Naive;
  const std::vector<double> p = host(m.params());
  const std::size_t d = tiny.d_model;
  std::vector<Row> x = N::embed<Model>(p, tokens, batch, seq);
  std::vector<int> depth(x.size());
  std::vector<double> weight(x.size());
  for (std::size_t t = 0; t < x.size(); ++t) {
    const Row z = N::layernorm(x[t], N::at<Model>(p, "h.0.router.ln.w"), N::at<Model>(p, "h.0.router.ln.b"));
    const Row l = N::linear(z, N::at<Model>(p, "h.0.router.w"), nullptr, std::size_t(Nr));
    double mx = l[0], sum = 0;
    for (double v : l) mx = std::max(mx, v);
    for (double v : l) sum += std::exp(v - mx);
    depth[t] = int(std::max_element(l.begin(), l.end()) - l.begin());
    weight[t] = std::exp(l[std::size_t(depth[t])] - mx) / sum;
  }
  if (depths) *depths = depth;
  for (int r = 0; r < Nr; ++r)
    for (index_t b = 0; b < batch; ++b) {
      std::vector<index_t> S;
      for (index_t s = 0; s < seq; ++s)
        if (depth[std::size_t(b * seq + s)] >= r) S.push_back(b * seq + s);
      std::vector<Row> xs;
      for (index_t t : S) xs.push_back(x[std::size_t(t)]);
      std::vector<Row> ys = xs;
      for (int j = 0; j < B; ++j) ys = N::block<Model>(p, j, ys);
      for (std::size_t i = 0; i < S.size(); ++i) {
        const double c = depth[std::size_t(S[i])] == r ? weight[std::size_t(S[i])] : 1.0;
        for (std::size_t k = 0; k < d; ++k) x[std::size_t(S[i])][k] += c * (ys[i][k] - xs[i][k]);
      }
    }
  return N::head<Model>(p, x);
}
using TokenMor = LM<tiny, MoR<2, 3, TokenChoice<Router<TopK<Softmax>, Renormalise<false>, BalanceCoef<1, 10>>>>>;
}  // namespace

TEST_CASE("token-choice MoR equals a hand-computed reference: one depth per token, packed recursions",
          "[recursion][token-choice]") {
  auto m = TokenMor::make<cpu::Backend<double>>(70);
  randomise(m, 74, 0.6);  // a seed whose gate picks every depth (15, 5 and 8 tokens)
  const index_t batch = 2, seq = 14;
  m.reserve(batch, seq);
  const auto tokens = random_tokens(batch * seq, tiny.vocab, 72);
  m.forward(tokens, {}, batch, seq);
  std::vector<int> depth;
  CHECK(max_abs_diff(logits_of(m), token_choice_logits(m, tokens, batch, seq, 2, 3, &depth)) < 1e-10);
  // Every depth is chosen by some token, and recursion r runs exactly the tokens of depth >= r.
  for (int r = 0; r < 3; ++r) CHECK(std::count(depth.begin(), depth.end(), r) > 0);
  const auto sel = selections(m);
  for (int r = 0; r < 3; ++r) {
    std::vector<token_t> want;
    for (std::size_t t = 0; t < depth.size(); ++t)
      if (depth[t] >= r) want.push_back(token_t(t));
    CHECK(sel[std::size_t(r)] == want);
  }
  static_assert(infer::routes_causally<TokenMor>);
}

TEST_CASE("token-choice MoR with one recursion is the dense block stack", "[recursion][token-choice]") {
  using One = LM<tiny, MoR<2, 1, TokenChoice<Router<TopK<Softmax>, Renormalise<false>, BalanceCoef<0>>>>>;
  using Dense2 = LM<tiny, Dense<2>>;
  auto dense = Dense2::make<cpu::Backend<double>>(73);
  auto one = One::make<cpu::Backend<double>>(74);
  randomise(dense, 75);
  warm_start(one, dense);
  expect_same_model(dense, one, 2, 9, 76, same_name);
}

TEST_CASE("token-choice MoR: whole-model gradient equals finite differences, FLOPs executed equal the cost model",
          "[recursion][token-choice][gradcheck]") {
  gradient_check<TokenMor>(80);
  gradient_check<LM<tiny, MoRMiddleCycle<1, 3, TokenChoice<Router<TopK<Softmax>, Renormalise<false>, ZLoss<1, 10>>>,
                                         AddBlockOutput>>,
                 1>(81);
  auto m = TokenMor::make<cpu::Backend<double>>(82);
  randomise(m, 83, 0.6);
  const index_t batch = 2, seq = 11, n = batch * seq;
  m.reserve(batch, seq);
  m.forward(random_tokens(n, tiny.vocab, 84), {}, batch, seq);
  using E = ExecOf<decltype(m)>;
  const auto sel = selections(m);
  index_t expect = n * (TokenMor::flops_per_token(seq) - E::flops_per_token(seq)) + n * E::DGate::flops_per_token();
  for (const auto& s : sel) {
    std::vector<index_t> run(std::size_t(batch), 0), pairs(std::size_t(batch), 0);
    for (token_t t : s) pairs[std::size_t(t / seq)] += ++run[std::size_t(t / seq)];
    for (index_t b = 0; b < batch; ++b) expect += E::recursion_flops(seq, run[std::size_t(b)], pairs[std::size_t(b)]);
  }
  CHECK(realised_forward_flops(m) == expect);
  CHECK(sel[2].size() < sel[0].size());
}

TEST_CASE("MoR with KVShare: the deeper recursions attend to recursion 0's keys and values of every token",
          "[recursion][kv-share]") {
  using Share = LM<tiny, MoR<2, 3, KVShare, Alpha<1, 2>>>;
  static_assert(Share::params == Mor23::params);
  auto m = Share::make<cpu::Backend<double>>(90);
  randomise(m, 91);
  for (auto [batch, seq] : {std::pair<index_t, index_t>{2, 16}, {3, 10}}) {
    m.reserve(batch, seq);
    const auto tokens = random_tokens(batch * seq, tiny.vocab, 92 + seq);
    m.forward(tokens, {}, batch, seq);
    const std::vector<index_t> caps = {seq, seq * 2 / 3, seq / 3};
    INFO("batch " << batch << " seq " << seq);
    CHECK(max_abs_diff(logits_of(m), Naive::logits<Share>(host(m.params()), tokens, batch, seq, 2, caps, 0.5, false, false,
                                                          false, true)) < 1e-10);
    // Not recursion-wise caching: the same parameters without KVShare give other logits.
    auto own = Mor23::make<cpu::Backend<double>>(90);
    std::copy(m.params().begin(), m.params().end(), own.params().begin());
    own.reserve(batch, seq);
    own.forward(tokens, {}, batch, seq);
    CHECK(max_abs_diff(logits_of(m), logits_of(own)) > 1e-3);
  }
  // Causal routing under KVShare, against the naive reference.
  using Causal = LM<tiny, causal_sampling_arch<MoR<2, 3, KVShare, CausalAux<>>>::type>;
  auto c = Causal::make<cpu::Backend<double>>(93);
  randomise(c, 45);
  c.reserve(3, 13);
  const auto tokens = random_tokens(39, tiny.vocab, 94);
  c.forward(tokens, {}, 3, 13);
  CHECK(max_abs_diff(logits_of(c), Naive::logits<Causal>(host(c.params()), tokens, 3, 13, 2, {13, 8, 4}, 1.0, false,
                                                         false, true, true)) < 1e-10);
}

TEST_CASE("MoR with KVShare: gradients by finite differences, FLOPs executed equal the cost model",
          "[recursion][kv-share][gradcheck]") {
  gradient_check<LM<tiny, MoR<2, 3, KVShare>>>(95);
  gradient_check<LM<tiny, MoRMiddleCycle<1, 3, KVShare, CausalAux<1, 3>, Weighting<RouterWeight::Raw>>>, 1>(96);
  gradient_check<LM<tiny, MoR<2, 3, KVShare, TokenChoice<Router<TopK<Softmax>, Renormalise<false>>>>>>(97);
  using Share = LM<tiny, MoR<2, 3, KVShare>>;
  auto m = Share::make<cpu::Backend<double>>(98);
  randomise(m, 99);
  const index_t batch = 2, seq = 15, n = batch * seq;
  m.reserve(batch, seq);
  m.forward(random_tokens(n, tiny.vocab, 100), {}, batch, seq);
  using E = ExecOf<decltype(m)>;
  index_t expect = n * (Share::flops_per_token(seq) - E::flops_per_token(seq));
  const auto sel = selections(m);
  for (std::size_t r = 0; r < sel.size(); ++r) {
    std::vector<index_t> run(std::size_t(batch), 0), pairs(std::size_t(batch), 0);
    for (token_t t : sel[r]) {
      ++run[std::size_t(t / seq)];
      pairs[std::size_t(t / seq)] += r == 0 ? run[std::size_t(t / seq)] : t % seq + 1;
    }
    for (index_t b = 0; b < batch; ++b)
      expect += r == 0 ? E::recursion_flops(seq, run[std::size_t(b)], pairs[std::size_t(b)])
                       : E::shared_recursion_flops(seq, run[std::size_t(b)], pairs[std::size_t(b)]);
  }
  CHECK(realised_forward_flops(m) == expect);
  // The cost model's bound: the k_r run tokens at the last positions.
  CHECK(E::flops_per_sequence(seq) * batch >= realised_forward_flops(m) - n * (Share::flops_per_token(seq) - E::flops_per_token(seq)));
}

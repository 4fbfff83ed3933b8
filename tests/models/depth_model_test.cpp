// Mixture-of-Depths, layer-skip and early-exit (assembly/depth.hpp) end to end in double:
// a hand-computed reference of MoD (naive loops over the selected tokens), the equivalences with
// the dense stack, the known bugs of public MoD implementations ruled out one by one, early-exit
// monotonicity, the FLOPs executed against the cost model, whole-model finite-difference
// gradients, and the causal-sampling predictor's accuracy.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "models/counting_backend.hpp"
#include "models/depth_test_support.hpp"
#include "models/naive_transformer.hpp"
#include "models/random_tokens.hpp"
#include "models/routed_gradient_check.hpp"
#include "mom/models/depth_stats.hpp"
#include "mom/models/mom_models.hpp"
#include "mom/models/warm_start.hpp"
#include "mom/mom.hpp"

using namespace mom;
using test::logits_of;
using test::max_abs_diff;
using test::random_tokens;
using test::randomise;
using test::selections;

namespace {

constexpr Dims tiny{.d_model = 8, .heads = 2, .d_ff = 12, .vocab = 11, .context = 16};

// ---- a hand-computed Mixture-of-Depths forward (naive loops, no library op) ----------------
using Row = std::vector<double>;

struct Naive : test::NaiveTransformer<tiny> {
  // Logits of LM<tiny, MoD> with capacity C tokens per sequence and routing on layers `routed`.
  template <class Model>
  static std::vector<double> mod_logits(const std::vector<double>& p, const std::vector<token_t>& tokens, index_t batch,
                                        index_t seq, index_t C, const std::vector<bool>& routed, bool unit_weight,
                                        bool causal = false) {
    const std::size_t d = tiny.d_model;
    std::vector<Row> x = embed<Model>(p, tokens, batch, seq);
    for (int layer = 0; layer < int(routed.size()); ++layer) {
      for (index_t b = 0; b < batch; ++b) {
        std::vector<index_t> S(static_cast<std::size_t>(seq));  // positions of sequence b the block runs on
        std::iota(S.begin(), S.end(), index_t(0));
        std::vector<double> r(std::size_t(seq), 1.0);
        if (routed[layer]) {
          const double* w = at<Model>(p, "h." + std::to_string(layer) + ".router.w");
          for (index_t s = 0; s < seq; ++s) {
            r[s] = 0;
            for (std::size_t c = 0; c < d; ++c) r[s] += w[c] * x[b * seq + s][c];
          }
          if (causal) {  // the causal decision: every token whose score is positive
            S.erase(std::remove_if(S.begin(), S.end(), [&](index_t s) { return !(r[s] > 0); }), S.end());
          } else {
            std::stable_sort(S.begin(), S.end(), [&](index_t a, index_t c) { return r[a] > r[c]; });
            S.resize(std::size_t(C));
            std::sort(S.begin(), S.end());  // original order; positions are never recomputed
          }
        }
        std::vector<Row> xs;
        for (index_t s : S) xs.push_back(x[b * seq + s]);
        const auto ys = block<Model>(p, layer, xs);
        for (std::size_t j = 0; j < S.size(); ++j) {
          const double wgt = routed[layer] && !unit_weight ? r[S[j]] : 1.0;
          Row& xr = x[b * seq + S[j]];
          for (std::size_t c = 0; c < d; ++c) xr[c] += wgt * (ys[j][c] - xs[j][c]);  // x + r·f, f = block(x̃) - x̃
        }
      }
    }
    return head<Model>(p, x);
  }
};

// The executor of the model's only part (the tests use a single Assembly as the architecture).
template <class Instance>
using Exec0 = test::ExecOf<Instance>;

using ModTiny = LM<tiny, MoD<4, 3, 8>>;  // capacity 3/8, blocks 1 and 3 routed
}  // namespace

TEST_CASE("MoD equals a hand-computed reference: exactly C tokens, residual once, batch offset, positions kept",
          "[depth][mod]") {
  auto m = ModTiny::make<cpu::Backend<double>>(1);
  randomise(m, 2);
  const std::vector<bool> routed = {false, true, false, true};
  for (auto [batch, seq] : {std::pair<index_t, index_t>{2, 16}, {3, 13}, {1, 3}}) {
    m.reserve(batch, seq);
    const auto tokens = random_tokens(batch * seq, tiny.vocab, 3 + seq);
    m.forward(tokens, {}, batch, seq);
    const index_t C = seq * 3 / 8;
    INFO("batch " << batch << " seq " << seq << " C " << C);
    const std::vector<double> want =
        Naive::mod_logits<ModTiny>(std::vector<double>(m.params().begin(), m.params().end()), tokens, batch, seq, C,
                                   routed, false);
    CHECK(max_abs_diff(logits_of(m), want) < 1e-10);
    // Exactly C (not C - 1) tokens of every sequence, flat indices b·seq + position, ascending.
    for (const auto& sel : selections(m)) {
      REQUIRE(index_t(sel.size()) == batch * C);
      for (index_t b = 0; b < batch; ++b)
        for (index_t j = 0; j < C; ++j) {
          const token_t t = sel[std::size_t(b * C + j)];
          CHECK(t / seq == b);
          if (j > 0) CHECK(t > sel[std::size_t(b * C + j - 1)]);
        }
    }
  }
}

TEST_CASE("MoD: a batch of two different sequences equals each sequence run alone", "[depth][mod]") {
  auto m = ModTiny::make<cpu::Backend<double>>(4);
  randomise(m, 5);
  test::check_batch_independence(m, 16, 6, 7);
}

TEST_CASE("MoD with Capacity<1>, every block routed and unit weights computes the dense stack", "[depth][mod]") {
  using Full = LM<tiny, Assembly<Router<BlockChoice<Capacity<1>, Every<1>, Weighting<RouterWeight::Unit>>>,
                                 ModuleSet<Block<3>, Skip>, K<1>, H<3>, phi::LayerSkip>>;
  using Dense3 = LM<tiny, Dense<3>>;
  static_assert(Full::params == Dense3::params + 3 * tiny.d_model);  // + one router row per block
  auto dense = Dense3::make<cpu::Backend<double>>(8);
  auto mod = Full::make<cpu::Backend<double>>(9);
  randomise(dense, 10);
  warm_start(mod, dense);  // Block<3> has the names of Dense<3>: h.<i>.attn.*, h.<i>.mlp.*
  const index_t batch = 2, seq = 11;
  dense.reserve(batch, seq);
  mod.reserve(batch, seq);
  const auto tokens = random_tokens(batch * seq, tiny.vocab, 11), targets = random_tokens(batch * seq, tiny.vocab, 12);
  const double ld = dense.forward(tokens, targets, batch, seq), lm = mod.forward(tokens, targets, batch, seq);
  CHECK(std::abs(ld - lm) < 1e-12);
  CHECK(max_abs_diff(logits_of(dense), logits_of(mod)) < 1e-12);
  dense.backward();
  mod.backward();
  for (const auto& p : Dense3::layout) {
    const auto& q = Full::find(p.name);
    const std::vector<double> gd(dense.grads().begin() + p.offset, dense.grads().begin() + p.offset + p.size());
    const std::vector<double> gm(mod.grads().begin() + q.offset, mod.grads().begin() + q.offset + q.size());
    INFO(p.name);
    CHECK(max_abs_diff(gd, gm) < 1e-12);
  }
}

TEST_CASE("layer-skip: a criterion that never skips computes the dense stack, a saturated gate nearly so",
          "[depth][skip]") {
  using Dense3 = LM<tiny, Dense<3>>;
  using NeverSkip = LM<tiny, Assembly<Router<Skipping<Never>>, ModuleSet<MHA<3>, FFN<3>, Skip>, K<1>, H<3>, phi::LayerSkip>>;
  using Gate = LM<tiny, LayerSkipping<3>>;
  // With AttendToSkipped (keys from every token, Q from the run rows) the same must hold.
  using NeverSkipAll = LM<tiny, Assembly<Router<Skipping<Never, AttendToSkipped>>, ModuleSet<MHA<3>, FFN<3>, Skip>, K<1>,
                                         H<3>, phi::LayerSkip>>;
  static_assert(NeverSkip::params == Dense3::params && NeverSkipAll::params == Dense3::params);
  auto dense = Dense3::make<cpu::Backend<double>>(13);
  randomise(dense, 14);
  auto never = NeverSkip::make<cpu::Backend<double>>(15);
  auto gate = Gate::make<cpu::Backend<double>>(16);
  warm_start(never, dense);
  warm_start(gate, dense);
  for (int h = 0; h < 3; ++h) {  // w = 0, b = 40: σ = 1 - 4e-18, every token runs
    const auto& w = Gate::find("h." + std::to_string(h) + ".router.w");
    std::fill_n(gate.params().begin() + w.offset, w.size(), 0.0);
    gate.params()[std::size_t(Gate::find("h." + std::to_string(h) + ".router.b").offset)] = 40.0;
  }
  const index_t batch = 3, seq = 9;
  dense.reserve(batch, seq);
  never.reserve(batch, seq);
  gate.reserve(batch, seq);
  const auto tokens = random_tokens(batch * seq, tiny.vocab, 17), targets = random_tokens(batch * seq, tiny.vocab, 18);
  const double ld = dense.forward(tokens, targets, batch, seq);
  const double ln = never.forward(tokens, targets, batch, seq);
  gate.forward(tokens, targets, batch, seq);
  CHECK(std::abs(ld - ln) < 1e-12);
  CHECK(max_abs_diff(logits_of(dense), logits_of(never)) < 1e-12);
  CHECK(max_abs_diff(logits_of(dense), logits_of(gate)) < 1e-12);
  for (const auto& sel : selections(never)) CHECK(index_t(sel.size()) == batch * seq);
  const auto dense_logits = logits_of(dense);
  dense.backward();
  never.backward();
  CHECK(max_abs_diff(std::vector<double>(dense.grads().begin(), dense.grads().end()),
                     std::vector<double>(never.grads().begin(), never.grads().end())) < 1e-12);

  auto never_all = NeverSkipAll::make<cpu::Backend<double>>(19);
  warm_start(never_all, dense);
  never_all.reserve(batch, seq);
  CHECK(std::abs(never_all.forward(tokens, targets, batch, seq) - ld) < 1e-12);
  CHECK(max_abs_diff(dense_logits, logits_of(never_all)) < 1e-12);
  never_all.backward();
  CHECK(max_abs_diff(std::vector<double>(dense.grads().begin(), dense.grads().end()),
                     std::vector<double>(never_all.grads().begin(), never_all.grads().end())) < 1e-12);
}

TEST_CASE("early-exit: once a token skips a layer it skips every later one, plain layer-skip need not", "[depth][skip]") {
  using Exit = LM<tiny, EarlyExiting<4>>;
  using Skip4 = LM<tiny, LayerSkipping<4>>;
  static_assert(Exit::params == Skip4::params);
  auto exit = Exit::make<cpu::Backend<double>>(19);
  randomise(exit, 20, 0.5);
  for (int h = 0; h < 4; ++h) exit.params()[std::size_t(Exit::find("h." + std::to_string(h) + ".router.b").offset)] = 0.6;
  auto skip = Skip4::make<cpu::Backend<double>>(21);
  std::copy(exit.params().begin(), exit.params().end(), skip.params().begin());  // the same layout
  const index_t batch = 4, seq = 16;
  exit.reserve(batch, seq);
  skip.reserve(batch, seq);
  const auto tokens = random_tokens(batch * seq, tiny.vocab, 22);
  exit.forward(tokens, {}, batch, seq);
  skip.forward(tokens, {}, batch, seq);
  const auto se = selections(exit), ss = selections(skip);
  REQUIRE(se.size() == 4);
  CHECK(se[0] == ss[0]);  // the first layer decides alike
  for (std::size_t h = 1; h < se.size(); ++h)
    CHECK(std::includes(se[h - 1].begin(), se[h - 1].end(), se[h].begin(), se[h].end()));  // monotone
  // The routing is not degenerate: some tokens exit, some run to the end.
  CHECK(se[0].size() < std::size_t(batch * seq));
  CHECK(!se[3].empty());
  // Without EarlyExit some token skips a layer and runs a later one.
  bool rejoined = false;
  for (std::size_t h = 1; h < ss.size(); ++h)
    rejoined |= !std::includes(ss[h - 1].begin(), ss[h - 1].end(), ss[h].begin(), ss[h].end());
  CHECK(rejoined);
}

namespace {
template <class Model>
void check_flops(std::uint64_t seed, bool exact_worst_case) {
  auto m = Model::template make<test::CountingBackend<double>>(seed);
  randomise(m, seed + 1, 0.5);
  for (auto [batch, seq] : {std::pair<index_t, index_t>{2, 16}, {3, 7}, {1, 1}}) {
    m.reserve(batch, seq);
    const auto tokens = random_tokens(batch * seq, tiny.vocab, seed + 2);
    m.backend().flops = 0;
    m.forward(tokens, tokens, batch, seq);
    INFO("batch " << batch << " seq " << seq);
    CHECK(m.backend().flops == realised_forward_flops(m));
    const index_t worst = batch * (Exec0<decltype(m)>::flops_per_sequence(seq) + seq * 2 * tiny.d_model * tiny.vocab);
    if (exact_worst_case) CHECK(m.backend().flops == worst);  // MoD: exactly C tokens, worst = expected
    else CHECK(m.backend().flops <= worst);
    if (exact_worst_case) {  // backward as the cost model counts it (+ the tied head's two products)
      m.backend().flops = 0;
      m.backward();
      CHECK(m.backend().flops ==
            batch * (Exec0<decltype(m)>::backward_flops_per_sequence(seq) + seq * 4 * tiny.d_model * tiny.vocab));
    }
  }
}
}  // namespace

TEST_CASE("depth routing: FLOPs executed equal the cost model (MoD: exactly, layer-skip: realised <= worst)",
          "[depth][cost]") {
  check_flops<ModTiny>(30, true);
  check_flops<LM<tiny, MoD<4, 1, 4, 2, CausalPredictor<5>>>>(31, true);
  check_flops<LM<tiny, MoD<4, 1, 2, 1, CausalAux<>>>>(34, true);
  check_flops<LM<tiny, Assembly<Router<BlockChoice<Capacity<1, 2>, Weighting<RouterWeight::Unit>>>, ModuleSet<Block<4>, Skip>,
                                K<1>, H<4>, phi::LayerSkip>>>(35, true);
  check_flops<LM<tiny, LayerSkipping<3>>>(32, false);
  check_flops<LM<tiny, EarlyExiting<3>>>(33, false);
  // The cost model: routed blocks cost C/S of a dense block's linear work and attention over C tokens.
  using E = Exec0<decltype(ModTiny::make<cpu::Backend<double>>(1))>;
  constexpr index_t S = 16, C = 6, d = tiny.d_model, f = tiny.ff();
  constexpr index_t dense_layer = S * (8 * d * d + 4 * d * f) + 2 * d * S * (S + 1);
  constexpr index_t routed_layer = C * (8 * d * d + 4 * d * f) + 2 * d * C * (C + 1) + S * 2 * d;
  static_assert(E::flops_per_sequence(S) == 2 * dense_layer + 2 * routed_layer);
  static_assert(E::router_params == 2 * d && E::predictor_params == 0);
  CHECK(E::expected_flops_per_token(S, double(C) / double(S)) == Approx(double(E::flops_per_sequence(S)) / double(S)));
}

namespace {
// The causal predictors' own objective: Σ over routed blocks of coef · mean BCE (read_causal).
template <class Instance>
double predictor_loss(Instance& m) {
  using E = Exec0<Instance>;
  double s = 0;
  for (const auto& st : E::read_causal(m.backend(), m.workspace_data(), std::get<0>(m.plan().parts), m.batch(), m.seq()))
    s += E::Cfg::predictor_coef * st.bce;
  return s;
}

// Whole-model central differences in double, with the routing held fixed (each perturbation that
// changes a selection is counted as a flip and skipped, as in mom_gradient_test). A predictor's
// parameters are checked against its own loss (stop-gradient inputs: it is not part of the model
// loss), every other parameter against the model loss.
template <class Model>
void gradient_check(std::uint64_t seed, double sd = 0.35) {
  auto m = Model::template make<cpu::Backend<double>>(seed);
  const test::GradientCase c = test::gradient_case(m, seed, 8, sd);
  double max_router_grad = 0;
  auto is_predictor = [](const auto& info) {
    return std::string_view(info.name).find("predictor") != std::string_view::npos;
  };
  const test::FdTally t = test::check_central_differences(
      m, c.grad, 1e-6,
      [&](const auto& info) {
        const double l = c.forward(m);
        return is_predictor(info) ? predictor_loss(m) : l;
      },
      [&] { return selections(m); },
      [&](const auto& info, double, double g) {
        if (is_predictor(info) || std::string_view(info.name).find("router") != std::string_view::npos)
          max_router_grad = std::max(max_router_grad, std::abs(g));
      });
  INFO("checked " << t.checked << ", flipped " << t.flipped);
  CHECK(t.flipped <= t.checked / 200);
  CHECK(max_router_grad > 1e-4);  // the routers (and predictors) do receive gradient
}
}  // namespace

TEST_CASE("MoD: whole-model gradient equals finite differences, router weights included", "[depth][mod][gradcheck]") {
  gradient_check<LM<tiny, MoD<4, 3, 8>>>(40);
  gradient_check<LM<tiny, MoD<3, 1, 2, 1>>>(41);  // every block routed
}

TEST_CASE("MoD causal sampling: gradient check with the router BCE (method 1) and the predictor (method 2)",
          "[depth][mod][causal][gradcheck]") {
  gradient_check<LM<tiny, MoD<4, 3, 8, 2, CausalAux<1, 3>>>>(42);
  gradient_check<LM<tiny, MoD<4, 3, 8, 2, CausalPredictor<6, 1, 2>>>>(43);
}

TEST_CASE("layer-skip and early-exit: whole-model gradient equals finite differences", "[depth][skip][gradcheck]") {
  gradient_check<LM<tiny, LayerSkipping<3>>>(44);
  gradient_check<LM<tiny, EarlyExiting<3, SkipCost<1, 5>>>>(45);  // AttendToSkipped (early exit's default)
  gradient_check<LM<tiny, LayerSkipping<3, AttendToSkipped>>>(46);
}

TEST_CASE("MoD causal sampling: the predictor's accuracy is reported and rises with training", "[depth][mod][causal]") {
  using Model = LM<tiny, MoD<4, 1, 4, 2, CausalPredictor<16>>>;
  using E = Exec0<decltype(Model::make<cpu::Backend<double>>(1))>;
  auto m = Model::make<cpu::Backend<double>>(50);
  const index_t batch = 4, seq = 16;
  m.reserve(batch, seq);
  const auto tokens = random_tokens(batch * seq, tiny.vocab, 51), targets = random_tokens(batch * seq, tiny.vocab, 52);
  auto accuracy = [&] {
    m.forward(tokens, targets, batch, seq);
    double correct = 0, total = 0;
    const auto stats = E::read_causal(m.backend(), m.workspace_data(), std::get<0>(m.plan().parts), batch, seq);
    REQUIRE(stats.size() == 2);  // blocks 1 and 3
    // The numerator is the count of tokens whose predictor sign matches top-C membership.
    const auto& plan = std::get<0>(m.plan().parts);
    const auto sel = selections(m);
    for (std::size_t r = 0; r < stats.size(); ++r) {
      const auto& l = plan.layer[std::size_t(stats[r].layer)];
      double naive = 0;
      for (index_t t = 0; t < batch * seq; ++t) {
        const bool in = std::binary_search(sel[r].begin(), sel[r].end(), token_t(t));
        naive += (m.workspace_data()[l.pred + t] > 0) == in ? 1 : 0;
      }
      CHECK(stats[r].correct == naive);
      CHECK(stats[r].tokens == double(batch * seq));
      correct += stats[r].correct, total += stats[r].tokens;
    }
    return correct / total;
  };
  const double before = accuracy();
  auto opt_m = m.backend().alloc(Model::params), opt_v = m.backend().alloc(Model::params);
  for (int step = 1; step <= 200; ++step) {
    m.zero_grad();
    m.forward(tokens, targets, batch, seq);
    m.backward();
    m.backend().adamw_step(m.params(), m.grads(), opt_m.span(), opt_v.span(),
                           cpu::AdamWConfig{.lr = 1e-2, .weight_decay = 0.0}, step);
  }
  const double after = accuracy();
  INFO("accuracy before " << before << ", after " << after);
  CHECK(after > 0.9);
  CHECK(after > before);
}

TEST_CASE("MoD causal sampling: CausalRouting routes by the router's sign (method 1), a variable count per sequence",
          "[depth][mod][causal]") {
  using Trained = LM<tiny, MoD<4, 3, 8, 2, CausalAux<>>>;
  using Sampling = causal_sampling_model_t<Trained>;
  static_assert(!std::is_same_v<Sampling, Trained> && Sampling::params == Trained::params);
  static_assert(std::is_same_v<causal_sampling_model_t<ModTiny>, ModTiny>);  // no causal method: unchanged
  auto m = Sampling::make<cpu::Backend<double>>(60);
  randomise(m, 61);
  const index_t batch = 3, seq = 16;
  m.reserve(batch, seq);
  const auto tokens = random_tokens(batch * seq, tiny.vocab, 62);
  m.forward(tokens, {}, batch, seq);
  const std::vector<double> want = Naive::mod_logits<Sampling>(std::vector<double>(m.params().begin(), m.params().end()),
                                                               tokens, batch, seq, 0, {false, true, false, true}, false,
                                                               true);
  CHECK(max_abs_diff(logits_of(m), want) < 1e-10);
  // Not top-C: the counts per sequence differ from C = 6 (and from each other).
  bool other_count = false;
  for (const auto& sel : selections(m)) {
    std::vector<int> per(3, 0);
    for (token_t t : sel) ++per[std::size_t(t / seq)];
    other_count |= per[0] != 6 || per[1] != 6 || per[2] != 6;
  }
  CHECK(other_count);
  CHECK_THROWS_WITH(m.backward(), Catch::Contains("backward: needs a forward with targets"));
  const auto targets = random_tokens(batch * seq, tiny.vocab, 63);
  m.forward(tokens, targets, batch, seq);
  CHECK_THROWS_WITH(m.backward(), Catch::Contains("inference mode"));
}

TEST_CASE("DepthStats: run fraction per routed layer and the causal accuracy, as mom-train writes them",
          "[depth][causal]") {
  using Model = LM<tiny, MoD<4, 1, 4, 2, CausalPredictor<8>>>;
  auto m = Model::make<cpu::Backend<double>>(70);
  randomise(m, 71);
  const index_t batch = 2, seq = 16;
  m.reserve(batch, seq);
  DepthStats stats;
  double correct = 0;
  for (int i = 0; i < 2; ++i) {
    const auto tokens = random_tokens(batch * seq, tiny.vocab, 72 + i);
    m.forward(tokens, tokens, batch, seq);
    stats.accumulate(m);
    CHECK(m.backend().read(m.workspace_data() + std::get<0>(m.plan().parts).aux) == 0.0);  // predictor: no model aux
    using E = Exec0<decltype(m)>;
    for (const auto& c : E::read_causal(m.backend(), m.workspace_data(), std::get<0>(m.plan().parts), batch, seq))
      correct += c.correct;
  }
  REQUIRE(stats.layers.size() == 2);
  CHECK(stats.layers[0].name == "part0.h1");
  CHECK(stats.layers[1].name == "part0.h3");
  CHECK(stats.layers[0].run / stats.layers[0].tokens == 0.25);  // exactly C = 4 of 16
  CHECK(stats.causal_accuracy() == Approx(correct / (2.0 * 2 * batch * seq)));
  const std::string j = stats.json(50);
  CHECK(j.find("\"step\": 50") != std::string::npos);
  CHECK(j.find("\"run_fraction\": 0.25") != std::string::npos);
  CHECK(j.find("\"causal_accuracy\"") != std::string::npos);
  // Layer-skip models report run fractions only.
  auto s = LM<tiny, EarlyExiting<3>>::make<cpu::Backend<double>>(74);
  s.reserve(batch, seq);
  s.forward(random_tokens(batch * seq, tiny.vocab, 75), {}, batch, seq);
  DepthStats ss;
  const auto ts = random_tokens(batch * seq, tiny.vocab, 76);
  s.forward(ts, ts, batch, seq);
  ss.accumulate(s);
  // The run target's c·(ḡ − ½)² terms are part of the model loss; aux_loss() reports them (at initialisation
  // every gate is σ(1 + small) ≈ 0.73, so each layer adds about (0.73 − 0.5)²).
  CHECK(ss.aux_loss() == s.backend().read(s.workspace_data() + std::get<0>(s.plan().parts).aux));
  CHECK(ss.aux_loss() > 3 * 0.04);
  CHECK(ss.json(1).find("\"aux_loss\"") != std::string::npos);
  CHECK(ss.layers.size() == 3);
  CHECK(ss.causal_accuracy() == -1.0);
  CHECK(ss.json(1).find("causal_accuracy") == std::string::npos);
}

// Incremental decoding of the routed executors (infer/decoder.hpp; docs/inference.md): prefill +
// step-by-step decode gives the logits of one full forward over the same tokens, for MoM with each
// key/value mode (phi::MoM: every token writes every module's keys; phi::MoMRoutedKV: only the routed
// tokens do), with SKIP, inside Chunked between dense layers and with RoPE; layer-skip, early exit (with and
// without AttendToSkipped) and Mixture-of-Depths routed by its causal methods (against a full forward of
// the same causal routing), Mixture-of-Recursions likewise; a batch of sequences of different lengths, one of which fills the context
// (tests/models/decode_check.hpp).
#include <catch2/catch.hpp>

#include <mom/mom.hpp>

#include "models/decode_check.hpp"
#include "mom/models/depth_stats.hpp"

#include <algorithm>
#include <vector>

using namespace mom;

namespace {

constexpr Dims dims{.d_model = 32, .heads = 4, .d_ff = 64, .vocab = 61, .context = 24};
using MoMChunk = Assembly<Router<GRU>, ModuleSet<MHA<3>, FFN<3>, Skip>, K<2>, H<3>>;
using MoMRoutedChunk = Assembly<Router<GRU>, ModuleSet<MHA<3>, FFN<3>, Skip>, K<2>, H<3>, phi::MoMRoutedKV>;
using MoMAll = LM<dims, MoMChunk>;
using MoMRouted = LM<dims, MoMRoutedChunk>;
using MoMNoSkip = LM<dims, Assembly<Router<GRU>, ModuleSet<MHA<2>, FFN<2>>, K<1>, H<2>>>;
using MoMChunked = LM<dims, Chunked<Layer, MoMChunk, Layer>>;
using MoMRope = LM<with_rope(dims), MoMRoutedChunk>;
using MoMRopeAll = LM<with_rope(dims), MoMChunk>;

using Skip3 = LM<dims, LayerSkipping<3>>;
using Exit3 = LM<dims, EarlyExiting<3>>;  // AttendToSkipped
using ExitOwnKeys = LM<dims, Assembly<Router<Skipping<LinearGate, EarlyExit>>, ModuleSet<MHA<3>, FFN<3>, Skip>, K<1>,
                                      H<3>, phi::LayerSkip>>;
using SkipAttendAll = LM<dims, LayerSkipping<3, AttendToSkipped>>;
using SkipRope = LM<with_rope(dims), LayerSkipping<3>>;
using ModAux = LM<dims, causal_sampling_arch<MoD<4, 1, 2, 2, CausalAux<>>>::type>;
using ModPredictor = LM<dims, causal_sampling_arch<MoD<4, 1, 4, 2, CausalPredictor<8>>>::type>;
using ModChunked = LM<dims, causal_sampling_arch<Chunked<Layer, MoD<2, 1, 2, 1, CausalAux<>>>>::type>;
// Mixture-of-Recursions routed by the router's sign (CausalAux, CausalRouting), middle-cycle, 2-layer block.
using MoRCausal = LM<dims, causal_sampling_arch<MoRMiddleCycle<2, 3, CausalAux<>>>::type>;
using MoRToken = LM<dims, MoRMiddleCycle<2, 3, TokenChoice<Router<TopK<Softmax>, Renormalise<false>>>>>;
// ... with KV sharing: the deeper recursions read recursion 0's caches and write none.
using MoRShare = LM<dims, causal_sampling_arch<MoRMiddleCycle<2, 3, CausalAux<>, KVShare>>::type>;
using MoRTokenShare = LM<dims, MoR<2, 3, TokenChoice<Router<TopK<Softmax>, Renormalise<false>>>, KVShare>>;
using MoRCausalRaw = LM<dims, causal_sampling_arch<MoR<1, 3, Capacities<4, 3, 2, 1>, CausalAux<>,
                                                       Weighting<RouterWeight::Raw>, AddBlockOutput>>::type>;

// The fraction of tokens each routed layer runs in a full forward of decode_error's model (its seed and
// randomisation), so a test knows its routers both run and skip tokens.
template <class Model>
std::vector<double> run_fractions(unsigned seed = 11) {
  auto m = Model::template make<cpu::Backend<double>>(7);
  test::randomise(m, seed, 0.2);
  m.reserve(2, dims.context);
  const auto toks = test::random_tokens(2 * dims.context, dims.vocab, 3);
  m.forward(toks, {}, 2, dims.context);
  DepthStats stats;
  stats.accumulate(m);
  std::vector<double> out;
  for (const auto& l : stats.layers) out.push_back(l.run / l.tokens);
  return out;
}
// Every routed layer runs some tokens and skips others.
struct Mixed : Catch::MatcherBase<std::vector<double>> {
  bool match(const std::vector<double>& f) const override {
    return !f.empty() && std::all_of(f.begin(), f.end(), [](double r) { return r > 0.05 && r < 0.95; });
  }
  std::string describe() const override { return "has every run fraction in (0.05, 0.95)"; }
};

}  // namespace

TEST_CASE("decode MoM: prefill + step logits equal a full forward (double 1e-12, float 1e-5)", "[decode][mom]") {
  SECTION("phi::MoM: every token writes every module's keys, SKIP included") {
    CHECK(test::decode_error<MoMAll, double>() < 1e-12);
    CHECK(test::decode_error<MoMAll, float>() < 1e-5);
  }
  SECTION("phi::MoMRoutedKV: only the routed tokens write keys") {
    CHECK(test::decode_error<MoMRouted, double>() < 1e-12);
    CHECK(test::decode_error<MoMRouted, double>({}, {}, 11, 4) < 1e-12);  // prefill in passes of 4 rows
    CHECK(test::decode_error<MoMRouted, float>() < 1e-5);
  }
  SECTION("without SKIP, K = 1") { CHECK(test::decode_error<MoMNoSkip, double>() < 1e-12); }
  SECTION("a MoM chunk between dense layers") { CHECK(test::decode_error<MoMChunked, double>() < 1e-12); }
  SECTION("RoPE: keys rotated by the token's position, not its cache row") {
    CHECK(test::decode_error<MoMRope, double>() < 1e-12);
    CHECK(test::decode_error<MoMRopeAll, double>() < 1e-12);
  }
  SECTION("a slot started again after reset decodes from an empty cache (routed counts restart)") {
    // The same sequences twice through one decoder: decode_error builds its own; here a second prefill
    // after the first run must give the first run's logits again.
    auto model = MoMRouted::make<cpu::Backend<double>>(7);
    test::randomise(model, 11, 0.2);
    const auto seq = test::random_tokens(10, dims.vocab, 5);
    const std::vector<std::vector<token_t>> prompt{{seq.begin(), seq.begin() + 3}};
    infer::Decoder dec(model, 1, dims.context);
    std::vector<std::vector<double>> first, second;
    for (auto* out : {&first, &second}) {
      dec.prefill(std::span<const std::vector<token_t>>(prompt));
      for (std::size_t t = 3; t < seq.size(); ++t) {
        const auto l = dec.step(std::vector<token_t>{seq[t]});
        out->emplace_back(l.data, l.data + dims.vocab);
      }
    }
    CHECK(first == second);
  }
  static_assert(infer::decodes<MoMAll, cpu::Backend<float>>);
  static_assert(infer::decodes<MoMRouted, cpu::Backend<double>>);
}

TEST_CASE("decode layer-skip, early exit and causal MoD: logits equal a full forward (double 1e-12, float 1e-5)",
          "[decode][depth]") {
  SECTION("layer-skip: only the tokens that run a layer write its keys") {
    CHECK_THAT(run_fractions<Skip3>(), Mixed());
    CHECK(test::decode_error<Skip3, double>() < 1e-12);
    CHECK(test::decode_error<Skip3, float>() < 1e-5);
  }
  SECTION("early exit attending to the exited tokens' copied-up state") {
    CHECK_THAT(run_fractions<Exit3>(), Mixed());
    CHECK(test::decode_error<Exit3, double>() < 1e-12);
    CHECK(test::decode_error<Exit3, float>() < 1e-5);
  }
  SECTION("early exit without AttendToSkipped, layer-skip with it, layer-skip with RoPE") {
    CHECK_THAT(run_fractions<ExitOwnKeys>(), Mixed());
    CHECK(test::decode_error<ExitOwnKeys, double>() < 1e-12);
    CHECK(test::decode_error<SkipAttendAll, double>() < 1e-12);
    CHECK(test::decode_error<SkipRope, double>() < 1e-12);
  }
  SECTION("Mixture-of-Depths routed by its causal methods (router sign, predictor), against the same routing") {
    CHECK_THAT(run_fractions<ModAux>(), Mixed());
    CHECK_THAT(run_fractions<ModPredictor>(28), Mixed());  // a seed whose predictors split the tokens
    CHECK(test::decode_error<ModAux, double>() < 1e-12);
    CHECK(test::decode_error<ModAux, float>() < 1e-5);
    CHECK(test::decode_error<ModPredictor, double>({}, {}, 28) < 1e-12);
    CHECK(test::decode_error<ModChunked, double>() < 1e-12);
  }
  SECTION("Mixture-of-Recursions routed by the router's sign: recursion-wise caches, nested exits") {
    // A seed whose routers split the tokens at recursions 1 and 2 (recursion 0 has capacity 1: every token runs
    // it), fewer at 2 than at 1.
    const auto fractions = run_fractions<MoRCausal>(45);
    REQUIRE(fractions.size() == 3);
    CHECK(fractions.front() == 1.0);
    CHECK_THAT(std::vector<double>(fractions.begin() + 1, fractions.end()), Mixed());
    CHECK(fractions[2] < fractions[1]);
    CHECK_THAT(run_fractions<MoRCausalRaw>(), Mixed());
    CHECK(test::decode_error<MoRCausal, double>({}, {}, 45) < 1e-12);
    CHECK(test::decode_error<MoRCausal, float>({}, {}, 45) < 1e-5);
    CHECK(test::decode_error<MoRCausalRaw, double>() < 1e-12);
    CHECK(test::decode_error<MoRCausal, double>({}, {}, 45, 4) < 1e-12);  // prefill in passes of 4 rows
  }
  SECTION("Mixture-of-Recursions with token-choice routing: the depth chosen once per token, as in training") {
    CHECK(test::decode_error<MoRToken, double>() < 1e-12);
    CHECK(test::decode_error<MoRToken, float>() < 1e-5);
  }
  SECTION("Mixture-of-Recursions with KV sharing: deeper recursions query recursion 0's caches") {
    CHECK(test::decode_error<MoRShare, double>({}, {}, 45) < 1e-12);
    CHECK(test::decode_error<MoRShare, float>({}, {}, 45) < 1e-5);
    CHECK(test::decode_error<MoRTokenShare, double>() < 1e-12);
  }
  // Top-C routing during training is not causal: the Decoder refuses it (compile_fail/decode_routed).
  static_assert(!infer::routes_causally<LM<dims, MoD<4>>>);
  static_assert(infer::routes_causally<ModAux> && infer::decodes<ModAux, cpu::Backend<float>>);
}

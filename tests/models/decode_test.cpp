// Incremental decoding (infer/decoder.hpp, infer/generate.hpp): prefill + step-by-step decode gives the
// logits of one full forward over the same tokens, in double to 1e-12 and in float to a stated tolerance,
// for the dense stack, parameter sharing and token-choice MoE (MoE, MoE(share), MoDE integrated), with a
// batch of sequences of different lengths and a prompt that fills the context, the prompts prefilled in one
// pass or in passes of 4 rows; the limits are refused with one message; generate's greedy output equals the
// recompute-the-window loop's, its sampling is seeded per sequence, stop tokens and top-k = 1 behave.
#include <catch2/catch.hpp>

#include <mom/mom.hpp>

#include "models/decode_check.hpp"
#include "random_tokens.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

using namespace mom;

namespace {

constexpr Dims dims{.d_model = 32, .heads = 4, .d_ff = 64, .vocab = 61, .context = 24};
using Dense3 = LM<dims, Dense<3>>;
using Shared = LM<dims, Assembly<Router<Share<Cycle<2>>>, ModuleSet<MHA<2>, FFN<2>>, K<1>, H<5>>>;  // one cache per use
using Chunks = LM<dims, Chunked<Layer, Assembly<Router<Share<All>>, ModuleSet<MHA<1>, FFN<1>>, K<1>, H<2>>, Layer>>;
using MoE = LM<dims, MoEStack<2, 4, 2>>;
using MoEShared = LM<dims, MoEShareStack<3, 4, 2>>;
using MoDEInt = LM<dims, MoDEIntegrated<2, 4, 2>>;

}  // namespace

TEST_CASE("decode: prefill + step logits equal a full forward (double 1e-12, float 1e-5)", "[decode]") {
  SECTION("dense") {
    CHECK(test::decode_error<Dense3, double>() < 1e-12);
    CHECK(test::decode_error<Dense3, float>() < 1e-5);
  }
  SECTION("parameter sharing: a module used at several steps keeps one cache per use") {
    CHECK(test::decode_error<Shared, double>() < 1e-12);
    CHECK(test::decode_error<Shared, float>() < 1e-5);
  }
  SECTION("chunked: dense layers around a shared chunk") { CHECK(test::decode_error<Chunks, double>() < 1e-12); }
  SECTION("prefill in passes of 4 rows: a prompt split across passes, several slots in one pass") {
    CHECK(test::decode_error<Dense3, double>({}, {}, 11, 4) < 1e-12);
    CHECK(test::decode_error<Shared, double>({}, {}, 11, 4) < 1e-12);
    CHECK(test::decode_error<MoE, double>({}, {}, 11, 4) < 1e-12);
  }
  SECTION("MoE, MoE(share), MoDE integrated: each new token's gate picks from its own u_h") {
    CHECK(test::decode_error<MoE, double>() < 1e-12);
    CHECK(test::decode_error<MoE, float>() < 1e-5);
    CHECK(test::decode_error<MoEShared, double>() < 1e-12);
    CHECK(test::decode_error<MoDEInt, double>() < 1e-12);
  }
  static_assert(infer::decodes<Dense3, cpu::Backend<float>>);
  static_assert(infer::decodes<Shared, cpu::Backend<double>>);
  static_assert(infer::decodes<MoE, cpu::Backend<float>>);
}

TEST_CASE("decode: limits are one-line errors and leave the decoder usable", "[decode][bad-input]") {
  auto model = Dense3::make<cpu::Backend<double>>(1);
  CHECK_THROWS_WITH(infer::Decoder(model, 0), Catch::Contains("slots 0 must be > 0"));
  CHECK_THROWS_WITH(infer::Decoder(model, 1, 25), Catch::Contains("max_len 25 must be in [1, context 24]"));
  infer::Decoder dec(model, 2, 4);
  const std::vector<std::vector<token_t>> too_long{{1, 2, 3, 4, 5}};
  CHECK_THROWS_WITH(dec.prefill(std::span<const std::vector<token_t>>(too_long)),
                    Catch::Contains("prompt 0 has 5 tokens; it needs 1 to 4"));
  const std::vector<std::vector<token_t>> full{{1, 2, 3, 4}, {5}};
  dec.prefill(std::span<const std::vector<token_t>>(full));
  const std::vector<std::vector<token_t>> bad_prompt{{1, 2}, {3, 61}};
  CHECK_THROWS_WITH(dec.prefill(std::span<const std::vector<token_t>>(bad_prompt)),
                    Catch::Contains("token 61 of prompt 1 outside the vocabulary [0, 61)"));
  CHECK(dec.length(0) == 4);  // the refused prefill left the slots as they were
  CHECK(dec.length(1) == 1);
  CHECK_THROWS_WITH(infer::Decoder(model, 1, 4, -1), Catch::Contains("prefill_rows -1 must be >= 0"));
  const std::vector<index_t> s0{0}, s1{1}, twice{1, 1};
  const std::vector<token_t> t{7}, tt{7, 8}, bad{61};
  CHECK_THROWS_WITH(dec.step(s0, t), Catch::Contains("sequence 0 is full (4 tokens, the decoder's max_len)"));
  CHECK_THROWS_WITH(dec.step(twice, tt), Catch::Contains("slot 1 appears twice in one step"));
  CHECK_THROWS_WITH(dec.step(s1, bad), Catch::Contains("token 61 outside the vocabulary [0, 61)"));
  CHECK_NOTHROW(dec.step(s1, t));
  CHECK(dec.length(1) == 2);
  dec.reset(0);
  CHECK_NOTHROW(dec.step(s0, t));
  CHECK_THROWS_WITH(infer::SamplingOptions{.top_p = 0}.check(), Catch::Contains("top_p 0 must be in (0, 1]"));
  CHECK_THROWS_WITH(infer::SamplingOptions{.temperature = -1}.check(), Catch::Contains("temperature -1 must be"));
}

TEST_CASE("generate: greedy equals the recompute loop, sampling seeded per sequence, stop tokens, top-k 1",
          "[decode][generate]") {
  auto model = Shared::make<cpu::Backend<double>>(3);
  test::randomise(model, 5, 0.3);
  const std::vector<std::vector<token_t>> prompts{{3, 14, 15}, {9}, {2, 6, 5, 3, 5}};
  infer::Decoder dec(model, 3);
  const auto greedy = infer::generate(dec, std::span<const std::vector<token_t>>(prompts),
                                      {.max_new_tokens = 12, .sampling = {.temperature = 0}});
  // The recompute loop (what examples/sample.hpp did): a full forward over the window per new token.
  auto ref = Shared::make<cpu::Backend<double>>(3);
  std::copy(model.params().begin(), model.params().end(), ref.params().begin());
  ref.reserve(1, dims.context);
  for (std::size_t b = 0; b < prompts.size(); ++b) {
    std::vector<token_t> seq = prompts[b];
    for (int i = 0; i < 12; ++i) {
      ref.forward(seq, {}, 1, ssize(seq));
      const double* last = ref.logits().row(ssize(seq) - 1);
      seq.push_back(token_t(std::max_element(last, last + dims.vocab) - last));
    }
    INFO("sequence " << b);
    CHECK(std::vector<token_t>(seq.begin() + ssize(prompts[b]), seq.end()) == greedy[b].tokens);
    CHECK(greedy[b].reason == infer::StopReason::MaxNewTokens);
  }
  // top-k 1 is greedy whatever the temperature.
  const auto top1 = infer::generate(dec, std::span<const std::vector<token_t>>(prompts),
                                    {.max_new_tokens = 12, .sampling = {.temperature = 2.0, .top_k = 1}});
  for (std::size_t b = 0; b < prompts.size(); ++b) CHECK(top1[b].tokens == greedy[b].tokens);
  // Sampling: the same seed, the same text; sequence b's text does not depend on its batch mates.
  const infer::GenerateOptions sampled{.max_new_tokens = 30, .sampling = {.temperature = 1.0, .top_p = 0.9}, .seed = 42};
  const auto a = infer::generate(dec, std::span<const std::vector<token_t>>(prompts), sampled);
  const auto again = infer::generate(dec, std::span<const std::vector<token_t>>(prompts), sampled);
  infer::Decoder solo(model, 1);
  const auto alone = infer::generate(solo, std::span<const std::vector<token_t>>(prompts).first(1), sampled);
  for (std::size_t b = 0; b < prompts.size(); ++b) CHECK(a[b].tokens == again[b].tokens);
  CHECK(alone[0].tokens == a[0].tokens);
  CHECK(a[0].tokens != greedy[0].tokens);  // it does sample
  // A context-length stop: prompt 5 + 30 new > context 24.
  CHECK(a[2].reason == infer::StopReason::Context);
  CHECK(ssize(prompts[2]) + ssize(a[2].tokens) == dims.context + 1);  // the last token is emitted, not fed
  // Stop tokens end a sequence after emitting one; the callback sees every token in order.
  const token_t stop = greedy[1].tokens[4];
  std::vector<token_t> streamed;
  const auto stopped = infer::generate(
      dec, std::span<const std::vector<token_t>>(prompts).subspan(1, 1),
      {.max_new_tokens = 12, .sampling = {.temperature = 0}, .stop_tokens = {stop}},
      [&](index_t seq, token_t tok) {
        CHECK(seq == 0);
        streamed.push_back(tok);
      });
  const auto first_stop = std::find(greedy[1].tokens.begin(), greedy[1].tokens.end(), stop);
  CHECK(stopped[0].tokens == std::vector<token_t>(greedy[1].tokens.begin(), first_stop + 1));
  CHECK(stopped[0].reason == infer::StopReason::StopToken);
  CHECK(streamed == stopped[0].tokens);
}

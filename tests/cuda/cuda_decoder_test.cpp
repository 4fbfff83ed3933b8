// infer::Decoder on the CUDA backend against the same Decoder on the CPU (whose logits equal a full
// forward's: tests/models/decode_test.cpp, decode_routed_test.cpp): the same parameters, the same prompts
// of different lengths (one fills the context), prefilled in passes that split prompts and in one pass,
// then one token per step for every unfinished sequence. Every step's logits rows, last_logits (host
// memory on both backends) and a greedy generate agree. GEMMs in fp32 (no TF32): double to 1e-10, float
// to 1e-4 of the largest logit. Every family that decodes is here: dense (learned positions and RoPE),
// parameter sharing, token-choice MoE, MoM (keys from every token and routed keys), layer-skip, early exit,
// causal Mixture-of-Depths, Mixture-of-Recursions (causal routing, token choice, KV sharing), MoEUT
// (SwitchHead) and ModuleFormer (MoA, stick-breaking attention).
#include <catch2/catch.hpp>

#include <algorithm>
#include <vector>

#include "cuda/cuda_test_support.hpp"
#include "models/decode_check.hpp"
#include "mom/infer/generate.hpp"
#include "mom/models/moeut_models.hpp"
#include "mom/models/moduleformer_models.hpp"
#include "mom/mom.hpp"

using namespace mom;
using test::gpu_available;

namespace {

constexpr Dims dims{.d_model = 32, .heads = 2, .d_ff = 64, .vocab = 40, .context = 24};

template <class Model, class T>
void compare_decoder(index_t prefill_rows) {
  constexpr index_t C = Model::dims.context, V = Model::dims.vocab;
  auto on_cpu = Model::template make<cpu::Backend<T>>(7);
  test::randomise(on_cpu, 11, 0.2);
  auto on_gpu = Model::template make<cuda::Backend<T>>(7);
  on_gpu.backend().set_precision(cuda::Precision::FP32);
  on_gpu.backend().from_host(on_gpu.params(), std::span<const T>(on_cpu.params()));

  const test::DecodeCase c = test::decode_case(C, V);
  const index_t S = ssize(c.lengths);
  const double tol = std::is_same_v<T, double> ? 1e-10 : 1e-4;
  infer::Decoder dc(on_cpu, S, C, prefill_rows), dg(on_gpu, S, C, prefill_rows);
  dc.prefill(std::span<const std::vector<token_t>>(c.prompts));
  dg.prefill(std::span<const std::vector<token_t>>(c.prompts));
  double worst = 0;
  for (index_t b = 0; b < S; ++b) {
    REQUIRE(dg.length(b) == c.prompt_len[std::size_t(b)]);
    worst = std::max(worst, test::row_error(dg.last_logits(b), dc.last_logits(b).data(), V));
  }
  std::vector<T> row(static_cast<std::size_t>(V));
  std::vector<index_t> slots;
  std::vector<token_t> toks;
  while (test::next_step(dc, c, slots, toks)) {
    const auto lc = dc.step(slots, toks);
    const auto lg = dg.step(slots, toks);
    REQUIRE((lg.rows == ssize(slots) && lg.cols == V));
    for (index_t r = 0; r < lg.rows; ++r) {
      on_gpu.backend().to_host(std::span<T>(row), std::span<const T>(lg.row(r), row.size()));
      worst = std::max(worst, test::row_error(std::span<const T>(row), lc.row(r), V));
      const auto host = dg.last_logits(slots[std::size_t(r)]);  // the same row, copied by the decoder
      CHECK(std::equal(host.begin(), host.end(), row.begin()));
    }
  }
  INFO("largest logit difference, relative " << worst);
  CHECK(worst <= tol);

  // Greedy generation from the same prompts gives the same tokens.
  const infer::GenerateOptions o{.max_new_tokens = 6, .sampling = {.temperature = 0}};
  const std::vector<std::vector<token_t>> short_prompts{{1, 2, 3}, {4}};
  infer::Decoder gc(on_cpu, 2, C), gg(on_gpu, 2, C);
  const auto oc = infer::generate(gc, std::span<const std::vector<token_t>>(short_prompts), o);
  const auto og = infer::generate(gg, std::span<const std::vector<token_t>>(short_prompts), o);
  for (std::size_t b = 0; b < 2; ++b) CHECK(oc[b].tokens == og[b].tokens);
}

template <class Model, class T>
void compare_both_passes() {
  compare_decoder<Model, T>(4);  // passes of 4 prompt tokens: prompts split across passes
  compare_decoder<Model, T>(0);  // the default: every prompt token in one pass
}

using DecDense = LM<dims, Dense<2>>;
using DecDenseRope = LM<with_rope(dims), Dense<2>>;
using DecSharing = LM<dims, Assembly<Router<Share<Cycle<2>>>, ModuleSet<MHA<2>, FFN<2>>, K<1>, H<4>>>;
using DecMoE = LM<dims, MoEStack<2, 3, 2>>;
using DecMoMAll = LM<dims, Chunked<Layer, KaHbS<2, 3, 3, Router<GRU>>>>;
using DecMoMRouted = LM<with_rope(dims), Chunked<Layer, KaHbS<2, 3, 3, Router<GRU>, phi::MoMRoutedKV>>>;
using DecSkip = LM<dims, LayerSkipping<3>>;
using DecExit = LM<dims, EarlyExiting<3>>;
using DecModCausal = LM<dims, causal_sampling_arch<MoD<4, 1, 2, 2, CausalAux<>>>::type>;
using DecMoRCausal = LM<dims, causal_sampling_arch<MoRMiddleCycle<2, 3, CausalAux<>>>::type>;
using DecMoRToken = LM<dims, MoRMiddleCycle<2, 3, TokenChoice<Router<TopK<Softmax>, Renormalise<false>>>>>;
using DecMoRShare = LM<dims, causal_sampling_arch<MoRMiddleCycle<2, 3, CausalAux<>, KVShare>>::type>;
using DecMoEUT = LM<with_rope(dims), MoEUTStack<4, 2, SwitchHead<2, 2, 2, 16>, SigmaMoE<4, 2, 32>>>;
using DecMF = LM<without_positions(dims), ModuleFormer<2, MoA<4, 2, 16, 8>, SMoE<4, 2, 32, 8>>>;

}  // namespace

TEST_CASE("Decoder on cuda: dense, RoPE, sharing and MoE decode as on cpu (double and float)", "[cuda][decoder]") {
  if (!gpu_available()) {
    WARN("no CUDA device: skipped");
    return;
  }
  compare_both_passes<DecDense, double>();
  compare_both_passes<DecDense, float>();
  compare_both_passes<DecDenseRope, double>();
  compare_both_passes<DecSharing, double>();
  compare_both_passes<DecMoE, double>();
  compare_both_passes<DecMoE, float>();
}

TEST_CASE("Decoder on cuda: MoM, layer-skip, early exit and causal MoD decode as on cpu (double)",
          "[cuda][decoder][routed]") {
  if (!gpu_available()) {
    WARN("no CUDA device: skipped");
    return;
  }
  compare_both_passes<DecMoMAll, double>();
  compare_both_passes<DecMoMRouted, double>();
  compare_both_passes<DecSkip, double>();
  compare_both_passes<DecExit, double>();
  compare_both_passes<DecModCausal, double>();
}

TEST_CASE("Decoder on cuda: Mixture-of-Recursions, MoEUT and ModuleFormer decode as on cpu (double)",
          "[cuda][decoder][routed]") {
  if (!gpu_available()) {
    WARN("no CUDA device: skipped");
    return;
  }
  compare_both_passes<DecMoRCausal, double>();
  compare_both_passes<DecMoRToken, double>();
  compare_both_passes<DecMoRShare, double>();
  compare_both_passes<DecMoEUT, double>();
  compare_both_passes<DecMF, double>();
}

TEST_CASE("Decoder on cuda: a refused step or prefill names the problem and leaves the slots as they were",
          "[cuda][decoder]") {
  if (!gpu_available()) {
    WARN("no CUDA device: skipped");
    return;
  }
  auto model = DecDense::make<cuda::Backend<float>>(7);
  infer::Decoder dec(model, 2, 8);
  const std::vector<std::vector<token_t>> prompts{{1, 2}, {3}};
  dec.prefill(std::span<const std::vector<token_t>>(prompts));
  const std::vector<std::vector<token_t>> bad{{1, dims.vocab}};
  CHECK_THROWS_WITH(dec.prefill(std::span<const std::vector<token_t>>(bad)),
                    Catch::Contains("token 40 of prompt 0 outside the vocabulary [0, 40)"));
  CHECK((dec.length(0) == 2 && dec.length(1) == 1));
  const std::vector<index_t> slots{0, 0};
  const std::vector<token_t> toks{1, 2};
  CHECK_THROWS_WITH(dec.step(slots, toks), Catch::Contains("slot 0 appears twice in one step"));
  CHECK(dec.length(0) == 2);
}

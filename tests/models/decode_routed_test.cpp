// Incremental decoding of the routed executors (infer/decoder.hpp; docs/inference.md): prefill +
// step-by-step decode gives the logits of one full forward over the same tokens, for MoM with each
// key/value mode (phi::MoM: every token writes every module's keys; phi::MoMRoutedKV: only the routed
// tokens do), with SKIP, inside Chunked between dense layers and with RoPE; a batch of sequences of
// different lengths, one of which fills the context (tests/models/decode_check.hpp).
#include <catch2/catch.hpp>

#include <mom/mom.hpp>

#include "models/decode_check.hpp"

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

}  // namespace

TEST_CASE("decode MoM: prefill + step logits equal a full forward (double 1e-12, float 1e-5)", "[decode][mom]") {
  SECTION("phi::MoM: every token writes every module's keys, SKIP included") {
    CHECK(test::decode_error<MoMAll, double>() < 1e-12);
    CHECK(test::decode_error<MoMAll, float>() < 1e-5);
  }
  SECTION("phi::MoMRoutedKV: only the routed tokens write keys") {
    CHECK(test::decode_error<MoMRouted, double>() < 1e-12);
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

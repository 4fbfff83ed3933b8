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
  // Both sequences run to the end together: every step after the first takes the recorded graph when the
  // architecture's decode stays on the device, none when it reads the host.
  if constexpr (infer::Decoder<decltype(on_gpu)>::records_graphs) CHECK(gg.graph_steps() == 4);
  else CHECK(gg.graph_steps() == 0);
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

// Which architectures' steps the decoder records as CUDA graphs: those whose decode reads nothing from the host.
static_assert(infer::Decoder<ModelInstance<DecDense, cuda::Backend<float>>>::records_graphs);
static_assert(infer::Decoder<ModelInstance<DecMoE, cuda::Backend<float>>>::records_graphs);
static_assert(infer::Decoder<ModelInstance<DecMoEUT, cuda::Backend<double>>>::records_graphs);
static_assert(!infer::Decoder<ModelInstance<DecMoMAll, cuda::Backend<double>>>::records_graphs);
static_assert(!infer::Decoder<ModelInstance<DecSkip, cuda::Backend<double>>>::records_graphs);
static_assert(!infer::Decoder<ModelInstance<DecMoRCausal, cuda::Backend<double>>>::records_graphs);
static_assert(!infer::Decoder<ModelInstance<DecDense, cpu::Backend<float>>>::records_graphs);

// A whole step (every slot, in order) replayed from the recorded graph gives the bits of the same step run op by
// op, through partial steps in between and after the parameters change in place (the graph reads them through
// their pointers); under the emulation a replayed step is one graph launch: no kernel launch, no host wait, no
// allocation. After the backend's workspace grows (a new buffer: the graph holds the old one) the next whole step
// runs op by op again and the one after records anew.
template <class Model>
void compare_graph_steps() {
  constexpr index_t C = Model::dims.context, V = Model::dims.vocab, S = 3;
  auto model = Model::template make<cuda::Backend<float>>(5);
  auto& be = model.backend();
  infer::Decoder graphs(model, S, C), ops(model, S, C);
  ops.use_graphs(false);
  const std::vector<std::vector<token_t>> prompts{{1, 2, 3}, {4}, {5, 6}};
  graphs.prefill(std::span<const std::vector<token_t>>(prompts));
  ops.prefill(std::span<const std::vector<token_t>>(prompts));
  std::vector<float> a(std::size_t(S * V)), b(std::size_t(S * V));
  const auto same_logits = [&](MatrixView<const float> la, MatrixView<const float> lb) {
    REQUIRE((la.rows == lb.rows && la.cols == V && lb.cols == V));
    const std::size_t n = std::size_t(la.rows * V);
    be.to_host(std::span<float>(a.data(), n), std::span<const float>(la.data, n));
    be.to_host(std::span<float>(b.data(), n), std::span<const float>(lb.data, n));
    CHECK(std::equal(a.begin(), a.begin() + std::ptrdiff_t(n), b.begin()));
  };
  const bool counted = mom_emu_launches && mom_emu_graph_launches;
  index_t whole = 0;
  for (index_t step = 0; step < 9; ++step) {
    if (step == 3) {  // a partial step: op by op on both
      const std::vector<index_t> slots{0, 2};
      const std::vector<token_t> toks{7, 8};
      same_logits(graphs.step(slots, toks), ops.step(slots, toks));
      continue;
    }
    if (step == 5) {  // new parameters in the same buffer
      std::vector<float> p(model.params().size());
      be.to_host(std::span<float>(p), std::span<const float>(model.params()));
      for (float& x : p) x *= 0.9f;
      be.from_host(model.params(), std::span<const float>(p));
    }
    const bool regrown = step == 7;
    if (regrown) be.reserve_workspace(std::size_t(64) << 20);  // twice the 32 MiB it starts with
    std::vector<token_t> toks(static_cast<std::size_t>(S));
    for (index_t s = 0; s < S; ++s) toks[std::size_t(s)] = token_t((step * 7 + s * 3) % V);
    const test::EmuCounters t0 = counted ? test::EmuCounters::now() : test::EmuCounters{};
    const auto lg = graphs.step(std::span<const token_t>(toks));
    const test::EmuCounters t1 = counted ? test::EmuCounters::now() : test::EmuCounters{};
    const auto lo = ops.step(std::span<const token_t>(toks));
    if (regrown) {  // op by op, as the first whole step
      if (counted) CHECK((t1 - t0).graph_launches == 0);
    } else if (counted && whole >= 2) {  // the first whole step runs op by op, the second records the graph
      const test::EmuCounters g = t1 - t0, o = test::EmuCounters::now() - t1;
      CHECK(g.graph_launches == 1);
      CHECK(g.launches == 0);
      CHECK(o.launches > 0);
      CHECK(g.gemm_calls == o.gemm_calls);  // the replay ran the same products
      CHECK(g.gemm_flops == o.gemm_flops);
      CHECK(g.host_waits == 0);
      CHECK(g.allocations == 0);
    }
    same_logits(lg, lo);
    ++whole;
  }
  CHECK(graphs.graph_steps() == whole - 2);  // all whole steps but the first and the one after the workspace grew
  CHECK(ops.graph_steps() == 0);
  for (index_t s = 0; s < S; ++s) {
    const auto x = graphs.last_logits(s);
    const std::vector<float> row(x.begin(), x.end());
    const auto y = ops.last_logits(s);
    CHECK(std::equal(row.begin(), row.end(), y.begin()));
  }
}

TEST_CASE("Decoder on cuda: whole steps replay one recorded graph with the bits of the steps run op by op",
          "[cuda][decoder][graph]") {
  if (!gpu_available()) {
    WARN("no CUDA device: skipped");
    return;
  }
  compare_graph_steps<DecDense>();
  compare_graph_steps<DecDenseRope>();
  compare_graph_steps<DecMoE>();
}

TEST_CASE("cuda::Backend::record: a host wait inside is refused, nothing runs, the stream goes on", "[cuda][graph]") {
  if (!gpu_available()) {
    WARN("no CUDA device: skipped");
    return;
  }
  cuda::Backend<float> be;
  auto buf = be.alloc(4);
  be.fill(buf.span(), 1.0f);
  CHECK_THROWS_AS(be.record([&] {
    be.fill(buf.span(), 2.0f);
    be.sync();
  }), Error);
  std::vector<float> h(4);
  be.to_host(std::span<float>(h), std::span<const float>(buf.span()));
  CHECK(h == std::vector<float>(4, 1.0f));  // the recorded fill never ran
  const auto g = be.record([&] { be.scale(buf.span(), 3.0f); });
  be.to_host(std::span<float>(h), std::span<const float>(buf.span()));
  CHECK(h == std::vector<float>(4, 1.0f));  // recorded, not run
  be.replay(g);
  be.replay(g);
  be.to_host(std::span<float>(h), std::span<const float>(buf.span()));
  CHECK(h == std::vector<float>(4, 9.0f));
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

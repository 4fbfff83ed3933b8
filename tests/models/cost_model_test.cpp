// The constexpr cost model: parameter counts of the GPT-2 shapes, the layout, FLOPs and
// activation sizes, the type vocabulary, describe(). Everything here is a compile-time
// fact checked by static_assert, plus a few runtime checks of the same tables.
#include <catch2/catch.hpp>

#include <set>
#include <string>

#include "mom/models/describe.hpp"
#include "mom/models/gpt2.hpp"
#include "mom/models/lm.hpp"

using namespace mom;

// ---- exact parameter counts (tied embeddings) --------------------------------------------
static_assert(GPT2Small::params == 124'439'808);
static_assert(GPT2Medium::params == 354'823'168);
static_assert(GPT2Large::params == 774'030'080);

// ---- the dense transformer is literally the MoM 5-tuple with a sequential router ---------
static_assert(std::is_same_v<Dense<12>, Assembly<Router<Sequential>, ModuleSet<MHA<12>, FFN<12>>, K<1>, H<12>>>);
static_assert(std::is_same_v<Dense<12>, Assembly<Router<Sequential>, ModuleSet<MHA<12>, FFN<12>>, K<1>, H<12>, phi::MoM>>);
static_assert(std::is_same_v<Layer, Dense<1>>);
static_assert(Dense<12>::valid && Dense<12>::depth == 12 && Dense<12>::steps == 12);

// Dims is structural: equal numbers give the same model type.
constexpr Dims tiny{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
constexpr Dims tiny_again{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
static_assert(std::is_same_v<LM<tiny, Dense<4>>, LM<tiny_again, Dense<4>>>);
// d_ff defaults to 4 * d_model.
constexpr Dims default_ff{.d_model = 64, .heads = 4, .vocab = 256, .context = 64};
static_assert(default_ff.ff() == 256 && LM<default_ff, Dense<4>>::params == LM<tiny, Dense<4>>::params);

// ---- the layout ---------------------------------------------------------------------------
using Small = GPT2Small;
static_assert(Small::layout.size() == 2 + 12 * 12 + 2);
static_assert(std::tuple_size_v<decltype(Small::layout)> == Small::tensor_count);
static_assert(Small::layout[0].name == "wte" && Small::layout[0].rows == 50257 && Small::layout[0].cols == 768);
static_assert(Small::layout[1].name == "wpe" && Small::layout[1].rows == 1024 && Small::layout[1].offset == 50257 * 768);
static_assert(Small::find("h.0.ln_1.w").offset == (50257 + 1024) * 768);
static_assert(Small::find("h.3.attn.w_qkv").rows == 3 * 768 && Small::find("h.3.attn.w_qkv").cols == 768);
static_assert(Small::find("h.3.attn.b_qkv").rows == 1 && Small::find("h.3.attn.b_qkv").cols == 3 * 768);
static_assert(Small::find("h.11.mlp.w_fc").rows == 3072 && Small::find("h.11.mlp.w_proj").cols == 3072);
static_assert(Small::layout.back().name == "ln_f.b" && Small::layout.back().offset + 768 == Small::params);
// One layer occupies 12 d^2 + 13 d parameters, contiguous.
static_assert(Small::find("h.4.ln_1.w").offset - Small::find("h.3.ln_1.w").offset == 12 * 768 * 768 + 13 * 768);

// A chunking of layers has the same layout as the dense stack of the same depth.
using Chunk1 = LM<tiny, Chunked<Layer, Layer, Dense<2>>>;
using Plain4 = LM<tiny, Dense<4>>;
static_assert(Chunk1::params == Plain4::params && Chunk1::depth == 4);
static_assert(Chunk1::flops_per_token(64) == Plain4::flops_per_token(64));
static_assert(Chunk1::activation_elements(2, 64) == Plain4::activation_elements(2, 64));

template <class Model>
void check_layout() {
  std::set<std::string> names;
  index_t expected = 0;
  for (const auto& p : Model::layout) {
    INFO(std::string(p.name));
    CHECK(p.offset == expected);  // contiguous, in order, no overlap
    CHECK(p.rows >= 1);
    CHECK(p.cols >= 1);
    expected += p.rows * p.cols;
    CHECK(names.insert(std::string(p.name)).second);  // unique names
  }
  CHECK(expected == Model::params);
}

TEST_CASE("layout: contiguous, unique names, sums to the parameter count", "[cost]") {
  check_layout<GPT2Small>();
  check_layout<GPT2Large>();
  check_layout<Chunk1>();
  for (std::size_t i = 0; i < Chunk1::layout.size(); ++i) {
    CHECK(Chunk1::layout[i].name == Plain4::layout[i].name);
    CHECK(Chunk1::layout[i].offset == Plain4::layout[i].offset);
  }
  // Names follow GPT-2 / llm.c: per layer ln_1, attn, ln_2, mlp.
  const char* per_layer[] = {"ln_1.w", "ln_1.b", "attn.w_qkv", "attn.b_qkv", "attn.w_proj", "attn.b_proj",
                             "ln_2.w", "ln_2.b", "mlp.w_fc",   "mlp.b_fc",   "mlp.w_proj",  "mlp.b_proj"};
  for (int l = 0; l < 12; ++l)
    for (int t = 0; t < 12; ++t)
      CHECK(GPT2Small::layout[2 + 12 * l + t].name == "h." + std::to_string(l) + "." + per_layer[t]);
}

// ---- FLOPs per token: formula (docs/architecture.md) ------------------------------------
constexpr index_t dense_flops(Dims D, index_t L, index_t seq) {
  const index_t d = D.d_model, f = D.ff();
  return L * (2 * d * 3 * d + 2 * d * d + 2 * d * f + 2 * f * d + 2 * d * (seq + 1)) + 2 * d * D.vocab;
}
static_assert(GPT2Small::flops_per_token(1024) == dense_flops(gpt2_small, 12, 1024));
static_assert(GPT2Small::flops_per_token(1) == dense_flops(gpt2_small, 12, 1));
static_assert(GPT2Small::flops_per_token(1024) == 265'956'864);
static_assert(GPT2Large::flops_per_token(1024) == dense_flops(gpt2_large, 36, 1024));
// Without attention the forward is ~2 FLOPs per parameter of the matrices used (the classic
// 2N rule; wpe and LayerNorm/bias parameters are not multiplied).
static_assert(GPT2Small::flops_per_token(0) - 12 * 2 * 768 ==
              2 * (GPT2Small::params - 1024 * 768 - 12 * 13 * 768 - 2 * 768));
static_assert(GPT2Small::forward_flops(4, 1024) == 4 * 1024 * GPT2Small::flops_per_token(1024));
// Training: 3x the products of the linears, 3.5x the causal attention products.
static_assert(GPT2Small::training_flops_per_token(1024) ==
              3 * (GPT2Small::flops_per_token(1024) - 12 * 2 * 768 * 1025) + 12 * 7 * 768 * 1025);

// ---- activation memory ---------------------------------------------------------------------
// Each region of the plan: rounded up to 16 elements, then the workspace guard after it (core/layout.hpp; 16 in
// the test builds); each module's backward scratch also has a guard after it (modules/checked.hpp).
constexpr index_t G = workspace_guard;
constexpr index_t take(index_t n) { return (n + 15) / 16 * 16 + G; }
constexpr index_t dense_activation_elements(Dims D, index_t L, index_t B, index_t S) {
  const index_t n = B * S, d = D.d_model, f = D.ff();
  const index_t attn = take(n * d) + 2 * take(n) + take(n * 3 * d) + take(n * d) + take(B * D.heads * S);
  const index_t ffn = take(n * d) + 2 * take(n) + 2 * take(n * f);
  const index_t per_layer = attn + ffn + 2 * take(n * d);  // + residual stream after each round
  const index_t scratch = take(std::max({n * d, n * 5 * d + G, n * (2 * f + d) + G}));
  return take(n * d) + L * per_layer + take(n * d) + 2 * take(n) + take(n * D.vocab) + take(n) + take(1) + take(1) +
         2 * take(n * d) + scratch;
}
static_assert(Plain4::activation_elements(3, 50) == dense_activation_elements(tiny, 4, 3, 50));
static_assert(GPT2Small::activation_elements(4, 1024) == dense_activation_elements(gpt2_small, 12, 4, 1024));
static_assert(GPT2Small::activation_bytes<float>(4, 1024) == GPT2Small::activation_elements(4, 1024) * 4 + 2 * 4 * 1024 * 4);
static_assert(GPT2Small::activation_bytes<double>(1, 8) == GPT2Small::activation_elements(1, 8) * 8 + 2 * 8 * 4);

// ---- module set vocabulary -------------------------------------------------------------------
using MoMSet = ModuleSet<MHA<4>, FFN<4>, Skip>;
static_assert(MoMSet::n_attention == 4 && MoMSet::n_ffn == 4 && MoMSet::has_skip);
static_assert(MoMSet::selectable_attention == 5 && MoMSet::selectable_ffn == 5 && MoMSet::depth == 4);
static_assert(ModuleSet<FFN<3>, MHA<2>>::depth == 3 && !ModuleSet<FFN<3>, MHA<2>>::has_skip);

TEST_CASE("find: by name at compile time and at run time", "[cost]") {
  static_assert(&GPT2Small::find("ln_f.w") == &GPT2Small::layout[GPT2Small::layout.size() - 2]);
  CHECK(GPT2Small::find(std::string("h.7.mlp.b_fc")).cols == 3072);
  CHECK_THROWS_WITH(GPT2Small::find("h.12.mlp.b_fc"), Catch::Contains("no parameter named 'h.12.mlp.b_fc'"));
}

TEST_CASE("describe: one line with shape, depth, params and FLOPs", "[cost]") {
  const std::string s = describe<GPT2Small>();
  CHECK(s == "LM<d_model=768 heads=12 d_ff=3072 vocab=50257 context=1024> Dense<12>: depth 12, 12 steps, "
             "124,439,808 params, 266 MFLOP/token forward at seq 1024");
  CHECK(s.find('\n') == std::string::npos);
  CHECK(describe<Chunk1>(32) ==
        "LM<d_model=64 heads=4 d_ff=256 vocab=256 context=64> Chunked[1-1-2](Layer, Layer, Dense<2>): depth 4, 4 steps, "
        "220,544 params, 0.4429 MFLOP/token forward at seq 32");
}

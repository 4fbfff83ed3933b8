// Hugging Face GPT-2 interop (train/hf_gpt2.hpp): a checkpoint written in the exact HF layout by
// scripts/make_hf_gpt2_fixture.py (stdlib Python, independent of our code) is imported, checked value by value
// against the file (Conv1D weights transposed), run against the script's own GPT-2 forward pass, exported and
// compared byte for byte; malformed files are refused naming the tensor.
#include <catch2/catch.hpp>

#include <mom/mom.hpp>
#include <mom/models/mom_models.hpp>
#include <mom/train/hf_gpt2.hpp>

#include "helpers.hpp"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

using namespace mom;
using namespace mom::train;

namespace {

// The fixture's shapes: n_embd 32, n_head 4, n_layer 2, vocab 64, n_positions 16 (d_ff = 4 * n_embd).
constexpr Dims tiny_dims{.d_model = 32, .heads = 4, .d_ff = 128, .vocab = 64, .context = 16};
using TinyGPT2 = LM<tiny_dims, Dense<2>>;
using TinyGPT2x3 = LM<tiny_dims, Dense<3>>;
constexpr Dims wider_vocab{.d_model = 32, .heads = 4, .d_ff = 128, .vocab = 128, .context = 16};
using TinyGPT2v128 = LM<wider_vocab, Dense<2>>;

static_assert(hf::is_hf_gpt2_compatible<TinyGPT2>());
static_assert(hf::is_hf_gpt2_compatible<GPT2Small>());
static_assert(!hf::is_hf_gpt2_compatible<LM<tiny_dims, Chunked<Layer, Layer, MoM_E<>, Layer, Layer>>>(),
              "routers have no GPT-2 counterpart");
static_assert(hf::hf_name_of("h.11.mlp.w_fc").transposed && hf::hf_name_of("h.11.mlp.w_fc").tensor == "mlp.c_fc.weight");
static_assert(!hf::hf_name_of("h.1.mlp.b_fc").transposed && hf::hf_name_of("wpe").tensor == "wpe.weight");

bool have_python() {
  static const bool ok = std::system("python3 -c 'import json, struct' >/dev/null 2>&1") == 0;
  return ok;
}

// Runs the fixture script into `dir` with extra arguments; stdout goes to `stdout_path` if given.
void make_fixture(const std::filesystem::path& dir, const std::string& args, const std::string& stdout_path = "") {
  const std::string script = (mom_test::source_dir() / "scripts" / "make_hf_gpt2_fixture.py").string();
  const std::string cmd = "python3 '" + script + "' '" + dir.string() + "' " + args +
                          (stdout_path.empty() ? "" : " > '" + stdout_path + "'");
  REQUIRE(std::system(cmd.c_str()) == 0);
  REQUIRE(std::filesystem::exists(dir / "model.safetensors"));
}

#define REQUIRE_PYTHON()                                                        \
  if (!have_python()) {                                                         \
    WARN("SKIPPED: python3 not available (needed by make_hf_gpt2_fixture.py)"); \
    return;                                                                     \
  }

std::vector<float> read_f32(const safetensors::File& f, const std::string& name) {
  const auto* t = f.find(name);
  REQUIRE(t != nullptr);
  std::vector<float> v(std::size_t(t->elements()));
  f.read<float>(name, std::span<float>(v));
  return v;
}

template <class Instance>
std::vector<typename Instance::scalar> params_of(Instance& m) {
  return std::vector<typename Instance::scalar>(m.params().begin(), m.params().end());
}

// Imports `file` into `m` expecting a refusal whose message contains every string of `parts`; the model must be
// left untouched.
template <class Instance>
void check_refused(Instance& m, const std::filesystem::path& file, std::initializer_list<std::string> parts) {
  const auto before = params_of(m);
  try {
    hf::import_hf_gpt2(m, file);
    FAIL("import_hf_gpt2 accepted " << file);
  } catch (const Error& e) {
    const std::string msg = e.what();
    INFO(msg);
    for (const auto& p : parts) CHECK_THAT(msg, Catch::Contains(p));
  }
  CHECK(params_of(m) == before);
}

// Rewrites an F32 fixture with `edit` applied to its (name -> shape, values) list.
struct Tensor {
  std::string name;
  std::vector<std::int64_t> shape;
  std::vector<float> values;
};
std::vector<Tensor> load_all(const std::filesystem::path& path) {
  safetensors::File f(path);
  std::vector<Tensor> out;
  for (const auto& t : f.tensors()) out.push_back({t.name, t.shape, read_f32(f, t.name)});
  return out;
}
void save_all(const std::filesystem::path& path, const std::vector<Tensor>& tensors) {
  safetensors::Writer w;
  for (const auto& t : tensors) w.add<float>(t.name, std::span<const float>(t.values), t.shape);
  w.metadata("format", "pt");
  w.write(path);
}

}  // namespace

TEST_CASE("HF GPT-2 import: every tensor lands in place, Conv1D weights transposed", "[hf_gpt2]") {
  REQUIRE_PYTHON();
  mom_test::TempDir dir("hf_import");
  make_fixture(dir.path, "--attn-bias");
  const auto file = dir / "model.safetensors";
  auto m = TinyGPT2::make<cpu::Backend<float>>(7);
  const auto meta = hf::import_hf_gpt2(m, file);
  CHECK(meta.at("format") == "pt");

  safetensors::File f(file);
  // Spot checks written out by hand: ours[out][in] == theirs[in][out].
  const auto c_attn = read_f32(f, "h.0.attn.c_attn.weight");  // [32, 96]
  const auto w_qkv = m.param(TinyGPT2::find("h.0.attn.w_qkv"));  // [96 x 32]
  CHECK(w_qkv(5, 2) == c_attn[2 * 96 + 5]);
  CHECK(w_qkv(95, 31) == c_attn[31 * 96 + 95]);
  CHECK(w_qkv(64, 0) == c_attn[0 * 96 + 64]);  // first column of v
  CHECK(w_qkv(5, 2) != w_qkv(2, 5));           // the fixture is not symmetric: the checks above mean something
  const auto c_fc = read_f32(f, "h.1.mlp.c_fc.weight");  // [32, 128]
  CHECK(m.param(TinyGPT2::find("h.1.mlp.w_fc"))(100, 7) == c_fc[7 * 128 + 100]);
  const auto mlp_proj = read_f32(f, "h.1.mlp.c_proj.weight");  // [128, 32]
  CHECK(m.param(TinyGPT2::find("h.1.mlp.w_proj"))(7, 100) == mlp_proj[100 * 32 + 7]);
  CHECK(m.param(TinyGPT2::find("wte"))(63, 31) == read_f32(f, "wte.weight")[63 * 32 + 31]);
  CHECK(m.param(TinyGPT2::find("h.1.ln_2.w"))(0, 3) == read_f32(f, "h.1.ln_2.weight")[3]);

  // Then every element of every tensor.
  for (const ParamInfo& p : TinyGPT2::layout) {
    INFO(p.name);
    const auto theirs = read_f32(f, hf::hf_full_name(p));
    const auto ours = m.param(p);
    const bool transposed = hf::hf_name_of(p.name).transposed;
    bool all_equal = true;
    for (index_t r = 0; r < p.rows; ++r)
      for (index_t c = 0; c < p.cols; ++c)
        all_equal &= ours(r, c) == theirs[std::size_t(transposed ? c * p.rows + r : r * p.cols + c)];
    CHECK(all_equal);
  }
}

TEST_CASE("HF GPT-2 import computes the same logits as a GPT-2 forward pass written in Python", "[hf_gpt2]") {
  REQUIRE_PYTHON();
  mom_test::TempDir dir("hf_logits");
  const std::vector<token_t> tokens{3, 1, 4, 1, 5, 9, 2, 6, 53, 63, 0, 8};
  std::string list;
  for (auto t : tokens) {
    if (!list.empty()) list += ',';
    list += std::to_string(t);
  }
  make_fixture(dir.path, "--logits " + list, (dir / "ref.json").string());
  std::ifstream in(dir / "ref.json");
  const auto ref = nlohmann::json::parse(in)["logits"];
  REQUIRE(ref.size() == tokens.size());

  auto m = TinyGPT2::make<cpu::Backend<double>>(1);  // double: the reference is double arithmetic
  hf::import_hf_gpt2(m, dir / "model.safetensors");
  const index_t seq = index_t(tokens.size());
  m.reserve(1, seq);
  m.forward(tokens, {}, 1, seq);
  const auto logits = m.logits();
  double max_err = 0, max_abs = 0;
  for (index_t s = 0; s < seq; ++s)
    for (index_t v = 0; v < tiny_dims.vocab; ++v) {
      const double r = ref[std::size_t(s)][std::size_t(v)].get<double>();
      max_err = std::max(max_err, std::abs(logits(s, v) - r));
      max_abs = std::max(max_abs, std::abs(r));
    }
  INFO("max |logit| " << max_abs << ", max error " << max_err);
  CHECK(max_abs > 1.0);  // non-trivial logits
  CHECK(max_err < 1e-9);
}

TEST_CASE("HF GPT-2 export(import(x)) == x byte for byte, plain and transformer.-prefixed", "[hf_gpt2]") {
  REQUIRE_PYTHON();
  mom_test::TempDir dir("hf_roundtrip");
  struct Variant {
    std::string args;
    bool prefix;
  };
  for (const Variant& v : {Variant{"--attn-bias", false}, Variant{"--prefix --lm-head", true}}) {
    INFO("fixture args: " << v.args);
    const auto src = dir / "src";
    std::filesystem::remove_all(src);
    make_fixture(src, v.args);
    auto m = TinyGPT2::make<cpu::Backend<float>>(3);
    hf::import_hf_gpt2(m, src / "model.safetensors");
    hf::export_hf_gpt2(m, dir / "out.safetensors", {.transformer_prefix = v.prefix});

    safetensors::File original(src / "model.safetensors"), exported(dir / "out.safetensors");
    CHECK(exported.metadata().at("format") == "pt");
    std::size_t compared = 0;
    for (const auto& t : original.tensors()) {
      if (t.name == "lm_head.weight" || t.name.ends_with(".attn.bias")) continue;  // tied head, mask buffers
      INFO(t.name);
      const auto* e = exported.find(t.name);
      REQUIRE(e != nullptr);
      CHECK(e->dtype == "F32");
      CHECK(e->shape == t.shape);
      CHECK(read_f32(exported, t.name) == read_f32(original, t.name));
      ++compared;
    }
    CHECK(compared == TinyGPT2::tensor_count);
    CHECK(exported.tensors().size() == TinyGPT2::tensor_count);
    // Re-importing the export gives the same parameters.
    auto again = TinyGPT2::make<cpu::Backend<float>>(4);
    hf::import_hf_gpt2(again, dir / "out.safetensors");
    CHECK(params_of(again) == params_of(m));
  }
}

TEST_CASE("HF GPT-2 import converts F16 and BF16 checkpoints exactly", "[hf_gpt2]") {
  // Known half-precision encodings, subnormals and specials included.
  CHECK(hf::detail::half_to_float(0x3C00) == 1.0f);
  CHECK(hf::detail::half_to_float(0xC000) == -2.0f);
  CHECK(hf::detail::half_to_float(0x7BFF) == 65504.0f);
  CHECK(hf::detail::half_to_float(0x0001) == std::ldexp(1.0f, -24));
  CHECK(hf::detail::half_to_float(0x03FF) == 1023 * std::ldexp(1.0f, -24));
  CHECK(hf::detail::half_to_float(0x0400) == std::ldexp(1.0f, -14));
  CHECK(std::isinf(hf::detail::half_to_float(0x7C00)));
  CHECK(std::isnan(hf::detail::half_to_float(0x7E00)));
  CHECK(std::signbit(hf::detail::half_to_float(0x8000)));
  CHECK(hf::detail::bf16_to_float(0x3F80) == 1.0f);
  CHECK(hf::detail::bf16_to_float(0xC0A0) == -5.0f);

  REQUIRE_PYTHON();
  mom_test::TempDir dir("hf_half");
  make_fixture(dir / "f32", "");
  make_fixture(dir / "f16", "--dtype F16");
  make_fixture(dir / "bf16", "--dtype BF16 --prefix");
  CHECK(safetensors::File(dir / "f16" / "model.safetensors").find("wte.weight")->dtype == "F16");
  auto ref = TinyGPT2::make<cpu::Backend<float>>(1);
  hf::import_hf_gpt2(ref, dir / "f32" / "model.safetensors");
  for (const char* sub : {"f16", "bf16"}) {
    INFO(sub);
    auto m = TinyGPT2::make<cpu::Backend<float>>(2);
    hf::import_hf_gpt2(m, dir / sub / "model.safetensors");
    CHECK(params_of(m) == params_of(ref));  // the fixture's values are exact in all three dtypes
  }
}

TEST_CASE("HF GPT-2 import refuses missing, misshapen, extra and untied tensors, naming them", "[hf_gpt2]") {
  REQUIRE_PYTHON();
  mom_test::TempDir dir("hf_refuse");
  make_fixture(dir / "ok", "--lm-head");
  const auto good = load_all(dir / "ok" / "model.safetensors");
  auto m = TinyGPT2::make<cpu::Backend<float>>(1);

  {  // a missing tensor
    auto ts = good;
    std::erase_if(ts, [](const Tensor& t) { return t.name == "h.1.mlp.c_fc.bias"; });
    save_all(dir / "missing.safetensors", ts);
    check_refused(m, dir / "missing.safetensors", {"has no tensor 'h.1.mlp.c_fc.bias'", "h.1.mlp.b_fc"});
  }
  {  // a Conv1D weight stored in our [out x in] orientation instead of HF's [in, out]
    auto ts = good;
    for (auto& t : ts)
      if (t.name == "h.0.attn.c_attn.weight") t.shape = {96, 32};
    save_all(dir / "transposed.safetensors", ts);
    check_refused(m, dir / "transposed.safetensors", {"'h.0.attn.c_attn.weight'", "[96, 32]", "[32, 96]"});
  }
  {  // lm_head that is not wte
    auto ts = good;
    for (auto& t : ts)
      if (t.name == "lm_head.weight") t.values[17] += 1.0f;
    save_all(dir / "untied.safetensors", ts);
    check_refused(m, dir / "untied.safetensors", {"lm_head.weight", "untied"});
  }
  {  // an unknown tensor
    auto ts = good;
    ts.push_back({"h.0.attn.rotary.weight", {2}, {1.0f, 2.0f}});
    save_all(dir / "unknown.safetensors", ts);
    check_refused(m, dir / "unknown.safetensors", {"unexpected tensor 'h.0.attn.rotary.weight'"});
  }
  // A model of other shapes: the first mismatching tensor is named.
  auto wide = TinyGPT2v128::make<cpu::Backend<float>>(1);
  check_refused(wide, dir / "ok" / "model.safetensors", {"'wte.weight'", "[64, 32]", "[128, 32]"});
  // A file with more layers than the model, and a model with more layers than the file.
  make_fixture(dir / "three", "--n-layer 3");
  check_refused(m, dir / "three" / "model.safetensors", {"more layers than the model (2)", "tensor 'h.2."});
  auto deep = TinyGPT2x3::make<cpu::Backend<float>>(1);
  check_refused(deep, dir / "ok" / "model.safetensors", {"has no tensor 'h.2.ln_1.weight'"});
  // Not a GPT-2 file at all.
  save_all(dir / "other.safetensors", {Tensor{"weight", {2}, {1.0f, 2.0f}}});
  check_refused(m, dir / "other.safetensors", {"wte.weight", "not a GPT-2 checkpoint"});
}

TEST_CASE("our dense model exported in HF layout imports back identically, same loss", "[hf_gpt2]") {
  mom_test::TempDir dir("hf_ours");
  auto a = TinyGPT2::make<cpu::Backend<float>>(11);
  hf::export_hf_gpt2(a, dir / "model.safetensors", {.transformer_prefix = true, .lm_head = true});
  safetensors::File f(dir / "model.safetensors");
  CHECK(f.metadata().at("format") == "pt");
  REQUIRE(f.find("transformer.h.1.attn.c_proj.weight") != nullptr);
  CHECK(f.find("transformer.h.1.attn.c_proj.weight")->shape == std::vector<std::int64_t>{32, 32});
  CHECK(f.find("lm_head.weight")->shape == std::vector<std::int64_t>{64, 32});
  // c_proj (square) written transposed: theirs[in][out] == ours[out][in].
  const auto proj = read_f32(f, "transformer.h.1.attn.c_proj.weight");
  const auto ours = a.param(TinyGPT2::find("h.1.attn.w_proj"));
  CHECK(proj[3 * 32 + 20] == ours(20, 3));
  CHECK(proj[3 * 32 + 20] != ours(3, 20));

  auto b = TinyGPT2::make<cpu::Backend<float>>(12);
  REQUIRE(params_of(b) != params_of(a));
  hf::import_hf_gpt2(b, dir / "model.safetensors");
  CHECK(params_of(b) == params_of(a));
  std::vector<token_t> tokens(2 * 16), targets(2 * 16);
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = token_t((i * 37 + 5) % 64);
    targets[i] = token_t((i * 11 + 3) % 64);
  }
  a.reserve(2, 16);
  b.reserve(2, 16);
  const float la = a.forward(tokens, targets, 2, 16), lb = b.forward(tokens, targets, 2, 16);
  CHECK(la == lb);
  CHECK(la > 3.0f);  // ~ln(64) for a fresh model: a real loss was computed

  // A double model exports F32 and imports back to the same floats.
  auto d = TinyGPT2::make<cpu::Backend<double>>(11);
  hf::export_hf_gpt2(d, dir / "double.safetensors");
  auto e = TinyGPT2::make<cpu::Backend<float>>(13);
  hf::import_hf_gpt2(e, dir / "double.safetensors");
  for (std::size_t i = 0; i < e.params().size(); i += 97) CHECK(e.params()[i] == static_cast<float>(d.params()[i]));
}

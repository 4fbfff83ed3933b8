// Hugging Face GPT-2 interop: read a `model.safetensors` of gpt2 / gpt2-medium / gpt2-large (or any GPT-2 of the
// same layout) into a dense LM<dims, Dense<L>>, and write our dense models in that layout so that
// transformers.GPT2LMHeadModel.from_pretrained (with a matching config.json) or safetensors.torch.load_file read
// them. Phase 1 of the paper's two-phase training (§3.4) can so be a real pretrained GPT-2 (then warm_start).
//
//   auto m = GPT2Small::make<cpu::Backend<float>>(0);
//   mom::train::hf::import_hf_gpt2(m, "gpt2/model.safetensors");
//   mom::train::hf::export_hf_gpt2(m, "out/model.safetensors");
//
// Name and layout mapping (ours <- theirs; <i> the layer; their names may carry a "transformer." prefix):
//   wte, wpe                         <- wte.weight [V, d], wpe.weight [C, d]               (same layout)
//   h.<i>.ln_1.w / .b                <- h.<i>.ln_1.weight / .bias [d]
//   h.<i>.attn.w_qkv [3d × d]        <- h.<i>.attn.c_attn.weight [d, 3d]   TRANSPOSED
//   h.<i>.attn.b_qkv [3d]            <- h.<i>.attn.c_attn.bias [3d]
//   h.<i>.attn.w_proj [d × d]        <- h.<i>.attn.c_proj.weight [d, d]    TRANSPOSED
//   h.<i>.attn.b_proj [d]            <- h.<i>.attn.c_proj.bias [d]
//   h.<i>.ln_2.w / .b                <- h.<i>.ln_2.weight / .bias [d]
//   h.<i>.mlp.w_fc [f × d]           <- h.<i>.mlp.c_fc.weight [d, f]       TRANSPOSED
//   h.<i>.mlp.b_fc [f]               <- h.<i>.mlp.c_fc.bias [f]
//   h.<i>.mlp.w_proj [d × f]         <- h.<i>.mlp.c_proj.weight [f, d]     TRANSPOSED
//   h.<i>.mlp.b_proj [d]             <- h.<i>.mlp.c_proj.bias [d]
//   ln_f.w / .b                      <- ln_f.weight / .bias [d]
// GPT-2's Conv1D computes y = x·W + b with W stored [in, out]; our linear computes y = x·wᵀ + b with w [out × in],
// hence the transposes. Both split c_attn's 3d outputs as [q | k | v] with head h in columns h·hd .. h·hd+hd-1 of
// each part, use GELU's tanh approximation ("gelu_new"), LayerNorm eps 1e-5 and a head tied to wte, so the
// imported model computes the same function. `lm_head.weight` (tied, often absent) must equal wte.weight if
// present; the `h.<i>.attn.bias` / `attn.masked_bias` causal-mask buffers are ignored. The number of heads is not
// stored in the file: Dims::heads must match config.json's n_head (d_ff: n_inner, or 4·n_embd when null).
//
// Import accepts F32, F64, F16 and BF16 tensors (converted to the model's scalar); every tensor's name, shape and
// dtype is checked, and every tensor of the file must be used or known to be ignorable, before the model is
// touched: a refused file leaves the model as it was, with a mom::Error naming the tensor. Export writes F32 with
// __metadata__ {"format": "pt"}, atomically (temporary file + rename).
#pragma once

#include <mom/core/check.hpp>
#include <mom/models/lm.hpp>
#include <mom/models/runtime.hpp>
#include <mom/train/file_io.hpp>
#include <mom/train/safetensors.hpp>

#include <array>
#include <bit>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace mom::train::hf {

// One of our tensor names in Hugging Face terms: "h.<i>." (kept as is), then the module tensor.
struct HFName {
  std::string_view layer_prefix;  // "h.3." or "" for model-level tensors
  std::string_view tensor;        // "attn.c_attn.weight"
  bool transposed = false;        // Conv1D weight: theirs [in, out] = ours [out × in] transposed
  bool ok = false;                // false: the tensor has no GPT-2 counterpart (e.g. a router)
};

constexpr HFName hf_name_of(std::string_view ours) {
  constexpr std::array<std::array<std::string_view, 2>, 4> model_level{
      {{"wte", "wte.weight"}, {"wpe", "wpe.weight"}, {"ln_f.w", "ln_f.weight"}, {"ln_f.b", "ln_f.bias"}}};
  for (const auto& [a, b] : model_level)
    if (ours == a) return {"", b, false, true};
  // "h.<digits>.<rest>"
  if (ours.size() < 4 || ours.substr(0, 2) != "h.") return {};
  std::size_t at = 2;
  while (at < ours.size() && ours[at] >= '0' && ours[at] <= '9') ++at;
  if (at == 2 || at >= ours.size() || ours[at] != '.') return {};
  const std::string_view prefix = ours.substr(0, at + 1), rest = ours.substr(at + 1);
  struct Row {
    std::string_view ours, theirs;
    bool transposed;
  };
  constexpr std::array<Row, 12> layer_level{{{"ln_1.w", "ln_1.weight", false},
                                             {"ln_1.b", "ln_1.bias", false},
                                             {"attn.w_qkv", "attn.c_attn.weight", true},
                                             {"attn.b_qkv", "attn.c_attn.bias", false},
                                             {"attn.w_proj", "attn.c_proj.weight", true},
                                             {"attn.b_proj", "attn.c_proj.bias", false},
                                             {"ln_2.w", "ln_2.weight", false},
                                             {"ln_2.b", "ln_2.bias", false},
                                             {"mlp.w_fc", "mlp.c_fc.weight", true},
                                             {"mlp.b_fc", "mlp.c_fc.bias", false},
                                             {"mlp.w_proj", "mlp.c_proj.weight", true},
                                             {"mlp.b_proj", "mlp.c_proj.bias", false}}};
  for (const auto& r : layer_level)
    if (rest == r.ours) return {prefix, r.theirs, r.transposed, true};
  return {};
}

// True when every tensor of Model has a GPT-2 counterpart (a dense GPT-2 style model).
template <class Model>
constexpr bool is_hf_gpt2_compatible() {
  for (const auto& p : Model::layout)
    if (!hf_name_of(p.name).ok) return false;
  return true;
}

// The Hugging Face name (without the optional "transformer." prefix) and shape of one of our tensors.
inline std::string hf_full_name(const ParamInfo& p) {
  const HFName n = hf_name_of(p.name);
  return std::string(n.layer_prefix) + std::string(n.tensor);
}
inline std::vector<std::int64_t> hf_shape(const ParamInfo& p) {
  if (p.rows == 1) return {p.cols};
  return hf_name_of(p.name).transposed ? std::vector<std::int64_t>{p.cols, p.rows}
                                       : std::vector<std::int64_t>{p.rows, p.cols};
}

namespace detail {

inline std::string shape_string(const std::vector<std::int64_t>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(s[i]);
  }
  return out + "]";
}

// IEEE half -> float, exact (normals, subnormals, infinities, NaN).
inline float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu;
  std::uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    bits = sign | (std::uint32_t(112 - e) << 23) | ((mant & 0x3FFu) << 13);
  }
  return std::bit_cast<float>(bits);
}
inline float bf16_to_float(std::uint16_t b) { return std::bit_cast<float>(std::uint32_t(b) << 16); }

// Element i of a little-endian tensor of dtype F32 / F64 / F16 / BF16, as double (exact for all four).
inline double element(const std::byte* data, std::string_view dtype, std::size_t i) {
  if (dtype == "F32") {
    float v;
    std::memcpy(&v, data + 4 * i, 4);
    return v;
  }
  if (dtype == "F64") {
    double v;
    std::memcpy(&v, data + 8 * i, 8);
    return v;
  }
  const auto u16 = static_cast<std::uint16_t>(get_le(data + 2 * i, 2));
  return dtype == "F16" ? half_to_float(u16) : bf16_to_float(u16);
}

}  // namespace detail

// Reads a Hugging Face GPT-2 model.safetensors into `model` (a dense model with the file's shapes). Returns the
// file's __metadata__.
template <class Instance>
std::map<std::string, std::string> import_hf_gpt2(Instance& model, const std::filesystem::path& path) {
  using Model = typename Instance::model_type;
  using T = typename Instance::scalar;
  static_assert(is_hf_gpt2_compatible<Model>(),
                "mom::train::hf::import_hf_gpt2: the model must be a dense GPT-2 style LM<dims, Dense<L>>: some of its "
                "tensors (e.g. routers) have no Hugging Face GPT-2 counterpart");
  static_assert(!is_hf_gpt2_compatible<Model>() || Model::dims.learned_positions(),
                "mom::train::hf::import_hf_gpt2: GPT-2 has a learned position embedding (wpe): a RoPE or position-free "
                "model (Dims::positions = RoPE / None) has none and computes a different function");
  static_assert(std::endian::native == std::endian::little, "import_hf_gpt2: big-endian hosts not supported");
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "import_hf_gpt2: float or double models");
  const safetensors::File file(path);  // validates header, offsets, tiling
  const std::string where = "import_hf_gpt2: '" + path.string() + "'";
  // The tensor data, mapped once more: File hands out only same-dtype copies and we also convert F16 / BF16.
  const MappedFile raw(path);
  const std::byte* data = raw.bytes().data() + 8 + get_le(raw.bytes().data(), 8);

  std::string prefix;
  if (file.find("wte.weight") == nullptr) {
    MOM_CHECK(file.find("transformer.wte.weight") != nullptr, where,
              " has no tensor 'wte.weight' (nor 'transformer.wte.weight'): not a GPT-2 checkpoint");
    prefix = "transformer.";
  }

  std::vector<T> host(static_cast<std::size_t>(Model::params));
  std::set<std::string> used;
  for (const ParamInfo& p : Model::layout) {
    const std::string name = prefix + hf_full_name(p);
    const safetensors::TensorInfo* t = file.find(name);
    MOM_CHECK(t != nullptr, where, " has no tensor '", name, "' (our '", p.name, "')");
    const auto want = hf_shape(p);
    MOM_CHECK(t->shape == want, where, ": tensor '", name, "' has shape ", detail::shape_string(t->shape),
              " but the model needs ", detail::shape_string(want), " (our '", p.name, "' is [", p.rows, "x", p.cols,
              "]); check the model's Dims against the checkpoint's config.json");
    MOM_CHECK(t->dtype == "F32" || t->dtype == "F64" || t->dtype == "F16" || t->dtype == "BF16", where,
              ": tensor '", name, "' has dtype ", t->dtype, "; F32, F64, F16 or BF16 expected");
    const std::byte* src = data + t->begin;
    T* dst = host.data() + p.offset;
    if (hf_name_of(p.name).transposed) {
      // theirs [cols × rows] (in, out) -> ours [rows × cols] (out, in)
      for (index_t i = 0; i < p.cols; ++i)
        for (index_t o = 0; o < p.rows; ++o)
          dst[o * p.cols + i] = static_cast<T>(detail::element(src, t->dtype, std::size_t(i * p.rows + o)));
    } else {
      for (index_t j = 0; j < p.size(); ++j) dst[j] = static_cast<T>(detail::element(src, t->dtype, std::size_t(j)));
    }
    used.insert(name);
  }

  // Everything else in the file must be known to be ignorable: an extra layer or an unknown tensor means the
  // file is not the model the caller thinks it is.
  for (const safetensors::TensorInfo& t : file.tensors()) {
    if (used.count(t.name)) continue;
    const std::string_view n = t.name;
    if (n.ends_with(".attn.bias") || n.ends_with(".attn.masked_bias")) continue;  // causal-mask buffers
    if (n == "lm_head.weight") {
      const ParamInfo& wte = Model::layout[0];
      const std::vector<std::int64_t> want{wte.rows, wte.cols};
      MOM_CHECK(t.shape == want, where, ": tensor 'lm_head.weight' has shape ", detail::shape_string(t.shape),
                " but the tied head needs ", detail::shape_string(want));
      MOM_CHECK(t.dtype == "F32" || t.dtype == "F64" || t.dtype == "F16" || t.dtype == "BF16", where,
                ": tensor 'lm_head.weight' has dtype ", t.dtype);
      for (index_t j = 0; j < wte.size(); ++j)
        MOM_CHECK(static_cast<T>(detail::element(data + t.begin, t.dtype, std::size_t(j))) == host[std::size_t(j)],
                  where, ": tensor 'lm_head.weight' differs from wte.weight (element ", j,
                  "): an untied LM head is not supported");
      continue;
    }
    if (n.starts_with(prefix + "h.")) {  // h.<layer>. with a layer the model does not have?
      std::size_t at = prefix.size() + 2;
      long long layer = 0;
      bool digits = false;
      for (; at < n.size() && n[at] >= '0' && n[at] <= '9'; ++at, digits = true) layer = layer * 10 + (n[at] - '0');
      if (digits && layer >= Model::depth)
        throw Error(where + " has more layers than the model (" + std::to_string(Model::depth) + "): tensor '" +
                    t.name + "'");
    }
    throw Error(where + ": unexpected tensor '" + t.name + "' (not part of a GPT-2 model of these shapes)");
  }

  model.backend().from_host(model.params(), std::span<const T>(host));
  return file.metadata();
}

struct ExportOptions {
  bool transformer_prefix = false;  // name tensors "transformer.wte.weight", ... (as GPT2LMHeadModel saves them)
  bool lm_head = false;             // also write the tied head as "lm_head.weight" (a copy of wte)
};

// Writes `model` (dense, GPT-2 style) as a Hugging Face GPT-2 model.safetensors: F32, Conv1D layout,
// __metadata__ {"format": "pt"} plus mom's checksums (safetensors.hpp; other tools ignore them), atomically.
template <class Instance>
void export_hf_gpt2(Instance& model, const std::filesystem::path& path, const ExportOptions& options = {}) {
  using Model = typename Instance::model_type;
  using T = typename Instance::scalar;
  static_assert(is_hf_gpt2_compatible<Model>(),
                "mom::train::hf::export_hf_gpt2: the model must be a dense GPT-2 style LM<dims, Dense<L>>: some of its "
                "tensors (e.g. routers) have no Hugging Face GPT-2 counterpart");
  static_assert(!is_hf_gpt2_compatible<Model>() || Model::dims.learned_positions(),
                "mom::train::hf::export_hf_gpt2: GPT-2 has a learned position embedding (wpe): a RoPE or position-free "
                "model (Dims::positions = RoPE / None) has none and computes a different function");
  std::vector<T> params(static_cast<std::size_t>(Model::params));
  model.backend().to_host(std::span<T>(params), std::span<const T>(model.params()));
  // Converted (and transposed) copies, in layout order; the writer keeps references into this buffer.
  std::vector<float> out(params.size());
  const std::string prefix = options.transformer_prefix ? "transformer." : "";
  safetensors::Writer w;
  for (const ParamInfo& p : Model::layout) {
    const T* src = params.data() + p.offset;
    float* dst = out.data() + p.offset;
    if (hf_name_of(p.name).transposed) {
      for (index_t o = 0; o < p.rows; ++o)
        for (index_t i = 0; i < p.cols; ++i) dst[i * p.rows + o] = static_cast<float>(src[o * p.cols + i]);
    } else {
      for (index_t j = 0; j < p.size(); ++j) dst[j] = static_cast<float>(src[j]);
    }
    w.add<float>(prefix + hf_full_name(p), std::span<const float>(dst, std::size_t(p.size())), hf_shape(p));
  }
  if (options.lm_head) {
    const ParamInfo& wte = Model::layout[0];
    w.add<float>("lm_head.weight", std::span<const float>(out.data() + wte.offset, std::size_t(wte.size())),
                 {wte.rows, wte.cols});
  }
  w.metadata("format", "pt");
  w.write(path);
}

}  // namespace mom::train::hf

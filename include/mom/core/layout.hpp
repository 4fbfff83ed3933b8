#pragma once
// The parameter layout: every tensor of a model has a name, a shape and an offset in one
// flat buffer, all known at compile time. Parameters and gradients are single buffers in
// this order, so AdamW, clipping, checkpoints and an all-reduce are single passes.
#include <algorithm>
#include <array>
#include <cstddef>
#include <string_view>
#include <vector>

#include "mom/core/tensor.hpp"

namespace mom {

// One tensor of the flat buffer. 1-D tensors (biases, LayerNorm) have rows == 1.
struct ParamInfo {
  std::string_view name;  // GPT-2 / llm.c style: "wte", "wpe", "h.3.attn.w_qkv", "ln_f.w"
  index_t rows = 0;
  index_t cols = 0;
  index_t offset = 0;  // in elements from the start of the flat buffer
  bool trainable = true;  // false: a buffer (a module's state that is not learned; see TensorSpec)
  constexpr index_t size() const { return rows * cols; }
};

// How a tensor is initialised (GPT-2): weights N(0, 0.02); the projections that write into
// the residual stream N(0, 0.02 / sqrt(2 * layers)); biases 0; LayerNorm gains 1.
enum class Init : unsigned char { Normal, ResidualNormal, Zero, One };

// A tensor as a module declares it: the name below its layer ("attn.w_qkv"), the layer it
// belongs to (-1 for model-level tensors such as "wte"), its shape and its initialisation.
// An expert of a per-layer expert set (Experts<FFN, E, PerStep>) also carries its index in the
// layer: "h.<layer>.expert.<expert>.<suffix>".
struct TensorSpec {
  std::string_view suffix;
  index_t layer = -1;
  index_t rows = 0;
  index_t cols = 0;
  Init init = Init::Normal;
  index_t expert = -1;
  // false: a buffer, stored and checkpointed with the parameters but never learned: AdamW never updates it.
  // Its gradient slot is 0 (ModuleFormer's pruning mask, modules/mlp_gate.hpp) or holds the statistic of a
  // rule applied between optimizer steps (DeepSeekMoE's selection bias and its expert loads,
  // routers/affinity.hpp; Model::update_buffers).
  bool trainable = true;
  constexpr index_t size() const { return rows * cols; }
};

namespace detail {
constexpr index_t decimal_digits(index_t v) {
  index_t n = 1;
  while (v >= 10) v /= 10, ++n;
  return n;
}
// Full name of a spec: "h.<layer>.[expert.<expert>.]<suffix>" or just "<suffix>".
inline constexpr std::string_view expert_prefix = "expert.";
constexpr index_t name_length(const TensorSpec& s) {
  return (s.layer >= 0 ? 3 + decimal_digits(s.layer) : 0) +
         (s.expert >= 0 ? index_t(expert_prefix.size()) + decimal_digits(s.expert) + 1 : 0) +
         static_cast<index_t>(s.suffix.size());
}
// Writes v in decimal at out[at..], returns the position after it.
template <std::size_t C>
constexpr std::size_t write_decimal(std::array<char, C>& out, std::size_t at, index_t v) {
  const index_t digits = decimal_digits(v);
  for (index_t i = digits - 1; i >= 0; --i, v /= 10) out[at + static_cast<std::size_t>(i)] = char('0' + v % 10);
  return at + static_cast<std::size_t>(digits);
}
template <std::size_t N>
constexpr std::size_t total_name_chars(const std::array<TensorSpec, N>& specs) {
  std::size_t n = 0;
  for (const auto& s : specs) n += static_cast<std::size_t>(name_length(s));
  return n;
}
// All names, back to back (no separators): layout entries are string_views into this.
template <std::size_t Chars, std::size_t N>
constexpr std::array<char, Chars + 1> build_names(const std::array<TensorSpec, N>& specs) {
  std::array<char, Chars + 1> out{};
  std::size_t at = 0;
  for (const auto& s : specs) {
    if (s.layer >= 0) {
      out[at++] = 'h';
      out[at++] = '.';
      at = write_decimal(out, at, s.layer);
      out[at++] = '.';
    }
    if (s.expert >= 0) {
      for (char c : expert_prefix) out[at++] = c;
      at = write_decimal(out, at, s.expert);
      out[at++] = '.';
    }
    for (char c : s.suffix) out[at++] = c;
  }
  return out;
}
template <std::size_t N, std::size_t C>
constexpr std::array<ParamInfo, N> build_layout(const std::array<TensorSpec, N>& specs, const std::array<char, C>& names) {
  std::array<ParamInfo, N> out{};
  std::size_t at = 0;
  index_t offset = 0;
  for (std::size_t i = 0; i < N; ++i) {
    const auto len = static_cast<std::size_t>(name_length(specs[i]));
    out[i] = ParamInfo{std::string_view(names.data() + at, len), specs[i].rows, specs[i].cols, offset, specs[i].trainable};
    at += len;
    offset += specs[i].size();
  }
  return out;
}
}  // namespace detail

// The first name that two entries of a layout share (empty when every name is unique): checkpoints address
// tensors by name, so a model whose modules name a tensor twice is refused when it is made (models/runtime.hpp).
template <std::size_t N>
std::string_view first_duplicate_name(const std::array<ParamInfo, N>& layout) {
  std::vector<std::string_view> names;
  names.reserve(N);
  for (const ParamInfo& p : layout) names.push_back(p.name);
  std::sort(names.begin(), names.end());
  const auto at = std::adjacent_find(names.begin(), names.end());
  return at == names.end() ? std::string_view{} : *at;
}

// Workspace guards, in debug builds (no NDEBUG) and the library's test builds (MOM_WORKSPACE_GUARD=16): every
// region an Arena hands out is followed by `workspace_guard` elements nobody owns, and every module's backward
// scratch by as many (modules/checked.hpp, guarded_scratch). ModelInstance fills them with a sentinel at
// reserve, and each module call through mom::checked (modules/checked.hpp) verifies them afterwards on a
// host-memory backend: a module that writes past its Saved activations or its declared scratch is reported by
// name at the call that did it. 0 in release builds: no gaps, no checks, the same plans as without them.
#ifndef MOM_WORKSPACE_GUARD
#ifdef NDEBUG
#define MOM_WORKSPACE_GUARD 0
#else
#define MOM_WORKSPACE_GUARD 16
#endif
#endif
inline constexpr index_t workspace_guard = MOM_WORKSPACE_GUARD;
static_assert(workspace_guard % 16 == 0, "MOM_WORKSPACE_GUARD must be a multiple of 16 elements");

// The sentinel a guard element holds (finite, so that == compares it).
template <class T>
inline constexpr T guard_value = T(-9.87654321e29);

// Bump allocator over one workspace, usable at compile time (the cost model's activation
// size) and at run time (carving the workspace) with the same code, so the two agree.
// Every block starts on a 16-element boundary (64 bytes for float), and is followed by the guard above.
struct Arena {
  static constexpr index_t align = 16;
  index_t used = 0;
  std::vector<index_t>* guards = nullptr;  // where each guard gap starts, when the owner of the buffer records them
  constexpr index_t take(index_t n) {
    const index_t at = used;
    used += (n + align - 1) / align * align;
    if constexpr (workspace_guard > 0) {
      if (guards != nullptr) guards->push_back(used);
      used += workspace_guard;
    }
    return at;
  }
};

namespace detail {
// The workspace whose guards the module calls of this thread verify (set by ModelInstance around its forward and
// backward; a module call on another buffer checks nothing).
struct ActiveGuards {
  const void* ws = nullptr;
  const std::vector<index_t>* gaps = nullptr;
};
inline thread_local ActiveGuards active_guards{};
}  // namespace detail

}  // namespace mom

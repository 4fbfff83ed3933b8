// The registry of named architectures that mom-train / mom-sample know. Each entry is a model type; the
// registry erases it behind two functions (train, sample), so the command line picks a type by name.
// To add an architecture: one line in registry() below.
#pragma once

#include <mom/mom.hpp>
#include <mom/train/train.hpp>

#include <functional>
#include <string>
#include <vector>

namespace mom::examples {

// Byte-level KJV models that train in minutes on a laptop-class CPU.
inline constexpr Dims tiny_dims{.d_model = 128, .heads = 4, .d_ff = 512, .vocab = 256, .context = 128};
inline constexpr Dims small_dims{.d_model = 192, .heads = 6, .d_ff = 768, .vocab = 256, .context = 256};
// The same with GPT-2's BPE vocabulary (tied 50257 x d embedding dominates the parameter count).
inline constexpr Dims small_bpe_dims{.d_model = 192, .heads = 6, .d_ff = 768, .vocab = 50257, .context = 128};

using Tiny = LM<tiny_dims, Dense<4>>;
using Small = LM<small_dims, Dense<4>>;
using SmallBpe = LM<small_bpe_dims, Dense<4>>;

struct TrainRequest;   // train.cpp
struct SampleRequest;  // sample.hpp

struct ArchEntry {
  std::string name;
  std::string tokenizer;  // default tokenizer: "byte" (vocab 256) or "gpt2"
  index_t vocab = 0, context = 0;
  std::string describe;   // describe<Model>()
  std::string note;       // one line for --help
  std::function<int(const TrainRequest&)> train;
  std::function<std::string(const SampleRequest&)> sample;
};

template <class Model>
ArchEntry make_architecture(std::string name, std::string tokenizer, std::string note);

const std::vector<ArchEntry>& registry();

inline const ArchEntry* find_architecture(std::string_view name) {
  for (const auto& a : registry())
    if (a.name == name) return &a;
  return nullptr;
}

inline std::string architecture_names() {
  std::string s;
  for (const auto& a : registry()) s += (s.empty() ? "" : ", ") + a.name;
  return s;
}

}  // namespace mom::examples

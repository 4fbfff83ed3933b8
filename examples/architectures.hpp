// The registry of named architectures that mom-train / mom-sample know. Each entry is a model type; the
// registry erases it behind two functions (train, sample), so the command line picks a type by name.
// To add an architecture: one line in registry() below.
#pragma once

#include <mom/mom.hpp>
#include <mom/models/mom_models.hpp>
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

// Mixture-of-Modules (issue 5): the paper's 8-layer [1-1-4-1-1] strategy with MoM_P / MoM_I / MoM_E
// chunks and its dense twin, byte-level; phase 1 trains dense8, phase 2 warm-starts a MoM model from it
// (mom-train --arch mom8-p --init-from <dense8 run>, §3.4).
inline constexpr Dims mom8_dims{.d_model = 256, .heads = 8, .d_ff = 1024, .vocab = 256, .context = 256};
using Dense8 = LM<mom8_dims, Dense<8>>;
using MoM8P = LM<mom8_dims, Strategy_11411<MoM_P<>>>;
using MoM8I = LM<mom8_dims, Strategy_11411<MoM_I<>>>;
using MoM8E = LM<mom8_dims, Strategy_11411<MoM_E<>>>;
// MoM-small [1-1-4-1-4-1] on GPT-2 small (dense twin: gpt2-small). Listed for their shapes and cost only:
// instantiating their training code would add minutes to every build of mom-train.
using GPT2SmallMoMP = MoMSmallLM<MoM_P<>>;
using GPT2SmallMoMI = MoMSmallLM<MoM_I<>>;
using GPT2SmallMoME = MoMSmallLM<MoM_E<>>;

struct TrainRequest;   // train.cpp
struct SampleRequest;  // sample.hpp
struct EvalRequest;    // evaluate.hpp
struct PruneRequest;   // evaluate.hpp

struct ArchEntry {
  std::string name;
  std::string tokenizer;  // default tokenizer: "byte" (vocab 256) or "gpt2"
  index_t vocab = 0, context = 0;
  std::string describe;   // describe<Model>()
  std::string note;       // one line for --help
  std::string dense_twin; // MoM models: the registered dense model a phase-2 run warm-starts from (--init-from)
  bool trainable = true;  // false: listed (describe line) only, not compiled into the training code
  bool kv_decode = false; // mom-sample decodes with the KV-cache Decoder (else: a forward over the window per token)
  std::function<int(const TrainRequest&)> train;
  std::function<std::string(const SampleRequest&)> sample;
  std::function<int(const EvalRequest&)> evaluate;
  std::function<int(const PruneRequest&)> prune;  // models whose modules can be pruned (ModuleFormer); else empty
};

// DenseTwin: for a MoM model, the dense model of the same depth that --init-from warm-starts it from.
template <class Model, class DenseTwin = void>
ArchEntry make_architecture(std::string name, std::string tokenizer, std::string note, std::string dense_twin = {});

const std::vector<ArchEntry>& registry();

// The special cases of the unified framework (issue 6), each family registered in its own translation unit
// (examples/arch_<family>.cpp) so that their training code compiles in parallel and is cached separately.
std::vector<ArchEntry> moe_architectures();      // arch_moe.cpp: MoE, MoE(share), MoDE (integrated)
std::vector<ArchEntry> depth_architectures();    // arch_depth.cpp: Mixture-of-Depths, MoDE (staged), layer-skip, early-exit
std::vector<ArchEntry> sharing_architectures();  // arch_sharing.cpp: parameter sharing (ALBERT, MoEUT cycles, AABB)
std::vector<ArchEntry> moeut_architectures();    // arch_moeut.cpp: MoEUT (σ-MoE + SwitchHead, layer grouping) and its ablations
std::vector<ArchEntry> moduleformer_architectures();  // arch_moduleformer.cpp: ModuleFormer and its module manipulations

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

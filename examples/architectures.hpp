// The registry of named architectures that mom-train / mom-sample know. Each entry is a model type; the
// registry erases it behind two functions (train, sample), so the command line picks a type by name.
// To add an architecture: one line in a family's list (examples/arch_<family>.hpp: reg.add<Model>(...)).
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
// MoM-small [1-1-4-1-4-1] on GPT-2 small (dense twin: gpt2-small), the MoM paper's own models (arch_mom_small.hpp).
using GPT2SmallMoMP = MoMSmallLM<MoM_P<>>;
using GPT2SmallMoMI = MoMSmallLM<MoM_I<>>;
using GPT2SmallMoME = MoMSmallLM<MoM_E<>>;

struct TrainRequest;   // train_model.hpp
struct SampleRequest;  // sample.hpp
struct EvalRequest;    // evaluate.hpp
struct PruneRequest;   // evaluate.hpp

// Where a command runs (--device cpu | cuda | cuda:N) and the precision of its matrix products (--precision
// fp32 | tf32 | bf16; empty: the device's default, fp32 on the CPU, tf32 on CUDA). Parsed and range-checked by
// parse_device; whether the device exists is checked when its backend is opened (backend_cuda.hpp).
enum class DeviceKind : int { cpu = 0, cuda = 1 };
inline constexpr int device_kinds = 2;
struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = -1;         // cuda:N; -1: this process's local rank under an MPI launcher, else 0
  std::string precision;  // fp32, tf32, bf16; empty: the device's default
  std::string name() const {
    if (kind == DeviceKind::cpu) return "cpu";
    return index < 0 ? std::string("cuda") : "cuda:" + std::to_string(index);
  }
};
inline const char* device_kind_name(DeviceKind k) { return k == DeviceKind::cpu ? "cpu" : "cuda"; }
inline Device parse_device(const std::string& device, const std::string& precision) {
  Device d;
  if (device == "cuda") {
    d.kind = DeviceKind::cuda;
  } else if (device.rfind("cuda:", 0) == 0) {
    d.kind = DeviceKind::cuda;
    const std::string n = device.substr(5);
    MOM_CHECK(!n.empty() && n.size() <= 4 && n.find_first_not_of("0123456789") == std::string::npos, "--device '",
              device, "': expected cpu, cuda or cuda:N with N a GPU index (0, 1, ...)");
    d.index = std::stoi(n);
  } else {
    MOM_CHECK(device == "cpu", "--device '", device, "': expected cpu, cuda or cuda:N");
  }
  MOM_CHECK(precision.empty() || precision == "fp32" || precision == "tf32" || precision == "bf16", "--precision '",
            precision, "': expected fp32, tf32 or bf16");
  MOM_CHECK(d.kind == DeviceKind::cuda || precision.empty() || precision == "fp32", "--precision ", precision,
            " needs --device cuda: the CPU backend computes in fp32");
  d.precision = precision.empty() ? (d.kind == DeviceKind::cpu ? "fp32" : "tf32") : precision;
  return d;
}

// How a backend is opened for a Device: each backend's header (backend_cpu.hpp, backend_cuda.hpp) defines
//   Be open_backend(BackendTag<Be>, const Device&, const train::Communicator*)  the backend, or one error line
//   std::string device_name(BackendTag<Be>, const Be&)                           "cpu", "cuda:0" (recorded in checkpoints)
//   std::string backend_summary(BackendTag<Be>, const Be&)                       "cuda:0 (NVIDIA H100 ...), tf32"
//   double backend_memory_bytes(BackendTag<Be>, const Be&)                        what a run may allocate there
//   std::unique_ptr<train::Communicator> device_communicator(BackendTag<Be>, const Be&, train::Communicator* host)
//                                                       several ranks reducing Be's memory in place (NCCL), or null
// found by argument-dependent lookup through the tag.
template <class Be>
struct BackendTag {};

// One backend's code for an architecture: the command-line tools' work, instantiated for that backend.
struct ArchCode {
  std::function<int(const TrainRequest&)> train;
  std::function<std::string(const SampleRequest&)> sample;
  std::function<int(const EvalRequest&)> evaluate;
  std::function<int(const PruneRequest&)> prune;  // models whose modules can be pruned (ModuleFormer); else empty
};

struct ArchEntry {
  std::string name;
  std::string tokenizer;  // default tokenizer: "byte" (vocab 256) or "gpt2"
  index_t vocab = 0, context = 0;
  std::string describe;   // describe<Model>()
  std::string note;       // one line for --help
  std::string dense_twin; // MoM models: the registered dense model a phase-2 run warm-starts from (--init-from)
  bool kv_decode = false; // mom-sample decodes with the KV-cache Decoder (else: a forward over the window per token)
  bool prunable = false;  // mom-train prune applies (ModuleFormer)
  ArchCode code[device_kinds];  // per DeviceKind; empty where this build has no such backend
  // The code for `device`, or one error line saying why this build has none.
  const ArchCode& on(const Device& device) const {
    const ArchCode& c = code[int(device.kind)];
    MOM_CHECK(bool(c.train), "--device ", device.name(), ": this build of mom-train has no ", device_kind_name(device.kind),
              " backend (configure with the CUDA toolkit installed, or -DMOM_CUDA=ON)");
    return c;
  }
};

// The registry is assembled from families of architectures (examples/arch_<family>.hpp: a function template
// `<family>_architectures(Reg&)` that calls reg.add<Model, DenseTwin, Compact>(...) once per entry). CMake
// compiles each family once per backend, in a translation unit of its own (generated: arch_<family>_<backend>.cpp),
// so the families compile in parallel and a backend's code is instantiated once; each such unit registers its
// entries at start-up with register_family (the family's position in the --help listing, its backend, and a
// function that builds the entries). registry() merges the backends' entries by name.
using FamilyEntries = std::vector<ArchEntry> (*)();
bool register_family(int order, DeviceKind kind, FamilyEntries entries);

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

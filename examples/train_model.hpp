// The training and sampling code behind one registry entry (mom-train's per-architecture work), generic over the
// backend: the generated translation units arch_<family>_<backend>.cpp include one backend's header
// (backend_cpu.hpp or backend_cuda.hpp: how that backend is opened for a Device), this file and a family's
// list of entries, and instantiate Registrar<Backend> over that list, so each family's code compiles once per
// backend, in parallel with the others and cached separately. What is not the architecture's own (the run's
// checks and data, the Trainer, the Checkpointer, evaluation) goes through mom::AnyModel and is compiled once per
// backend instead (train_session.hpp).
#pragma once

#include "architectures.hpp"
#include <mom/models/depth_stats.hpp>
#include <mom/models/module_surgery.hpp>
#include <mom/models/routing_stats.hpp>
#include <mom/models/warm_start.hpp>
#include <mom/train/hf_gpt2.hpp>
#include "evaluate.hpp"
#include "run_records.hpp"
#include "sample.hpp"
#include "train_session.hpp"

#include <omp.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>

#ifndef MOM_SOURCE_DIR
#define MOM_SOURCE_DIR "."
#endif

namespace mom::examples {

struct TrainRequest {
  std::filesystem::path data = "data/kjv.txt";
  std::string tokenizer;  // empty: the architecture's
  double val_fraction = 0.1;
  train::TrainConfig cfg;
  bool resume = false;
  std::filesystem::path init_from;  // phase 2: a checkpoint of the dense twin (run dir, step folder or .safetensors)
  index_t sample_tokens = 200;
  std::string prompt = "And God said";
  double temperature = 0.8;
  Device device;                        // --device, --precision
  // Given on the command line: --seed, --tokenizer, --val-fraction shape a fresh run only (its initialisation,
  // data order, prepared data) and are refused with --resume, which continues the run's own.
  bool seed_given = false, tokenizer_given = false, val_fraction_given = false;
  train::Communicator* comm = nullptr;  // data-parallel ranks (mpirun; train/distributed.hpp); null: one process
  double collective_timeout = 600;      // seconds a collective may wait once the data is ready (0: no limit)
};



inline std::filesystem::path repo_root() {
  namespace fs = std::filesystem;
  if (train::find_gpt2_files(".")) return ".";
  return MOM_SOURCE_DIR;
}

// Token files for training: a text file is tokenized into <out>/data/{train,val}.bin; a folder must hold
// train.bin (and val.bin); a token file is used for training only. A resumed run keeps the data it was
// prepared with: its <out>/data is reused, never tokenized again or overwritten.
struct DataFiles {
  std::filesystem::path train, val;
};
inline DataFiles resolve_data(const TrainRequest& r, const std::string& tokenizer_name) {
  namespace fs = std::filesystem;
  MOM_CHECK(fs::exists(r.data), "data file '", r.data.string(), "' does not exist");
  if (fs::is_directory(r.data)) {
    MOM_CHECK(fs::exists(r.data / "train.bin"), "data folder '", r.data.string(), "' has no train.bin");
    return {r.data / "train.bin", fs::exists(r.data / "val.bin") ? r.data / "val.bin" : fs::path()};
  }
  if (train::is_token_file(r.data)) return {r.data, {}};  // refuses a FIFO, device or socket first
  const fs::path prepared = r.cfg.out_dir / "data";
  if (r.resume && fs::exists(prepared / "train.bin")) {
    std::printf("data: the run's prepared %s (not tokenized again)\n", prepared.string().c_str());
    return {prepared / "train.bin", fs::exists(prepared / "val.bin") ? prepared / "val.bin" : fs::path()};
  }
  auto tok = train::make_tokenizer(tokenizer_name, repo_root());
  std::printf("data: tokenizing %s with the %s tokenizer...\n", r.data.string().c_str(), tok->name().c_str());
  std::fflush(stdout);
  auto prep = train::prepare_text(r.data, r.cfg.out_dir / "data", *tok, r.val_fraction);
  return {prep.train, prep.val};
}

// The model file --init-from names: a .safetensors file itself, or a run directory / step folder.
inline std::filesystem::path init_from_file(const std::filesystem::path& p) {
  namespace fs = std::filesystem;
  MOM_CHECK(fs::exists(p), "--init-from: '", p.string(), "' does not exist");
  if (fs::is_regular_file(p)) return p;
  return train::resolve_checkpoint(p) / "model.safetensors";
}

// Phase 2 (§3.4): checks that --init-from holds the dense twin of the chosen MoM architecture, before any
// work. A mom checkpoint must carry the twin's describe line; a file without mom metadata is read as a
// Hugging Face GPT-2 model.safetensors (its importer checks the shapes).
// The describe line a --init-from file carries ("?" when it has none: a Hugging Face file).
inline std::string init_from_describe(const std::filesystem::path& file) {
  const train::safetensors::File f(file);
  const auto it = f.metadata().find("mom.describe");
  return it != f.metadata().end() ? it->second : std::string("?");
}

// Also fine-tuning: a checkpoint of the architecture itself starts a new run from its parameters (fresh
// optimizer, step 0; with --freeze, only some tensors train). twin_describe: describe<DenseTwin>() of the entry's
// dense twin, empty for an entry without one.
inline void check_init_from(const ArchEntry& arch, const TrainRequest& r, const std::string& twin_describe) {
  if (r.init_from.empty()) return;
  MOM_CHECK(!r.resume, "--init-from starts a new run from a checkpoint; --resume continues a run: pass one");
  const auto file = init_from_file(r.init_from);
  const std::string held = init_from_describe(file);
  if (held == arch.describe) return;  // fine-tuning
  MOM_CHECK(!twin_describe.empty(), "--init-from: '", file.string(), "' holds '", held, "': architecture '", arch.name,
            "' starts only from its own checkpoints (fine-tuning); it is not a Mixture-of-Modules model with a "
            "dense twin to warm-start from");
  MOM_CHECK(held == "?" || held == twin_describe, "--init-from: '", file.string(), "' holds '", held, "' but --arch ",
            arch.name, " warm-starts from its dense twin ", arch.dense_twin, " ('", twin_describe,
            "') or fine-tunes its own");
}

// Phase 2 from the dense twin's parameters (a mom checkpoint of DenseTwin or a Hugging Face GPT-2 file; a
// checkpoint of the architecture itself is TrainSession::init_from_own's).
template <class DenseTwin, class Instance>
void warm_start_from(const ArchEntry& arch, const TrainRequest& r, Instance& model) {
  const auto file = init_from_file(r.init_from);
  if constexpr (!std::is_void_v<DenseTwin>) {
    ModelInstance<DenseTwin, typename Instance::backend_type> dense(1, model.backend());
    std::vector<float> params(std::size_t(DenseTwin::params));
    if (read_checkpoint_params(file, DenseTwin::layout, params)) {  // our layout (describe line already checked)
      dense.backend().from_host(dense.params(), std::span<const float>(params));
    } else if constexpr (train::hf::is_hf_gpt2_compatible<DenseTwin>()) {
      train::hf::import_hf_gpt2(dense, file);
    }
    if constexpr (mom::detail::dense_tensors_covered<typename Instance::model_type, DenseTwin>()) {
      warm_start(model, dense);
      std::printf("phase 2: warm-started from %s (%s; routers freshly initialised)\n", file.string().c_str(),
                  arch.dense_twin.c_str());
    } else {  // a grown model (ModuleFormer's module insertion, §4.3): the trained tensors into the larger ones
      insert_modules(model, dense);
      std::printf("initialised from %s (%s; the inserted modules and router rows start fresh)\n",
                  file.string().c_str(), arch.dense_twin.c_str());
    }
    std::fflush(stdout);
  }
}

// What --data names, recorded in the checkpoint's mom.config ("data") so that --resume can tell other data.
inline std::string data_identity(const std::filesystem::path& data) {
  std::error_code ec;
  const auto abs = std::filesystem::weakly_canonical(data, ec);
  return (ec ? std::filesystem::absolute(data) : abs).lexically_normal().string();
}

// --resume with other data would silently train a different run (and tokenizing it would overwrite the
// run's prepared <out>/data): refused, unless --data is the run's data or its prepared folder.
inline void check_resume_data(const train::safetensors::File& f, const train::TrainConfig& cfg) {
  const auto it = f.metadata().find("mom.config");
  if (it == f.metadata().end()) return;
  const auto config = nlohmann::json::parse(it->second, nullptr, false);
  if (!config.is_object() || !config.contains("data") || !config["data"].is_string()) return;  // older checkpoints
  const std::string recorded = config["data"].get<std::string>();
  if (recorded.empty() || recorded == cfg.data_name || cfg.data_name == data_identity(cfg.out_dir / "data")) return;
  MOM_CHECK(false, "--resume: --data '", cfg.data_name, "' is not the data this run trained on ('", recorded,
            "'); pass that --data, or its prepared folder ", (cfg.out_dir / "data").string());
}

// The memory a training run allocates up front (the workspace the cost model plans for batch x seq, plus
// parameters, gradients and both AdamW moments), refused with the numbers when it exceeds this machine's.
inline void check_memory(const ModelCard& card, const train::TrainConfig& cfg, double available,
                         const std::string& where) {
  const double gib = 1024.0 * 1024.0 * 1024.0;
  const double activations = card.activation_bytes(cfg.batch, cfg.seq);
  const double state = 4.0 * double(card.params) * sizeof(float);
  MOM_CHECK(available <= 0 || activations + state <= available, "--batch ", cfg.batch, " x --seq ", cfg.seq,
            " needs about ", activations / gib, " GiB of activations plus ", state / gib,
            " GiB of parameters, gradients and AdamW moments, more than ", where, "'s ", available / gib, " GiB");
}

// A copy of `model`'s parameters in the type that samples it (Mixture-of-Depths with a causal method: routed by
// its causal decision; causal_sampling_model_t), on the same backend.
template <class Sampling, class Instance>
ModelInstance<Sampling, typename Instance::backend_type> sampling_copy(Instance& model) {
  static_assert(Sampling::params == Instance::model_type::params);
  ModelInstance<Sampling, typename Instance::backend_type> s(1, model.backend());
  model.backend().copy(s.params(), std::span<const typename Instance::scalar>(model.params()));
  return s;
}

// The architecture's part of a `mom-train` run: its model, warm start, routing and depth statistics, the causal
// evaluation of Mixture-of-Depths and the end-of-training sample; the rest (checks, data, the Trainer) is
// TrainSession's, compiled once per backend (train_session.hpp).
template <class Model, class DenseTwin, class Be>
int train_model(const ArchEntry& arch, const TrainRequest& r) {
  using Instance = ModelInstance<Model, Be>;
  std::string twin_describe;
  if constexpr (!std::is_void_v<DenseTwin>) twin_describe = describe<DenseTwin>();
  TrainSession<Be> session(arch, r, model_card<Model>(), twin_describe);
  const train::TrainConfig& cfg = session.config();
  const bool rank0 = session.rank0();
  Instance model(cfg.seed, session.take_backend());
  ErasedModel any(model);
  if (!r.init_from.empty() && !session.init_from_own(any)) warm_start_from<DenseTwin>(arch, r, model);
  EvalHooks hooks;
  // Routed models: routing statistics of each validation (issue 5, paper Fig. 6), next to metrics.jsonl.
  RoutingStats routing;
  constexpr bool routed = []<class... Es>(TypeList<Es...>) { return (ReportsRouting<Es> || ...); }(
      typename Model::core::executors{});
  if constexpr (routed) {
    hooks.on_eval_forward = [&routing, &model] { routing.accumulate(model); };
    hooks.on_eval_done = [&routing, dir = cfg.out_dir, comm = r.comm, rank0](index_t step) {
      write_routing_stats(routing, dir, comm, rank0, step);
    };
  }
  // Depth-routed models (issue 6): fraction of tokens run per routed layer and, for Mixture-of-Depths, the
  // accuracy of the causal routing decision (MoD §3.5) at each validation, in <out>/depth.jsonl.
  DepthStats depth;
  if constexpr (has_depth_routing<Model>) {
    hooks.on_eval_forward = [&depth, &model, prev = hooks.on_eval_forward] {
      if (prev) prev();
      depth.accumulate(model);
    };
    hooks.on_eval_done = [&depth, prev = hooks.on_eval_done, dir = cfg.out_dir, comm = r.comm, rank0](index_t step) {
      if (prev) prev(step);
      write_depth_stats(depth, dir, comm, rank0, step);
    };
  }
  const train::TrainResult result = session.train(any, std::move(hooks));
  if (!rank0) return 0;  // rank 0 alone evaluates the causal routing and samples
  // Mixture-of-Depths with a causal-sampling method: the same validation windows routed by the causal decision,
  // as autoregressive sampling routes (MoD §3.5, Fig. 6), beside the top-C figure; in <out>/depth.jsonl.
  using CausalModel = causal_sampling_model_t<Model>;
  const train::TokenFile* val_data = session.validation();
  if constexpr (!std::is_same_v<CausalModel, Model>) {
    if (result.final_val_loss && val_data && !result.interrupted) {
      auto causal = sampling_copy<CausalModel>(model);
      causal.reserve(cfg.batch, cfg.seq);
      std::vector<token_t> in(std::size_t(cfg.batch * cfg.seq)), tg(in.size());
      double sum = 0;
      for (index_t i = 0; i < cfg.eval_batches; ++i) {
        train::eval_batch(*val_data, cfg.batch, cfg.seq, i, in, tg);
        causal.forward_async(in, tg, cfg.batch, cfg.seq);
        sum += double(causal.cross_entropy());
      }
      write_causal_eval(cfg.out_dir, result.last_step, sum / double(cfg.eval_batches), *result.final_val_loss);
    }
  }
  if (r.sample_tokens > 0 && !result.interrupted) {
    train::Tokenizer& tok = *session.sample_tokenizer();
    std::vector<token_t> tokens = tok.encode(r.prompt);
    if (tokens.empty()) tokens.push_back(0);
    std::printf("sample (temperature %.2f):\n%s", r.temperature, r.prompt.c_str());
    std::fflush(stdout);
    const auto print = [&](token_t t) {
      const std::string s = tok.decode(std::span<const token_t>(&t, 1));
      std::fwrite(s.data(), 1, s.size(), stdout);
      std::fflush(stdout);
    };
    if constexpr (!std::is_same_v<CausalModel, Model>) {  // routed by the causal decision, as mom-sample does
      auto causal = sampling_copy<CausalModel>(model);
      generate(causal, tokens, r.sample_tokens, {.temperature = r.temperature}, cfg.seed, print);
    } else {
      generate(model, tokens, r.sample_tokens, {.temperature = r.temperature}, cfg.seed, print);
    }
    std::printf("\n");
  }
  return 0;
}

template <class Model, class Be>
std::string sample_model(const SampleRequest& r) {
  ModelInstance<Model, Be> model(1, open_backend(BackendTag<Be>{}, r.device, nullptr));
  ErasedModel any(model);
  const auto meta = load_params<Be>(r.checkpoint, any);
  const auto tok = checkpoint_tokenizer_for(meta, Model::dims.vocab, r.checkpoint, r.repo_root);
  std::vector<token_t> tokens = tok->encode(r.prompt);
  MOM_CHECK(!tokens.empty(), "--prompt must not be empty");
  const std::size_t prompt_len = tokens.size();
  const infer::SamplingOptions sampling{.temperature = r.temperature, .top_k = r.top_k, .top_p = r.top_p};
  // A Mixture-of-Depths model trained with a causal-sampling method routes by its causal decision here (the
  // top-C of a sequence depends on its future tokens, MoD §3.5): the same parameters in that type.
  using Sampling = causal_sampling_model_t<Model>;
  if constexpr (!std::is_same_v<Sampling, Model>) {
    auto causal = sampling_copy<Sampling>(model);
    generate(causal, tokens, r.tokens, sampling, r.seed);
  } else {
    generate(model, tokens, r.tokens, sampling, r.seed);
  }
  return tok->decode(std::span<const token_t>(tokens).subspan(0, prompt_len)) +
         tok->decode(std::span<const token_t>(tokens).subspan(prompt_len));
}

// The registry fields every entry has, from the model type.
template <class Model>
ArchEntry describe_architecture(std::string name, std::string tokenizer, std::string note, std::string dense_twin) {
  ArchEntry a;
  a.name = std::move(name);
  a.tokenizer = std::move(tokenizer);
  a.vocab = Model::dims.vocab;
  a.context = Model::dims.context;
  a.describe = describe<Model>();
  a.note = std::move(note);
  a.dense_twin = std::move(dense_twin);
  a.kv_decode = infer::decodes<causal_sampling_model_t<Model>, cpu::Backend<float>>;
  return a;
}

template <class Be>
constexpr DeviceKind device_kind_of = Be::host_memory ? DeviceKind::cpu : DeviceKind::cuda;

// What a family's list calls (examples/arch_<family>.hpp): one entry, with Be's code for it.
//   add<Model>(name, tokenizer, note)                          a model trained from scratch
//   add<Model, DenseTwin>(..., dense_twin)                     --init-from warm-starts it from its registered twin
//   add<Model, DenseTwin, Compact>(..., dense_twin, compact)   `mom-train prune --into compact` applies
template <class Be>
struct Registrar {
  std::vector<ArchEntry> entries;

  template <class Model, class DenseTwin = void, class Compact = void>
  void add(std::string name, std::string tokenizer, std::string note, std::string dense_twin = {},
           std::string compact = {}) {
    ArchEntry a = describe_architecture<Model>(std::move(name), std::move(tokenizer), std::move(note), std::move(dense_twin));
    ArchCode& c = a.code[int(device_kind_of<Be>)];
    c.train = [a_name = a.name](const TrainRequest& r) {
      return train_model<Model, DenseTwin, Be>(*find_architecture(a_name), r);
    };
    c.sample = [](const SampleRequest& r) { return sample_model<Model, Be>(r); };
    c.evaluate = [](const EvalRequest& r) { return evaluate_model<Model, Be>(r); };
    if constexpr (!std::is_void_v<Compact>) {
      a.prunable = true;
      c.prune = [compact](const PruneRequest& r) { return prune_model<Model, Compact, Be>(r, compact); };
    }
    entries.push_back(std::move(a));
  }
};

// The body of a generated arch_<family>_<backend>.cpp: registers the family's entries with Be's code.
#define MOM_TRAIN_FAMILY(family, order, Be)                                                                \
  namespace mom::examples {                                                                                \
  namespace {                                                                                              \
  [[maybe_unused]] const bool family##_registered = register_family(order, device_kind_of<Be>, [] {                         \
    Registrar<Be> reg;                                                                                     \
    family##_architectures(reg);                                                                           \
    return std::move(reg.entries);                                                                         \
  });                                                                                                      \
  }                                                                                                        \
  }

}  // namespace mom::examples

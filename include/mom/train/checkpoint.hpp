// Checkpoints: a run directory holds one folder per saved step and a pointer to the newest complete one.
//
//   <run>/latest                          text: "step-000500" (replaced atomically, last)
//   <run>/step-000500/model.safetensors   parameters, one tensor per Model::layout entry ("wte", "h.0.attn.w_qkv",
//                                         ...; 1-D tensors have shape [cols]); metadata: format "pt",
//                                         mom.describe (the architecture), mom.arch, mom.step, mom.tokenizer,
//                                         mom.checkpoint_id, mom.config (JSON)
//   <run>/step-000500/optimizer.safetensors  "adam.m", "adam.v" (flat, layout order); metadata: mom.step (AdamW
//                                         steps done), mom.sampler_state (training-data RNG), mom.checkpoint_id
//                                         (equal to the model file's), mom.describe
//
// model.safetensors loads directly with safetensors.torch.load_file / numpy (docs/read_checkpoint.py).
// A save writes a fresh step folder (each file atomically: temp + fsync + rename) and only then replaces
// `latest`, so a crash or error at any point leaves the previous checkpoint intact and `latest` pointing to
// it. The folder before the newest is kept too; older ones are pruned after a successful save.
#pragma once

#include <mom/models/describe.hpp>
#include <mom/train/data.hpp>
#include <mom/train/file_io.hpp>
#include <mom/train/safetensors.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace mom::train {

struct TrainState {
  std::int64_t step = 0;      // optimizer steps completed
  std::string sampler_state;  // training BatchSampler RNG state
};

inline std::string step_folder_name(std::int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%06lld", static_cast<long long>(step));
  return buf;
}

// The checkpoint folder a path names: a run dir with `latest`, or a step folder itself.
inline std::filesystem::path resolve_checkpoint(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  MOM_CHECK(fs::exists(path), "checkpoint '", path.string(), "' does not exist");
  if (fs::exists(path / "latest")) {
    std::ifstream in(path / "latest");
    std::string name;
    std::getline(in, name);
    MOM_CHECK(!name.empty() && name.find('/') == std::string::npos, "checkpoint '", path.string(),
              "': the 'latest' file is corrupted");
    MOM_CHECK(fs::exists(path / name / "model.safetensors"), "checkpoint '", path.string(), "': 'latest' names ",
              name, " which has no model.safetensors");
    return path / name;
  }
  MOM_CHECK(fs::exists(path / "model.safetensors"), "no checkpoint in '", path.string(),
            "' (neither a 'latest' file nor model.safetensors)");
  return path;
}

// True when `run_dir` already holds a checkpoint (so a fresh run must not write there).
inline bool has_checkpoint(const std::filesystem::path& run_dir) {
  return std::filesystem::exists(run_dir / "latest") || std::filesystem::exists(run_dir / "model.safetensors");
}

template <class Instance>
class Checkpointer {
 public:
  using Model = typename Instance::model_type;
  using T = typename Instance::scalar;

  // Saves parameters, AdamW moments and the training state into <run_dir>/step-NNNNNN and points `latest` at it.
  static std::filesystem::path save(const std::filesystem::path& run_dir, Instance& model, std::span<const T> adam_m,
                                    std::span<const T> adam_v, const TrainState& state,
                                    const std::map<std::string, std::string>& extra_metadata = {}) {
    namespace fs = std::filesystem;
    ensure_writable_dir(run_dir);
    // Never write into an existing folder (it may be the checkpoint `latest` names): pick a fresh name.
    std::string name = step_folder_name(state.step);
    for (int k = 1; fs::exists(run_dir / name); ++k) name = step_folder_name(state.step) + "." + std::to_string(k);
    const fs::path dir = run_dir / name;
    fs::create_directories(dir);
    try {
      write_step_folder(dir, model, adam_m, adam_v, state, extra_metadata);
    } catch (...) {
      std::error_code ec;
      fs::remove_all(dir, ec);  // a half-written folder is never named by `latest`; drop it
      throw;
    }
    // Only now does the new checkpoint become the one `latest` names.
    const std::string previous = read_latest(run_dir);
    write_file_atomically(run_dir / "latest", name + "\n");
    // Keep the new folder and the one before it; prune older step folders.
    for (const auto& entry : fs::directory_iterator(run_dir)) {
      const std::string fname = entry.path().filename().string();
      if (entry.is_directory() && fname.rfind("step-", 0) == 0 && fname != name && fname != previous) {
        std::error_code ec;
        fs::remove_all(entry.path(), ec);
      }
    }
    return dir;
  }

  // Loads a checkpoint (run dir or step folder) into model, adam_m, adam_v and state. Everything is read and
  // validated before anything is written, so a refused checkpoint leaves the model untouched.
  static std::map<std::string, std::string> load(const std::filesystem::path& path, Instance& model,
                                                 std::span<T> adam_m, std::span<T> adam_v, TrainState& state) {
    const std::filesystem::path dir = resolve_checkpoint(path);
    std::vector<T> params(Model::params);
    auto meta = read_params(dir, params);
    safetensors::File opt(dir / "optimizer.safetensors");
    const std::string where = "checkpoint '" + dir.string() + "'";
    MOM_CHECK(opt.meta("mom.checkpoint_id") == meta.at("mom.checkpoint_id"), where,
              ": model.safetensors and optimizer.safetensors come from different saves");
    std::vector<T> m(adam_m.size()), v(adam_v.size());
    opt.read<T>("adam.m", m);
    opt.read<T>("adam.v", v);
    TrainState s;
    try {
      s.step = std::stoll(opt.meta("mom.step"));
    } catch (const std::logic_error&) {
      throw Error(where + ": optimizer metadata mom.step is not a number");
    }
    MOM_CHECK(s.step >= 0, where, ": negative step ", s.step);
    s.sampler_state = opt.meta("mom.sampler_state");
    std::mt19937_64 probe;
    set_rng_state(probe, s.sampler_state);  // validates before committing
    model.backend().from_host(model.params(), std::span<const T>(params));
    model.backend().from_host(adam_m, std::span<const T>(m));
    model.backend().from_host(adam_v, std::span<const T>(v));
    state = s;
    return meta;
  }

  // Loads only the parameters (for sampling). Returns the model file's metadata.
  static std::map<std::string, std::string> load_params(const std::filesystem::path& path, Instance& model) {
    std::vector<T> params(Model::params);
    auto meta = read_params(resolve_checkpoint(path), params);
    model.backend().from_host(model.params(), std::span<const T>(params));
    return meta;
  }

 private:
  static std::map<std::string, std::string> read_params(const std::filesystem::path& dir, std::vector<T>& params) {
    safetensors::File f(dir / "model.safetensors");
    const std::string where = "checkpoint '" + dir.string() + "'";
    const std::string ours = describe<Model>();
    const auto it = f.metadata().find("mom.describe");
    MOM_CHECK(it != f.metadata().end(), where, " has no mom.describe metadata (not saved by mom)");
    MOM_CHECK(it->second == ours, where, " is a different architecture: it holds '", it->second,
              "' but this model is '", ours, "'");
    for (const auto& p : Model::layout) {
      const safetensors::TensorInfo* t = f.find(p.name);
      MOM_CHECK(t != nullptr, where, " lacks tensor '", p.name, "'");
      const std::vector<std::int64_t> want = p.rows == 1 ? std::vector<std::int64_t>{p.cols}
                                                         : std::vector<std::int64_t>{p.rows, p.cols};
      MOM_CHECK(t->shape == want, where, ": tensor '", p.name, "' has the wrong shape");
      f.read<T>(p.name, std::span<T>(params).subspan(p.offset, p.size()));
    }
    MOM_CHECK(f.tensors().size() == Model::layout.size(), where, " holds ", f.tensors().size(),
              " tensors, this model has ", Model::layout.size());
    return f.metadata();
  }

  static void write_step_folder(const std::filesystem::path& dir, Instance& model, std::span<const T> adam_m,
                                std::span<const T> adam_v, const TrainState& state,
                                const std::map<std::string, std::string>& extra_metadata) {
    std::vector<T> params(Model::params), m(adam_m.size()), v(adam_v.size());
    model.backend().to_host(std::span<T>(params), std::span<const T>(model.params()));
    model.backend().to_host(std::span<T>(m), adam_m);
    model.backend().to_host(std::span<T>(v), adam_v);

    std::random_device rd;
    const std::string id = std::to_string((std::uint64_t(rd()) << 32) | rd());
    const std::string describe_line = describe<Model>();

    safetensors::Writer opt;
    opt.add<T>("adam.m", m, {static_cast<std::int64_t>(m.size())});
    opt.add<T>("adam.v", v, {static_cast<std::int64_t>(v.size())});
    opt.metadata("mom.step", std::to_string(state.step));
    opt.metadata("mom.sampler_state", state.sampler_state);
    opt.metadata("mom.checkpoint_id", id);
    opt.metadata("mom.describe", describe_line);
    opt.write(dir / "optimizer.safetensors");

    safetensors::Writer w;
    for (const auto& p : Model::layout) {
      std::vector<std::int64_t> shape = p.rows == 1 ? std::vector<std::int64_t>{p.cols}
                                                    : std::vector<std::int64_t>{p.rows, p.cols};
      w.add<T>(std::string(p.name), std::span<const T>(params).subspan(p.offset, p.size()), std::move(shape));
    }
    for (const auto& [k, val] : extra_metadata) w.metadata(k, val);
    w.metadata("format", "pt");
    w.metadata("mom.describe", describe_line);
    w.metadata("mom.step", std::to_string(state.step));
    w.metadata("mom.checkpoint_id", id);
    w.write(dir / "model.safetensors");

  }

  static std::string read_latest(const std::filesystem::path& run_dir) {
    std::ifstream in(run_dir / "latest");
    std::string name;
    std::getline(in, name);
    return name;
  }
};

}  // namespace mom::train

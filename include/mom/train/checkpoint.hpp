// Checkpoints: a run directory holds one folder per saved step and a pointer to the newest complete one.
//
//   <run>/latest                          text: "step-000500" (replaced atomically, last)
//   <run>/step-000500/model.safetensors   parameters, one tensor per Model::layout entry ("wte", "h.0.attn.w_qkv",
//                                         ...; 1-D tensors have shape [cols]); metadata: format "pt",
//                                         mom.describe (the architecture), mom.arch, mom.step, mom.tokenizer,
//                                         mom.checkpoint_id, mom.config (JSON)
//   <run>/step-000500/optimizer.safetensors  "adam.m", "adam.v" (flat, layout order, shape [Model::params]);
//                                         metadata: mom.step (AdamW steps done), mom.sampler_state
//                                         (training-data RNG), mom.freeze (the freeze patterns in effect, a
//                                         JSON array of strings), mom.ranks (the data-parallel ranks that
//                                         trained it; absent in older files: 1), mom.flops ("done,warm-up":
//                                         the training FLOPs so far and the warm-up's; absent: 0),
//                                         mom.checkpoint_id (equal
//                                         to the model file's), mom.describe, mom.model_checksum (the model
//                                         file's mom.header_checksum: which model file it belongs with)
// Both files also carry safetensors.hpp's checksums (mom.checksum.<tensor>, mom.header_checksum).
//
// model.safetensors loads directly with safetensors.torch.load_file / numpy (docs/read_checkpoint.py).
//
// Saving: values are checked finite first (a NaN/Inf is refused, naming the tensor, and nothing is written);
// the step folder is written fresh (each file atomically: temp + fsync + rename; optimizer first, model
// last) and only then is `latest` replaced, so a crash or error at any point leaves the previous checkpoint
// intact and `latest` pointing to it. A step folder that exists but is not the one `latest` names (left by a
// crash, or a future abandoned by a resume from an older step) is replaced; saving the step `latest` names
// again writes step-N.1 (or step-N when latest names step-N.1) and drops the old one once `latest` moved, so
// one folder per step remains. After the save the new folder and the newest complete folder of an earlier
// step are kept; every other step folder is removed.
//
// Loading checks, before writing a single value: both files' structure and checksums (safetensors.hpp),
// the architecture (mom.describe of both files), every tensor's name, shape and dtype (adam.m / adam.v
// exactly [Model::params]), that both files come from one save (mom.checkpoint_id) at one step (mom.step,
// a whole decimal number) and that the model file is the one the optimizer file records (mom.model_checksum),
// the sampler state, the freeze patterns (each must match a tensor), and that every parameter and moment is
// finite (adam.v >= 0).
//
// Older checkpoints stay loadable: one without mom.freeze was written before that key and means nothing
// frozen (or, when its mom.config records a "freeze" list, as checkpoints of the first --freeze version do,
// that list).
#pragma once

#include <mom/models/any_model.hpp>
#include <mom/train/data.hpp>
#include <mom/train/file_io.hpp>
#include <mom/train/safetensors.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace mom::train {

struct TrainState {
  std::int64_t step = 0;      // optimizer steps completed
  std::string sampler_state;  // training BatchSampler RNG state
  std::vector<std::string> freeze;  // the freeze patterns in effect (TrainConfig::freeze); empty: nothing frozen
  std::int64_t ranks = 1;     // data-parallel ranks (train/distributed.hpp): the sampler state means a data
                              // order only together with the rank count
  double flops = 0;           // training FLOPs of the steps so far, and of the warm-up's (TrainConfig::flops_budget)
  double flops_at_warmup = 0;
};

// Per-tensor freezing (TrainConfig::freeze, mom-train --freeze): glob patterns over the layout's tensor names
// select tensors that get no optimizer update. Here because the patterns are part of the training state a
// checkpoint holds (and load checks them); the Trainer applies them (train/trainer.hpp).

// Whole-name glob match: `*` any run of characters (dots included, so "h.*.w1" matches "h.3.moe.w1" too),
// `?` any one character; every other character stands for itself (no escapes, no [classes]).
inline bool glob_match(std::string_view pattern, std::string_view name) {
  std::size_t p = 0, n = 0, star = std::string_view::npos, mark = 0;
  while (n < name.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == name[n])) {
      ++p, ++n;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++, mark = n;
    } else if (star != std::string_view::npos) {
      p = star + 1, n = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

// The patterns of a comma-separated list ("a,b" -> {"a", "b"}; empty items dropped, so "" -> {}).
inline std::vector<std::string> split_patterns(std::string_view list) {
  std::vector<std::string> out;
  while (!list.empty()) {
    const std::size_t comma = list.find(',');
    if (comma != 0) out.emplace_back(list.substr(0, comma));
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  return out;
}

// frozen[i]: tensor i of `layout` does not train: a pattern matches its name, or it is a buffer
// (ParamInfo::trainable = false, frozen with or without patterns). A pattern that matches no tensor is an
// error (one line naming the pattern, with example names).
inline std::vector<bool> freeze_mask(std::span<const ParamInfo> layout, const std::vector<std::string>& patterns) {
  std::vector<bool> frozen(layout.size(), false);
  for (std::size_t i = 0; i < layout.size(); ++i) frozen[i] = !layout[i].trainable;
  for (const auto& pat : patterns) {
    bool any = false;
    for (std::size_t i = 0; i < layout.size(); ++i)
      if (glob_match(pat, layout[i].name)) frozen[i] = any = true;
    if (any) continue;
    std::string examples;
    for (const std::size_t i : {std::size_t(0), layout.size() / 2, layout.size() - 1})
      if (i < layout.size() && examples.find("'" + std::string(layout[i].name) + "'") == std::string::npos)
        examples += (examples.empty() ? "'" : ", '") + std::string(layout[i].name) + "'";
    MOM_CHECK(false, "freeze: the pattern '", pat, "' matches no tensor of the model (tensor names look like ",
              examples, "; `*` matches any characters, dots included, `?` one)");
  }
  return frozen;
}
template <class Model>
std::vector<bool> freeze_mask(const std::vector<std::string>& patterns) {
  return freeze_mask(std::span<const ParamInfo>(Model::layout), patterns);
}

inline std::string step_folder_name(std::int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%06lld", static_cast<long long>(step));
  return buf;
}

// A whole decimal integer: optional '-', digits, nothing else (no spaces, '+', fractions or suffixes).
inline std::optional<std::int64_t> parse_int64(std::string_view s) {
  std::int64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

// The step of a step folder name ("step-000500", or "step-000500.1" for a re-save of that step); nullopt
// for any other name.
inline std::optional<std::int64_t> step_folder_step(std::string_view name) {
  if (!name.starts_with("step-")) return std::nullopt;
  name.remove_prefix(5);
  const auto dot = name.find('.');
  if (dot != std::string_view::npos) {
    const auto copy = name.substr(dot + 1);
    if (copy.empty() || copy.find_first_not_of("0123456789") != std::string_view::npos) return std::nullopt;
    name = name.substr(0, dot);
  }
  if (name.empty() || name.find_first_not_of("0123456789") != std::string_view::npos) return std::nullopt;
  return parse_int64(name);
}

// The folder name `latest` holds; "" when there is no readable `latest` file.
inline std::string read_latest(const std::filesystem::path& run_dir) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(run_dir / "latest", ec)) return {};
  std::ifstream in(run_dir / "latest");
  std::string name;
  std::getline(in, name);
  return name;
}

// A step folder holds both files (a save writes optimizer.safetensors first, model.safetensors last).
inline bool step_folder_complete(const std::filesystem::path& dir) {
  std::error_code ec;
  return std::filesystem::is_regular_file(dir / "model.safetensors", ec) &&
         std::filesystem::is_regular_file(dir / "optimizer.safetensors", ec);
}

// Removes what an interrupted run (killed, or out of disk) left in `run_dir`: temporary files of processes
// that are gone (remove_stale_temp_files), and incomplete step folders other than the one `latest` names
// (a folder holding a temporary file of a live process is being written: it stays). Complete folders stay
// (the next save prunes them). Safe to call at every start; Checkpointer::save calls it. Returns the number
// of entries removed. Never throws.
inline int clean_run_dir(const std::filesystem::path& run_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(run_dir, ec)) return 0;
  int removed = remove_stale_temp_files(run_dir);
  const std::string latest = read_latest(run_dir);
  std::vector<fs::path> doomed;
  for (fs::directory_iterator it(run_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code dc;
    if (!step_folder_step(name) || name == latest || !it->is_directory(dc) || step_folder_complete(it->path()))
      continue;
    bool in_use = false;
    for (fs::directory_iterator f(it->path(), dc), fend; !dc && f != fend; f.increment(dc)) {
      const auto pid = temp_file_pid(f->path().filename().native());
      in_use = in_use || (pid && *pid != ::getpid() && process_alive(*pid));
    }
    if (!in_use) doomed.push_back(it->path());
  }
  for (const auto& d : doomed) {
    std::error_code rc;
    if (fs::remove_all(d, rc) > 0 && !rc) ++removed;
  }
  return removed;
}

// The checkpoint folder a path names: a run dir with `latest`, or a step folder itself.
inline std::filesystem::path resolve_checkpoint(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  MOM_CHECK(fs::exists(path), "checkpoint '", path.string(), "' does not exist");
  if (fs::exists(path / "latest")) {
    const std::string name = read_latest(path);
    MOM_CHECK(!name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos, "checkpoint '",
              path.string(), "': the 'latest' file is corrupted");
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

// The index of the first NaN / Inf in `values` (an exponent test on the bits: it holds under -ffast-math too).
template <class T>
std::optional<std::size_t> first_non_finite(std::span<const T> values) {
  static_assert(std::is_floating_point_v<T>);
  using Bits = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  constexpr Bits exponent = sizeof(T) == 4 ? Bits(0x7F800000u) : Bits(0x7FF0000000000000ull);
  constexpr std::size_t chunk = 4096;
  for (std::size_t at = 0; at < values.size(); at += chunk) {
    const std::size_t n = std::min(chunk, values.size() - at);
    bool bad = false;  // branch-free over a chunk (vectorises), then located
    for (std::size_t i = 0; i < n; ++i) bad |= (std::bit_cast<Bits>(values[at + i]) & exponent) == exponent;
    if (bad)
      for (std::size_t i = 0; i < n; ++i)
        if ((std::bit_cast<Bits>(values[at + i]) & exponent) == exponent) return at + i;
  }
  return std::nullopt;
}

// ---- what a checkpoint records of its data and tokenizer ------------------------------------------------------
//
// Model metadata mom.data (written by the Trainer): {"train": R, "val": R or null} with R = {"checksum":
// "xxh64:<hex>" of the whole token file, "tokens", "vocab", "tokenizer"}. A resume compares it with the files
// it opens (check_data_record), and whoever reads the tokenizer name from a model file cross-checks it against
// the record and the model (checkpoint_tokenizer). Checkpoints written before the key carry no record and
// are read as before.

inline nlohmann::json data_record(const TokenFile& f) {
  return {{"checksum", f.checksum()}, {"tokens", f.size()}, {"vocab", f.vocab()}, {"tokenizer", f.tokenizer()}};
}
inline nlohmann::json data_record(const TokenFile& train, const TokenFile* val) {
  return {{"train", data_record(train)}, {"val", val ? data_record(*val) : nlohmann::json(nullptr)}};
}

namespace detail {
// The record of one split ("train" / "val") in mom.data; null when the run had none; refused when malformed.
inline nlohmann::json split_record(const nlohmann::json& rec, const char* split, const std::string& where) {
  const bool ok = rec.is_object() && rec.contains(split) &&
                  (rec[split].is_null() || (rec[split].is_object() && rec[split].contains("checksum") &&
                                            rec[split]["checksum"].is_string() && rec[split].contains("tokenizer") &&
                                            rec[split]["tokenizer"].is_string() && rec[split].contains("vocab") &&
                                            rec[split]["vocab"].is_number_integer()));
  MOM_CHECK(ok, where, ": model metadata mom.data is malformed (no valid \"", split, "\" record)");
  return rec[split];
}
inline nlohmann::json parse_data_record(const std::map<std::string, std::string>& meta, const std::string& where) {
  const auto it = meta.find("mom.data");
  if (it == meta.end()) return nullptr;
  auto rec = nlohmann::json::parse(it->second, nullptr, false);
  split_record(rec, "train", where);
  split_record(rec, "val", where);
  return rec;
}
}  // namespace detail

// Refuses data other than what the checkpoint trained and validated on: the training file's checksum must be
// the recorded one (the two files swapped is named as such), and so must the validation file's, when the
// run had one.
inline void check_data_record(const std::map<std::string, std::string>& meta, const TokenFile& train,
                              const TokenFile* val, const std::string& where) {
  const nlohmann::json rec = detail::parse_data_record(meta, where);
  if (rec.is_null()) return;
  const nlohmann::json& t = rec["train"];
  const nlohmann::json& v = rec["val"];
  const auto same = [](const nlohmann::json& r, const TokenFile* f) {
    return f && !r.is_null() && r["checksum"].get<std::string>() == f->checksum();
  };
  MOM_CHECK(!(same(t, val) && same(v, &train)), where, ": the training and validation files are swapped ('",
            train.path().string(), "' is the split this run validated on)");
  MOM_CHECK(same(t, &train), where, ": the training data '", train.path().string(),
            "' is not the file this run trained on (", train.checksum(), ", ", train.size(), " tokens; recorded ",
            t["checksum"].get<std::string>(), ", ", t.value("tokens", std::int64_t(0)), " tokens)");
  MOM_CHECK(v.is_null() || val, where, ": this run validated on a file of ", v.value("tokens", std::int64_t(0)),
            " tokens and none is given now");
  MOM_CHECK(v.is_null() || same(v, val), where, ": the validation data '", val ? val->path().string() : "",
            "' is not the file this run validated on (", val ? val->checksum() : "", "; recorded ",
            v.is_null() ? "" : v["checksum"].get<std::string>(), ")");
}

// The tokenizer a model file names (mom.tokenizer; "byte" for files without it), cross-checked against the
// data record (mom.data: the same name and vocabulary) and the model (a known tokenizer's vocabulary must fit
// model_vocab): a checkpoint whose metadata disagrees would decode token ids into the wrong text.
inline std::string checkpoint_tokenizer(const std::map<std::string, std::string>& meta, index_t model_vocab,
                                        const std::string& where) {
  const auto it = meta.find("mom.tokenizer");
  const std::string name = it != meta.end() ? it->second : std::string("byte");
  const nlohmann::json rec = detail::parse_data_record(meta, where);
  if (!rec.is_null()) {
    const nlohmann::json& t = rec["train"];
    MOM_CHECK(t["tokenizer"].get<std::string>() == name, where, ": metadata mom.tokenizer is '", name,
              "' but the data it trained on was tokenized by '", t["tokenizer"].get<std::string>(), "'");
    if (const auto known = known_tokenizer_vocab(name))
      MOM_CHECK(t["vocab"].get<std::int64_t>() == *known, where, ": the data it trained on has a vocabulary of ",
                t["vocab"].get<std::int64_t>(), ", not the ", name, " tokenizer's ", *known);
  }
  if (const auto known = known_tokenizer_vocab(name))
    MOM_CHECK(*known <= model_vocab, where, ": metadata mom.tokenizer '", name, "' has ", *known,
              " tokens, more than the model's vocabulary of ", model_vocab);
  return name;
}

template <class Instance>
class Checkpointer {
  static_assert(TrainableModel<Instance>, "mom::train::Checkpointer<Instance>: Instance must be a ModelInstance or an "
                "AnyModel (the members listed by mom::TrainableModel, models/any_model.hpp)");

 public:
  using T = typename Instance::scalar;

  // Saves parameters, AdamW moments and the training state into <run_dir>/step-NNNNNN and points `latest` at it.
  // Refuses (nothing written, the previous checkpoint untouched) when a value is NaN or Inf.
  static std::filesystem::path save(const std::filesystem::path& run_dir, Instance& model, std::span<const T> adam_m,
                                    std::span<const T> adam_v, const TrainState& state,
                                    const std::map<std::string, std::string>& extra_metadata = {}) {
    namespace fs = std::filesystem;
    const ModelCard& card = model_card(model);
    MOM_CHECK(adam_m.size() == std::size_t(card.params) && adam_v.size() == std::size_t(card.params),
              "Checkpointer::save: AdamW moments of ", adam_m.size(), " and ", adam_v.size(), " values, expected ",
              card.params);
    MOM_CHECK(state.step >= 0, "Checkpointer::save: negative step ", state.step);
    std::vector<T> params(std::size_t(card.params)), m(adam_m.size()), v(adam_v.size());
    model.backend().to_host(std::span<T>(params), std::span<const T>(model.params()));
    model.backend().to_host(std::span<T>(m), adam_m);
    model.backend().to_host(std::span<T>(v), adam_v);
    const std::string refuse = "Checkpointer::save: not saving step " + std::to_string(state.step) + " to '" +
                               run_dir.string() + "' (the previous checkpoint stays): ";
    check_finite(card, refuse, params, m, v);

    ensure_writable_dir(run_dir);
    clean_run_dir(run_dir);
    const std::string previous = read_latest(run_dir);
    std::string name = step_folder_name(state.step);
    if (name == previous) name += ".1";  // a re-save of the step `latest` names; step-N.1 -> step-N again
    const fs::path dir = run_dir / name;
    std::error_code ec;
    fs::remove_all(dir, ec);  // not the folder `latest` names: a leftover of a crash or of an abandoned future
    MOM_CHECK(!ec, "cannot replace '", dir.string(), "': ", ec.message());
    fs::create_directories(dir, ec);
    MOM_CHECK(!ec, "cannot create '", dir.string(), "': ", ec.message());
    try {
      write_step_folder(card, dir, params, m, v, state, extra_metadata);
    } catch (...) {
      fs::remove_all(dir, ec);  // a half-written folder is never named by `latest`; drop it
      throw;
    }
    // Only now does the new checkpoint become the one `latest` names.
    write_file_atomically(run_dir / "latest", name + "\n");
    prune(run_dir, name, state.step, previous);
    return dir;
  }

  // Loads a checkpoint (run dir or step folder) into model, adam_m, adam_v and state. Everything is read and
  // validated before anything is written, so a refused checkpoint leaves the model untouched.
  static std::map<std::string, std::string> load(const std::filesystem::path& path, Instance& model,
                                                 std::span<T> adam_m, std::span<T> adam_v, TrainState& state) {
    const ModelCard& card = model_card(model);
    MOM_CHECK(adam_m.size() == std::size_t(card.params) && adam_v.size() == std::size_t(card.params),
              "Checkpointer::load: AdamW moments of ", adam_m.size(), " and ", adam_v.size(), " values, expected ",
              card.params);
    const std::filesystem::path dir = resolve_checkpoint(path);
    const std::string where = "checkpoint '" + dir.string() + "'";
    std::vector<T> params(std::size_t(card.params));
    const safetensors::File mf = read_params(card, dir, params);
    const safetensors::File opt(dir / "optimizer.safetensors");
    MOM_CHECK(opt.meta("mom.checkpoint_id") == mf.meta("mom.checkpoint_id"), where,
              ": model.safetensors and optimizer.safetensors come from different saves");
    MOM_CHECK(opt.meta("mom.describe") == mf.meta("mom.describe"), where,
              ": optimizer.safetensors is of another architecture ('", opt.meta("mom.describe"), "')");
    TrainState s;
    s.step = step_of(opt);
    const std::int64_t model_step = step_of(mf);
    MOM_CHECK(model_step == s.step, where, ": model.safetensors is at step ", model_step,
              " but optimizer.safetensors at step ", s.step);
    // The model file's exact contents, as its optimizer file recorded them (absent in older checkpoints; a
    // model file without checksums, rewritten by another tool, is read unverified as safetensors.hpp says).
    const auto recorded = opt.metadata().find("mom.model_checksum");
    const auto actual = mf.metadata().find(std::string(safetensors::header_checksum_key));
    if (recorded != opt.metadata().end() && actual != mf.metadata().end())
      MOM_CHECK(recorded->second == actual->second, where,
                ": model.safetensors is not the file optimizer.safetensors was saved with (its header checksum ",
                actual->second, ", recorded ", recorded->second, ")");
    MOM_CHECK(opt.tensors().size() == 2, where, ": optimizer.safetensors holds ", opt.tensors().size(),
              " tensors, expected adam.m and adam.v");
    std::vector<T> m(adam_m.size()), v(adam_v.size());
    for (const char* name : {"adam.m", "adam.v"}) {
      const safetensors::TensorInfo* t = opt.find(name);
      MOM_CHECK(t != nullptr, where, ": optimizer.safetensors lacks tensor '", name, "'");
      MOM_CHECK(t->shape == std::vector<std::int64_t>{card.params}, where, ": tensor '", name, "' has shape ",
                shape_string(t->shape), ", expected [", card.params, "]");
      opt.read<T>(name, std::string_view(name) == "adam.m" ? std::span<T>(m) : std::span<T>(v));
    }
    check_moments(card, where + ": ", m, v);
    s.sampler_state = opt.meta("mom.sampler_state");
    std::mt19937_64 probe;
    try {
      set_rng_state(probe, s.sampler_state);  // validates before committing
    } catch (const Error& e) {
      throw Error(where + ": optimizer metadata mom.sampler_state: " + e.what());
    }
    s.freeze = freeze_of(card, opt, mf, where);
    if (const auto it = opt.metadata().find("mom.ranks"); it != opt.metadata().end()) {
      const auto ranks = parse_int64(it->second);
      MOM_CHECK(ranks && *ranks >= 1, where, ": optimizer metadata mom.ranks '", it->second,
                "' is not a whole number >= 1");
      s.ranks = *ranks;
    }
    if (const auto it = opt.metadata().find("mom.flops"); it != opt.metadata().end()) {  // absent before flops_budget
      double f = -1, w = -1;
      char end = 0;
      MOM_CHECK(std::sscanf(it->second.c_str(), "%lf,%lf%c", &f, &w, &end) == 2 && std::isfinite(f) && f >= 0 &&
                    std::isfinite(w) && w >= 0 && w <= f,
                where, ": optimizer metadata mom.flops '", it->second, "' is not two FLOP counts 'done,warm-up'");
      s.flops = f;
      s.flops_at_warmup = w;
    }
    model.backend().from_host(model.params(), std::span<const T>(params));
    model.backend().from_host(adam_m, std::span<const T>(m));
    model.backend().from_host(adam_v, std::span<const T>(v));
    state = s;
    return mf.metadata();
  }

  // Loads only the parameters (for sampling). Returns the model file's metadata.
  static std::map<std::string, std::string> load_params(const std::filesystem::path& path, Instance& model) {
    const ModelCard& card = model_card(model);
    std::vector<T> params(std::size_t(card.params));
    const safetensors::File f = read_params(card, resolve_checkpoint(path), params);
    model.backend().from_host(model.params(), std::span<const T>(params));
    return f.metadata();
  }

 private:
  static std::string shape_string(const std::vector<std::int64_t>& shape) {
    std::string s = "[";
    for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
  }

  static std::int64_t step_of(const safetensors::File& f) {
    const std::string text = f.meta("mom.step");
    const auto step = parse_int64(text);
    MOM_CHECK(step && *step >= 0, "checkpoint file '", f.path_string(), "': metadata mom.step '", text,
              "' is not a whole number >= 0");
    return *step;
  }

  // The freeze patterns a checkpoint records: optimizer metadata mom.freeze, a JSON array of strings. Without
  // that key (a checkpoint written before it), the "freeze" list of the model file's mom.config when it has
  // one (the first --freeze version recorded the patterns there only), else none: nothing frozen. Each
  // pattern must match a tensor of this model.
  static std::vector<std::string> freeze_of(const ModelCard& card, const safetensors::File& opt,
                                            const safetensors::File& mf, const std::string& where) {
    nlohmann::json list;
    std::string origin;
    if (const auto it = opt.metadata().find("mom.freeze"); it != opt.metadata().end()) {
      list = nlohmann::json::parse(it->second, nullptr, false);
      origin = "optimizer metadata mom.freeze";
    } else if (const auto c = mf.metadata().find("mom.config"); c != mf.metadata().end()) {
      const auto config = nlohmann::json::parse(c->second, nullptr, false);  // unreadable: not ours to refuse
      if (!config.is_object() || !config.contains("freeze")) return {};
      list = config["freeze"];
      origin = "the \"freeze\" of mom.config";
    } else {
      return {};
    }
    std::vector<std::string> patterns;
    MOM_CHECK(list.is_array(), where, ": ", origin, " is not a JSON array of strings");
    for (const auto& p : list) {
      MOM_CHECK(p.is_string(), where, ": ", origin, " is not a JSON array of strings");
      patterns.push_back(p.get<std::string>());
    }
    try {
      freeze_mask(card.layout, patterns);
    } catch (const Error& e) {
      throw Error(where + ": " + origin + ": " + e.what());
    }
    return patterns;
  }

  // The layout tensor holding flat parameter index i.
  static const ParamInfo& param_at(const ModelCard& card, std::size_t i) {
    for (const auto& p : card.layout)
      if (i < std::size_t(p.offset + p.size())) return p;
    return card.layout.back();
  }

  static void check_finite(const ModelCard& card, const std::string& where, std::span<const T> params,
                           std::span<const T> m, std::span<const T> v) {
    if (const auto i = first_non_finite(params)) {
      const ParamInfo& p = param_at(card, *i);
      throw Error(where + "tensor '" + std::string(p.name) + "' holds NaN/Inf at element " +
                  std::to_string(*i - std::size_t(p.offset)) + " (" + std::to_string(double(params[*i])) + ")");
    }
    check_moments(card, where, m, v);
  }
  static void check_moments(const ModelCard& card, const std::string& where, std::span<const T> m,
                            std::span<const T> v) {
    for (const auto& [name, values] : {std::pair{"adam.m", m}, std::pair{"adam.v", v}})
      if (const auto i = first_non_finite(values)) {
        const ParamInfo& p = param_at(card, *i);
        throw Error(where + "tensor '" + name + "' holds NaN/Inf at element " + std::to_string(*i) +
                    " (parameter '" + std::string(p.name) + "' element " + std::to_string(*i - std::size_t(p.offset)) +
                    ")");
      }
    for (std::size_t i = 0; i < v.size(); ++i)
      MOM_CHECK(v[i] >= T(0), where, "tensor 'adam.v' holds a negative value at element ", i, " (", v[i], ")");
  }

  static safetensors::File read_params(const ModelCard& card, const std::filesystem::path& dir, std::vector<T>& params) {
    safetensors::File f(dir / "model.safetensors");
    const std::string where = "checkpoint '" + dir.string() + "'";
    const std::string& ours = card.describe;
    const auto it = f.metadata().find("mom.describe");
    MOM_CHECK(it != f.metadata().end(), where, " has no mom.describe metadata (not saved by mom)");
    MOM_CHECK(it->second == ours, where, " is a different architecture: it holds '", it->second,
              "' but this model is '", ours, "'");
    for (const auto& p : card.layout) {
      const safetensors::TensorInfo* t = f.find(p.name);
      MOM_CHECK(t != nullptr, where, " lacks tensor '", p.name, "'");
      const std::vector<std::int64_t> want = p.rows == 1 ? std::vector<std::int64_t>{p.cols}
                                                         : std::vector<std::int64_t>{p.rows, p.cols};
      MOM_CHECK(t->shape == want, where, ": tensor '", p.name, "' has shape ", shape_string(t->shape), ", expected ",
                shape_string(want));
      f.read<T>(p.name, std::span<T>(params).subspan(p.offset, p.size()));
    }
    MOM_CHECK(f.tensors().size() == card.layout.size(), where, " holds ", f.tensors().size(),
              " tensors, this model has ", card.layout.size());
    if (const auto i = first_non_finite(std::span<const T>(params))) {
      const ParamInfo& p = param_at(card, *i);
      throw Error(where + ": tensor '" + std::string(p.name) + "' holds NaN/Inf at element " +
                  std::to_string(*i - std::size_t(p.offset)));
    }
    return f;
  }

  static void write_step_folder(const ModelCard& card, const std::filesystem::path& dir, std::span<const T> params,
                                std::span<const T> m, std::span<const T> v, const TrainState& state,
                                const std::map<std::string, std::string>& extra_metadata) {
    std::random_device rd;
    const std::string id = std::to_string((std::uint64_t(rd()) << 32) | rd());
    const std::string& describe_line = card.describe;

    safetensors::Writer w;
    for (const auto& p : card.layout) {
      std::vector<std::int64_t> shape = p.rows == 1 ? std::vector<std::int64_t>{p.cols}
                                                    : std::vector<std::int64_t>{p.rows, p.cols};
      w.add<T>(std::string(p.name), params.subspan(p.offset, p.size()), std::move(shape));
    }
    for (const auto& [k, val] : extra_metadata) w.metadata(k, val);
    w.metadata("format", "pt");
    w.metadata("mom.describe", describe_line);
    w.metadata("mom.step", std::to_string(state.step));
    w.metadata("mom.checkpoint_id", id);

    safetensors::Writer opt;
    opt.add<T>("adam.m", m, {static_cast<std::int64_t>(m.size())});
    opt.add<T>("adam.v", v, {static_cast<std::int64_t>(v.size())});
    opt.metadata("mom.step", std::to_string(state.step));
    opt.metadata("mom.sampler_state", state.sampler_state);
    opt.metadata("mom.freeze", nlohmann::json(state.freeze).dump());
    opt.metadata("mom.ranks", std::to_string(state.ranks));
    char flops[64];
    std::snprintf(flops, sizeof flops, "%.17g,%.17g", state.flops, state.flops_at_warmup);
    opt.metadata("mom.flops", flops);
    opt.metadata("mom.checkpoint_id", id);
    opt.metadata("mom.describe", describe_line);
    opt.metadata("mom.model_checksum", w.header_checksum());
    opt.write(dir / "optimizer.safetensors");
    w.write(dir / "model.safetensors");
  }

  // After `latest` names `name` (step `step`): keeps it and the newest complete folder of an earlier step
  // (the one `previous` named when it ties); removes every other step folder.
  static void prune(const std::filesystem::path& run_dir, const std::string& name, std::int64_t step,
                    const std::string& previous) {
    namespace fs = std::filesystem;
    std::vector<std::pair<std::int64_t, fs::path>> folders;
    std::error_code ec;
    for (fs::directory_iterator it(run_dir, ec), end; !ec && it != end; it.increment(ec)) {
      std::error_code dc;
      const std::string fname = it->path().filename().string();
      if (const auto s = step_folder_step(fname); s && fname != name && it->is_directory(dc))
        folders.push_back({*s, it->path()});
    }
    const fs::path* keep = nullptr;
    std::int64_t keep_step = -1;
    for (const auto& [s, p] : folders) {
      if (s >= step || !step_folder_complete(p)) continue;
      if (s > keep_step || (s == keep_step && p.filename() == previous)) keep = &p, keep_step = s;
    }
    for (const auto& [s, p] : folders)
      if (&p != keep) fs::remove_all(p, ec);
  }
};

}  // namespace mom::train

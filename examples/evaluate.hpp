#pragma once
// mom-train eval: the validation cross-entropy of a checkpoint on a text (or prepared data), and
// mom-train prune (ModuleFormer, arXiv 2306.04640 §5.3): module usage over validation windows, a threshold,
// the masked model's loss, and optionally its compaction into a smaller registered type
// (models/module_surgery.hpp). Both read the validation split: a text is tokenized with the checkpoint's
// tokenizer into a temporary folder (removed afterwards); a folder with train.bin/val.bin is used as it is.
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>

#include <mom/models/module_surgery.hpp>
#include <mom/train/checkpoint.hpp>
#include <mom/train/data.hpp>
#include <mom/train/tokenizer.hpp>

#include "architectures.hpp"
#include "run_records.hpp"
#include "train_session.hpp"

namespace mom::examples {

struct EvalRequest {
  std::filesystem::path checkpoint, data, repo_root = ".";
  double val_fraction = 0.1;  // of a text: its tail, as mom-train holds it out
  index_t batch = 8, seq = 256, batches = 16;
  Device device;
};
struct PruneRequest {
  EvalRequest eval;
  double tau = 0.1;
  std::string into;           // a registered compact architecture; empty: keep the type, mask only
  std::filesystem::path out;  // where the pruned checkpoint is written (empty: not saved)
};

// The validation token file of r.data, tokenized with `tokenizer` when it is a text.
class EvalData {
 public:
  EvalData(const EvalRequest& r, const std::string& tokenizer);  // run_records.cpp
  ~EvalData();
  EvalData(const EvalData&) = delete;
  EvalData& operator=(const EvalData&) = delete;
  const train::TokenFile& file() const { return *file_; }

 private:
  std::filesystem::path tmp_;
  std::optional<train::TokenFile> file_;
};

// Mean cross-entropy (nats/token) over r.batches fixed validation windows (train::eval_batch); on_forward(m)
// after each forward (routing statistics).
template <class Instance, class OnForward>
double validation_loss(Instance& m, const train::TokenFile& val, const EvalRequest& r, OnForward&& on_forward) {
  const Dims D = model_card(m).dims;
  MOM_CHECK(r.seq > 0 && r.seq <= D.context, "--seq ", r.seq, " must be in 1..", D.context, " (the context)");
  MOM_CHECK(val.vocab() <= D.vocab, "the data's vocabulary (", val.vocab(), ") exceeds the model's ", D.vocab);
  m.reserve(r.batch, r.seq);
  std::vector<token_t> in(std::size_t(r.batch * r.seq)), tg(in.size());
  double sum = 0;
  for (index_t i = 0; i < r.batches; ++i) {
    train::eval_batch(val, r.batch, r.seq, i, in, tg);
    m.forward(in, tg, r.batch, r.seq);
    sum += double(m.cross_entropy());
    on_forward(m);
  }
  return sum / double(r.batches);
}

// The architecture's part of `mom-train eval`: its model on the device (the rest: evaluate_checkpoint,
// train_session.hpp, compiled once per backend).
template <class Model, class Be>
int evaluate_model(const EvalRequest& r) {
  ModelInstance<Model, Be> model(1, open_backend(BackendTag<Be>{}, r.device, nullptr));
  ErasedModel any(model);
  return evaluate_checkpoint<Be>(r, any);
}

namespace detail {
// Parameters the pruned modules hold (their slices; the rest of the model is kept whole).
template <class Model>
index_t pruned_params(const PruneMask& mask) {
  using P = mom::detail::SurgeryPart<Model>;
  index_t n = 0;
  auto count = [&](const char* family, index_t per_module) {
    const int f = mom::detail::mask_family(mask, family);
    if (f < 0) return;
    for (const auto& layer : mask.keep[std::size_t(f)]) n += index_t(std::count(layer.begin(), layer.end(), false)) * per_module;
  };
  index_t attn = 0, ffn = 0;
  for (const auto& s : P::Attn::module_slices) attn += s.size;
  for (const auto& s : P::Ffn::module_slices) ffn += s.size;
  count("attn", attn);
  count("ffn", ffn);
  return n;
}
}  // namespace detail

// Usage over the validation windows, the mask for r.tau, the masked model's loss beside the unpruned one,
// and (r.into) the compacted model's; r.out receives the pruned checkpoint (masked, or compacted).
template <class Model, class Compact, class Be>
int prune_model(const PruneRequest& r, const std::string& compact_name) {
  ModelInstance<Model, Be> model(1, open_backend(BackendTag<Be>{}, r.eval.device, nullptr));
  ErasedModel any(model);
  const auto meta = load_params<Be>(r.eval.checkpoint, any);
  const std::string tokenizer = checkpoint_tokenizer_name(meta, Model::dims.vocab, r.eval.checkpoint);
  MOM_CHECK(r.into.empty() || r.into == compact_name, "--into '", r.into, "': this architecture compacts into '",
            compact_name, "' (registered in examples/arch_moduleformer.hpp)");
  const EvalData data(r.eval, tokenizer);
  RoutingStats stats;
  const double before = validation_loss(model, data.file(), r.eval, [&](auto& m) { stats.accumulate(m); });
  const PruneMask mask = prune_mask(module_usage(stats), r.tau);
  apply_prune_mask(model, mask);
  const double masked = validation_loss(model, data.file(), r.eval, [](auto&) {});
  const index_t pruned = detail::pruned_params<Model>(mask);
  std::printf("prune: tau %.3g keeps %lld of %lld attention heads and %lld of %lld FFN experts\n", r.tau,
              static_cast<long long>(mask.kept(0)), static_cast<long long>(mask.keep[0].size() * mask.keep[0][0].size()),
              static_cast<long long>(mask.kept(1)), static_cast<long long>(mask.keep[1].size() * mask.keep[1][0].size()));
  std::printf("prune: parameters %lld of %lld kept (%.1f%%); validation loss %.4f -> %.4f nats/token\n",
              static_cast<long long>(Model::params - pruned), static_cast<long long>(Model::params),
              100.0 * double(Model::params - pruned) / double(Model::params), before, masked);
  std::map<std::string, std::string> out_meta{{"mom.tokenizer", tokenizer}};
  if (const auto d = meta.find("mom.data"); d != meta.end()) out_meta.insert(*d);  // what it was trained on
  auto save = [&](auto& m, const std::string& arch) {
    if (r.out.empty()) return;
    using M = typename std::remove_reference_t<decltype(m)>::model_type;  // saved with its describe line
    const auto zeros = m.backend().template alloc<float>(M::params);  // fresh AdamW moments (backend memory)
    out_meta["mom.arch"] = arch;
    const auto dir = train::Checkpointer<std::remove_reference_t<decltype(m)>>::save(
        r.out, m, zeros.span(), zeros.span(), train::TrainState{}, out_meta);
    std::printf("prune: wrote %s (%s)\n", dir.string().c_str(), arch.c_str());
  };
  if (r.into.empty()) {
    const auto arch_it = meta.find("mom.arch");
    save(model, arch_it != meta.end() ? arch_it->second : std::string());
    return 0;
  }
  ModelInstance<Compact, Be> small(1, model.backend());
  compact(small, model, mask);
  const double compacted = validation_loss(small, data.file(), r.eval, [](auto&) {});
  std::printf("prune: compacted into %s (%lld parameters): validation loss %.4f nats/token\n", r.into.c_str(),
              static_cast<long long>(Compact::params), compacted);
  save(small, r.into);
  return 0;
}

}  // namespace mom::examples

// The definitions of train_session.hpp, included only by the generated unit session.cpp (examples/CMakeLists.txt),
// which instantiates them for each backend of the build: the Trainer and the Checkpointer on AnyModel<Be> are
// compiled there, once per backend, rather than once per architecture.
#pragma once

#include "train_model.hpp"

#include <omp.h>

#include <cstdio>
#include <optional>

namespace mom::examples {

template <class Be>
struct TrainSession<Be>::State {
  const ArchEntry& arch;
  const TrainRequest& r;
  const ModelCard& card;
  train::TrainConfig cfg;
  bool rank0 = true;
  int ranks = 1;
  train::DirLock lock;
  std::optional<Be> be;
  std::optional<train::TokenFile> train_data, val_data;
  std::unique_ptr<train::Tokenizer> sample_tokenizer;
  double entropy = 0;
};

template <class Be>
TrainSession<Be>::TrainSession(const ArchEntry& arch, const TrainRequest& r, const ModelCard& card,
                               std::string twin_describe)
    : s_(new State{arch, r, card, r.cfg}) {
  namespace fs = std::filesystem;
  State& s = *s_;
  train::TrainConfig& cfg = s.cfg;
  MOM_CHECK(cfg.seq > 0 && cfg.seq <= card.dims.context, "--seq ", cfg.seq, " exceeds the context ", card.dims.context,
            " of architecture '", arch.name, "'");
  MOM_CHECK(!cfg.out_dir.empty(), "--out must name an output directory");
  // Several ranks share --out (one file system): rank 0 alone creates it, prepares the data and writes.
  s.rank0 = !r.comm || r.comm->rank() == 0;
  // Another process writing this run is refused first (naming its pid), before anything here reads or writes
  // it; the lock is held to the end (train::DirLock).
  if (s.rank0 && fs::is_directory(cfg.out_dir)) s.lock = train::DirLock(cfg.out_dir);
  const bool existing = train::has_checkpoint(cfg.out_dir);
  MOM_CHECK(!existing || r.resume, "output directory '", cfg.out_dir.string(),
            "' already holds a checkpoint: pass --resume to continue it, or choose another --out");
  MOM_CHECK(existing || !r.resume, "--resume: no checkpoint in '", cfg.out_dir.string(), "'");
  check_init_from(arch, r, twin_describe);
  if (cfg.freeze) train::freeze_mask(card.layout, *cfg.freeze);  // a pattern that matches nothing: refused before any work
  s.be.emplace(open_backend(BackendTag<Be>{}, r.device, r.comm));  // no such device: refused before any work
  Be& be = *s.be;
  cfg.device = device_name(BackendTag<Be>{}, be);  // cuda:N, the GPU this process opened
  cfg.precision = r.device.precision;
  s.ranks = r.comm ? r.comm->size() : 1;
  if (s.rank0) {
    train::ensure_writable_dir(cfg.out_dir);
    if (!s.lock.locked()) s.lock = train::DirLock(cfg.out_dir);
  }
  cfg.data_name = data_identity(r.data);
  if (r.resume) {  // refuse another architecture's checkpoint, or other data, before any work
    const auto dir = train::resolve_checkpoint(cfg.out_dir);
    const train::safetensors::File f(dir / "model.safetensors");
    const auto it = f.metadata().find("mom.describe");
    MOM_CHECK(it != f.metadata().end() && it->second == arch.describe, "checkpoint '", dir.string(),
              "' is a different architecture: it holds '", it != f.metadata().end() ? it->second : "?",
              "' but --arch ", arch.name, " is '", arch.describe, "'");
    check_resume_data(f, cfg);
    MOM_CHECK(!r.seed_given && !r.tokenizer_given && !r.val_fraction_given, "--resume continues the run's own ",
              r.seed_given ? "seed (its data order is restored from the checkpoint): leave out --seed"
                           : "prepared data: leave out --tokenizer and --val-fraction");
    // The recorded seed, so that the run's configuration (metrics, the next checkpoint) keeps saying it.
    if (const auto it = f.metadata().find("mom.config"); it != f.metadata().end()) {
      const auto config = nlohmann::json::parse(it->second, nullptr, false);
      if (config.is_object() && config.contains("seed") && config["seed"].is_number_unsigned())
        cfg.seed = config["seed"].get<std::uint64_t>();
    }
  }
  check_memory(card, cfg, backend_memory_bytes(BackendTag<Be>{}, be),
               r.device.kind == DeviceKind::cpu ? std::string("this machine") : r.device.name());
  const std::string tokenizer_name = r.tokenizer.empty() ? arch.tokenizer : r.tokenizer;

  DataFiles files;
  if (s.rank0) files = resolve_data(r, tokenizer_name);
  if (s.ranks > 1) {  // the others open what rank 0 prepared (the broadcast waits for it)
    files.train = r.comm->broadcast_string(files.train.string(), 0);
    files.val = r.comm->broadcast_string(files.val.string(), 0);
  }
  // From here on no rank waits for long work on another (data preparation is done): a collective that waits
  // longer than the timeout means a stopped or hung rank, and ends the job.
  if (s.ranks > 1) r.comm->set_collective_timeout(r.collective_timeout);
  s.train_data.emplace(files.train);
  if (!files.val.empty()) s.val_data.emplace(files.val);
  const train::TokenFile& train_data = *s.train_data;
  cfg.arch_name = arch.name;
  cfg.tokenizer_name = train_data.tokenizer();
  // The tokenizer the data names must exist before training (the final sample and mom-sample need it).
  if (r.sample_tokens > 0)
    s.sample_tokenizer = train::make_tokenizer(cfg.tokenizer_name, repo_root());
  else
    MOM_CHECK(train::known_tokenizer_vocab(cfg.tokenizer_name).has_value(), "data file '", files.train.string(),
              "' names the tokenizer '", cfg.tokenizer_name, "' which this build does not know (known: byte, gpt2)");
  s.entropy = train::unigram_entropy(train_data);
  std::printf("data: %lld train tokens, %lld validation tokens, vocab %lld (%s); unigram entropy %.4f nats/token\n",
              static_cast<long long>(train_data.size()), static_cast<long long>(s.val_data ? s.val_data->size() : 0),
              static_cast<long long>(train_data.vocab()), cfg.tokenizer_name.c_str(), s.entropy);
  std::printf("model: %s\n", arch.describe.c_str());
  std::printf("train: %lld steps x %lld x %lld tokens x %lld accum, lr %.3g (warm-up %lld, cosine to %.3g), "
              "weight decay %.3g, clip %.3g, %d threads, out %s\n"
              "device: %s\n",
              static_cast<long long>(cfg.steps), static_cast<long long>(cfg.batch), static_cast<long long>(cfg.seq),
              static_cast<long long>(cfg.accum), cfg.lr, static_cast<long long>(cfg.warmup), cfg.lr * cfg.min_lr_ratio,
              cfg.weight_decay, cfg.grad_clip, omp_get_max_threads(), cfg.out_dir.string().c_str(),
              backend_summary(BackendTag<Be>{}, be).c_str());
  std::fflush(stdout);
}

template <class Be>
TrainSession<Be>::~TrainSession() = default;

template <class Be>
Be TrainSession<Be>::take_backend() {
  MOM_CHECK(s_->be.has_value(), "internal: TrainSession::take_backend called twice");
  Be be = std::move(*s_->be);
  s_->be.reset();
  return be;
}

template <class Be>
const train::TrainConfig& TrainSession<Be>::config() const { return s_->cfg; }
template <class Be>
bool TrainSession<Be>::rank0() const { return s_->rank0; }
template <class Be>
const train::TokenFile* TrainSession<Be>::validation() const { return s_->val_data ? &*s_->val_data : nullptr; }
template <class Be>
train::Tokenizer* TrainSession<Be>::sample_tokenizer() { return s_->sample_tokenizer.get(); }

template <class Be>
bool TrainSession<Be>::init_from_own(AnyModel<Be>& model) {
  const auto file = init_from_file(s_->r.init_from);
  if (init_from_describe(file) != s_->arch.describe) return false;
  load_params(file.parent_path(), model);
  std::printf("fine-tuning: parameters from %s (optimizer state fresh, step 0)\n", file.string().c_str());
  std::fflush(stdout);
  return true;
}

template <class Be>
train::TrainResult TrainSession<Be>::train(AnyModel<Be>& model, EvalHooks hooks) {
  State& s = *s_;
  const TrainRequest& r = s.r;
  const train::TrainConfig& cfg = s.cfg;
  // Several ranks on a device backend: its gradients summed in device memory where the build can (NCCL).
  const auto device_comm = device_communicator(BackendTag<Be>{}, model.backend(), r.comm);
  train::Communicator* comm = device_comm ? device_comm.get() : r.comm;
  if (s.ranks > 1)
    std::printf("data parallel: %s; each rank trains on %lld of the %lld sequences per micro-batch (%d threads each)\n",
                comm->name().c_str(), static_cast<long long>(cfg.batch), static_cast<long long>(cfg.batch) * s.ranks,
                omp_get_max_threads());
  std::fflush(stdout);
  train::Trainer<AnyModel<Be>> trainer(model, *s.train_data, s.val_data ? &*s.val_data : nullptr, cfg, comm);
  // With --freeze (or a model with buffers) trainer.run() starts with its freeze_summary() line.
  if (hooks.on_eval_forward) trainer.on_eval_forward = [f = std::move(hooks.on_eval_forward)](AnyModel<Be>&) { f(); };
  trainer.on_eval_done = std::move(hooks.on_eval_done);
  if (r.resume) {
    const auto changes = trainer.resume(cfg.out_dir);
    std::printf("resumed from step %lld of %s\n", static_cast<long long>(trainer.step()), cfg.out_dir.string().c_str());
    for (const auto& c : changes) std::printf("resume: changed since the checkpoint: %s\n", c.c_str());
    MOM_CHECK(!trainer.finished(), "--resume: the checkpoint is at step ", trainer.step(),
              cfg.flops_budget > 0 && trainer.step() < cfg.steps ? " and has spent the FLOP budget" : "",
              ", nothing to do for --steps ", cfg.steps,
              cfg.flops_budget > 0 ? " --flops-budget " + std::to_string(cfg.flops_budget) : std::string());
  }
  const auto result = trainer.run();
  std::printf("done: steps %lld..%lld in %.1f s, %.0f tokens/s while training%s\n", static_cast<long long>(result.first_step),
              static_cast<long long>(result.last_step), result.seconds, result.tokens_per_second,
              result.interrupted ? " (interrupted; continue with --resume)" : "");
  if (s.ranks > 1)
    std::printf("communication: %.2f s reducing gradients and losses, %.1f%% of the training time\n",
                result.comm_seconds, 100.0 * result.comm_seconds / std::max(result.train_seconds, 1e-9));
  if (!s.rank0) return result;  // rank 0 alone reports the end of the run
  if (result.skipped_steps > 0)
    std::printf("warning: %lld steps had a non-finite loss or gradients and were skipped (not applied)\n",
                static_cast<long long>(result.skipped_steps));
  if (result.final_val_loss)
    std::printf("final validation loss %.4f nats/token (perplexity %.3f) vs unigram entropy %.4f nats/token\n",
                *result.final_val_loss, std::exp(*result.final_val_loss), s.entropy);
  return result;
}

template <class Be>
std::map<std::string, std::string> load_params(const std::filesystem::path& checkpoint, AnyModel<Be>& model) {
  return train::Checkpointer<AnyModel<Be>>::load_params(checkpoint, model);
}

template <class Be>
int evaluate_checkpoint(const EvalRequest& r, AnyModel<Be>& model) {
  const auto meta = load_params(r.checkpoint, model);
  const EvalData data(r, train::checkpoint_tokenizer(meta, model.card().dims.vocab,
                                                     "checkpoint '" + r.checkpoint.string() + "'"));
  const double loss = validation_loss(model, data.file(), r, [](auto&) {});
  std::printf("validation loss %.4f nats/token over %lld windows of %lld x %lld tokens of %s\n", loss,
              static_cast<long long>(r.batches), static_cast<long long>(r.batch), static_cast<long long>(r.seq),
              r.data.string().c_str());
  return 0;
}

}  // namespace mom::examples

// A line of the generated session.cpp: one backend's instantiation of the code above.
#define MOM_TRAIN_SESSION(Be)                                                                                 \
  template class mom::examples::TrainSession<Be>;                                                             \
  template std::map<std::string, std::string> mom::examples::load_params<Be>(const std::filesystem::path&,   \
                                                                             mom::AnyModel<Be>&);            \
  template int mom::examples::evaluate_checkpoint<Be>(const mom::examples::EvalRequest&, mom::AnyModel<Be>&);

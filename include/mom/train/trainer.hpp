// The training loop: AdamW with decoupled weight decay on matrices only, linear warm-up then cosine decay
// to a floor, global-norm gradient clipping (fused into the AdamW pass), gradient accumulation, periodic
// validation loss / perplexity, progress display, JSON-lines metrics, checkpoints and bit-identical resume.
// Per-tensor freezing (TrainConfig::freeze, mom-train --freeze): frozen tensors and buffers
// (TensorSpec::trainable = false) get no AdamW update at all (no step, no weight decay, moments untouched),
// and their gradients are zeroed before the global gradient norm, so they do not count in it nor in clipping.
// The patterns are part of the checkpoint (TrainState::freeze) and restored on resume.
//
//   auto model = Model::make<cpu::Backend<float>>(seed);
//   TokenFile train("data/train.bin"), val("data/val.bin");
//   Trainer trainer(model, train, &val, TrainConfig{.steps = 2000, .batch = 16, .seq = 128, .out_dir = "runs/a"});
//   trainer.run();                           // or trainer.resume("runs/a"); trainer.run();
//
// Resume is bit-identical: a checkpoint holds the parameters, both AdamW moments, the step, the training
// sampler's RNG state and the freeze patterns; the schedule depends on the step alone and evaluation uses its own fixed windows, so
// steps N+1.. after a resume compute exactly what an uninterrupted run computes (same thread count: the ops'
// OpenMP reductions are statically scheduled).
//
// Data parallelism (docs/distributed.md): given a Communicator of N > 1 ranks, every rank holds the whole model;
// rank r trains on windows [r batch, (r + 1) batch) of the N x batch windows a single process would draw
// (BatchSampler), the gradients are summed over ranks in rank order (Communicator::allreduce_sum: the same bits
// on every rank) and divided by N x accum, and every rank applies the same AdamW step. The loss and the stop
// request are reduced each step, validation batches are split over the ranks, parameters are compared across
// ranks every replica_check_interval steps, and rank 0 alone prints, logs and writes checkpoints. With one
// rank (no communicator) every step runs exactly the code it ran before data parallelism existed.
#pragma once

#include <mom/backend/backend_concept.hpp>
#include <mom/models/any_model.hpp>
#include <mom/models/describe.hpp>
#include <mom/models/realised_flops.hpp>
#include <mom/train/checkpoint.hpp>
#include <mom/train/data.hpp>
#include <mom/train/distributed.hpp>
#include <mom/train/metrics.hpp>

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <numbers>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace mom::train {

// Set from a signal handler (mom-train sets it on Ctrl-C): the Trainer finishes the current step, saves a
// checkpoint and returns, so the run can be resumed later.
inline std::atomic<bool> stop_requested{false};

struct TrainConfig {
  index_t steps = 1000;        // optimizer steps in total (a resumed run continues up to this)
  index_t batch = 16;          // sequences per micro-batch
  index_t seq = 128;           // tokens per sequence (<= the model's context)
  index_t accum = 1;           // micro-batches per optimizer step (gradient accumulation)
  double lr = 1e-3;            // peak learning rate
  double min_lr_ratio = 0.1;   // cosine floor: min_lr = lr * min_lr_ratio
  index_t warmup = 100;        // linear warm-up steps
  double weight_decay = 0.1;   // on matrices only (rows > 1 && cols > 1 in Model::layout)
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double grad_clip = 1.0;      // max global gradient L2 norm; 0 = no clipping
  index_t eval_interval = 100; // validate every this many steps (and at the end); 0 = only at the end
  index_t eval_batches = 8;    // micro-batches per validation
  index_t checkpoint_interval = 0;  // save every this many steps (and at the end); 0 = only at the end
  bool save_checkpoints = true;     // false: no checkpoint at all (metrics.jsonl only; the run cannot be resumed)
  double flops_budget = 0;     // > 0: training ends once the steps' training FLOPs (last_step_flops, summed) reach
                               // it, `steps` being only the cap, and the cosine after the warm-up runs over the
                               // budget's FLOPs instead of the steps (a model whose cost changes while it trains,
                               // a layer-skip gate, spends the budget exactly; learning_rate)
  index_t log_interval = 10;   // plain-text progress line every this many steps when not on a terminal
  index_t max_skipped_steps = 5;  // diverged steps in a row before stopping: non-finite loss or gradients (skipped),
                                  // or a loss above 2 ln(vocab) (Trainer::divergence_bound)
  std::uint64_t seed = 1;      // training-data sampler seed
  std::filesystem::path out_dir;    // checkpoints + metrics.jsonl; empty = none
  bool progress = true;        // print progress to stdout
  std::string arch_name;       // recorded in checkpoints and metrics
  std::string tokenizer_name;  // recorded in checkpoints and metrics
  std::string data_name;       // where the training data came from (mom-train: the --data path); recorded
  std::string device = "cpu";      // where it trains (mom-train --device: cpu, cuda:0, ...); recorded, and a resume
  std::string precision = "fp32";  // on another device or precision is reported as a change (--precision)
  // Tensors that do not train: glob patterns over the layout's names ("h.*.smoe.w1", "wte"; `*` any run of
  // characters, dots included, `?` one character; the whole name must match; glob_match), each matching at
  // least one tensor (freeze_mask). Saved in every checkpoint (TrainState::freeze). Unset: nothing frozen in
  // a fresh run, and resume() restores the checkpoint's patterns; set (an empty list too, which unfreezes
  // everything), these patterns, also after resume(), which reports a difference from the checkpoint's.
  std::optional<std::vector<std::string>> freeze;

  // Every value in range, checked before anything is prepared or allocated (one MOM_CHECK error each):
  // counts positive and bounded so that no product of them can overflow (batch·seq tokens fit token_t
  // indices; steps, accumulation and validation batches at most 10^9), rates and coefficients finite and
  // in range.
  void check() const {
    constexpr index_t max_count = 1'000'000'000;
    MOM_CHECK(steps > 0 && steps <= max_count, "steps ", steps, " must be in [1, ", max_count, "]");
    MOM_CHECK(batch > 0 && batch <= max_count, "batch ", batch, " must be in [1, ", max_count, "]");
    MOM_CHECK(seq > 0 && seq <= max_count, "seq ", seq, " must be in [1, ", max_count, "]");
    MOM_CHECK(batch <= index_t(std::numeric_limits<token_t>::max()) / seq, "batch ", batch, " x seq ", seq,
              " tokens per micro-batch exceed ", std::numeric_limits<token_t>::max());
    MOM_CHECK(accum > 0 && accum <= max_count, "accum ", accum, " must be in [1, ", max_count, "]");
    MOM_CHECK(eval_batches > 0 && eval_batches <= max_count, "eval_batches ", eval_batches, " must be in [1, ",
              max_count, "]");
    MOM_CHECK(std::isfinite(lr) && lr > 0, "lr ", lr, " must be a finite number > 0");
    MOM_CHECK(std::isfinite(min_lr_ratio) && min_lr_ratio >= 0 && min_lr_ratio <= 1, "min_lr_ratio ", min_lr_ratio,
              " must be in [0, 1]");
    MOM_CHECK(warmup >= 0 && warmup <= max_count, "warmup ", warmup, " must be in [0, ", max_count, "]");
    MOM_CHECK(std::isfinite(weight_decay) && weight_decay >= 0, "weight_decay ", weight_decay,
              " must be a finite number >= 0");
    // AdamW's decoupled decay multiplies a matrix by 1 - lr * weight_decay each step: at 1 or more it zeroes or
    // flips the weights.
    MOM_CHECK(!(lr * weight_decay >= 1), "lr ", lr, " x weight_decay ", weight_decay,
              " must be < 1 (each step multiplies the weights by 1 - lr x weight_decay)");
    MOM_CHECK(std::isfinite(grad_clip) && grad_clip >= 0, "grad_clip ", grad_clip, " must be a finite number >= 0 (0: off)");
    MOM_CHECK(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1, "AdamW betas ", beta1, ", ", beta2,
              " must be in [0, 1)");
    MOM_CHECK(std::isfinite(eps) && eps > 0, "AdamW eps ", eps, " must be > 0");
    MOM_CHECK(eval_interval >= 0, "eval_interval ", eval_interval, " must be >= 0 (0: only at the end)");
    MOM_CHECK(checkpoint_interval >= 0, "checkpoint_interval ", checkpoint_interval, " must be >= 0 (0: only at the end)");
    MOM_CHECK(std::isfinite(flops_budget) && flops_budget >= 0, "flops_budget ", flops_budget,
              " must be a finite number >= 0 (0: no budget, train `steps` steps)");
    MOM_CHECK(log_interval > 0, "log_interval ", log_interval, " must be > 0");
    MOM_CHECK(max_skipped_steps > 0 && max_skipped_steps <= max_count, "max_skipped_steps ", max_skipped_steps,
              " must be in [1, ", max_count, "]");
  }

  nlohmann::json to_json() const {
    return {{"steps", steps}, {"batch", batch}, {"seq", seq}, {"accum", accum}, {"lr", lr},
            {"min_lr_ratio", min_lr_ratio}, {"warmup", warmup}, {"weight_decay", weight_decay},
            {"beta1", beta1}, {"beta2", beta2}, {"eps", eps}, {"grad_clip", grad_clip},
            {"eval_interval", eval_interval}, {"eval_batches", eval_batches},
            {"checkpoint_interval", checkpoint_interval}, {"save_checkpoints", save_checkpoints}, {"flops_budget", flops_budget}, {"log_interval", log_interval},
            {"max_skipped_steps", max_skipped_steps}, {"seed", seed}, {"arch", arch_name},
            {"tokenizer", tokenizer_name}, {"data", data_name}, {"device", device}, {"precision", precision},
            {"freeze", freeze.value_or(std::vector<std::string>{})}};
  }
};

// glob_match, split_patterns and freeze_mask (the freeze patterns) are in train/checkpoint.hpp: the patterns
// are part of the training state a checkpoint holds.

// Learning rate of optimizer step `step` (1-based): linear warm-up to lr over `warmup` steps, then cosine
// decay to lr * min_lr_ratio at the last step.
// With a FLOP budget (TrainConfig::flops_budget) the cosine's progress is FLOPs instead of steps: `flops` the training
// FLOPs up to and including this step, `flops_at_warmup` those of the warm-up's steps.
inline double learning_rate(const TrainConfig& c, index_t step, double flops = 0, double flops_at_warmup = 0) {
  if (c.warmup > 0 && step <= c.warmup) return c.lr * double(step) / double(c.warmup);
  const double min_lr = c.lr * c.min_lr_ratio;
  double progress = 0;
  if (c.flops_budget > 0) {
    const double span = c.flops_budget - flops_at_warmup;
    progress = span > 0 ? std::clamp((flops - flops_at_warmup) / span, 0.0, 1.0) : 1.0;
  } else {
    const index_t decay_steps = c.steps - c.warmup;
    if (decay_steps <= 0) return c.lr;
    progress = std::clamp(double(step - c.warmup) / double(decay_steps), 0.0, 1.0);
  }
  return min_lr + 0.5 * (c.lr - min_lr) * (1.0 + std::cos(std::numbers::pi * progress));
}

struct TrainResult {
  std::vector<double> losses;           // training loss of each step run by this call (mean over micro-batches)
  std::optional<double> final_val_loss; // last validation loss
  index_t first_step = 0, last_step = 0;
  double seconds = 0;
  double tokens_per_second = 0;
  bool interrupted = false;             // stopped early by stop_requested (a checkpoint was saved)
  index_t skipped_steps = 0;            // steps whose update was skipped (non-finite loss or gradients)
  int ranks = 1;                        // data-parallel ranks (tokens_per_second counts all of them)
  double train_seconds = 0;             // seconds less validation and checkpoints
  double comm_seconds = 0;              // of which in the gradient and loss reductions (0 with one rank)
  double training_flops = 0;            // forward + backward FLOPs of the steps run by this call (all ranks; see
                                        // Trainer::last_step_flops)
};

// A double for a JSON metrics line: JSON has no inf / NaN, so those are written as strings.
inline nlohmann::json json_number(double x) {
  if (std::isfinite(x)) return x;
  return std::isnan(x) ? "nan" : (x > 0 ? "inf" : "-inf");
}

template <class Instance>
class Trainer {
  static_assert(TrainableModel<Instance>, "mom::train::Trainer<Instance>: Instance must be a ModelInstance or an AnyModel "
                "(the members listed by mom::TrainableModel, models/any_model.hpp)");

 public:
  using T = typename Instance::scalar;

  // comm: the data-parallel group this process trains in (train/distributed.hpp); null: a single process.
  Trainer(Instance& model, const TokenFile& train, const TokenFile* val, TrainConfig cfg, Communicator* comm = nullptr)
      : model_(model), card_(model_card(model)), train_(train), val_(val), cfg_(std::move(cfg)),
        comm_(comm ? comm : &single_), rank_(comm_->rank()), ranks_(comm_->size()),
        sampler_(train, cfg_.batch, check_config(card_, cfg_, train, val).seq, cfg_.seed, rank_, ranks_),
        progress_(stdout, cfg_.log_interval) {
    auto& be = model_.backend();
    m_ = be.template alloc<T>(card_.params);
    v_ = be.template alloc<T>(card_.params);
    step_scalars_ = be.template alloc<T>(2);  // {gradient norm, summed micro-batch losses}, read once per step
    be.zero(m_.span());
    be.zero(v_.span());
    be.zero(step_scalars_.span());
    // accum + 1 staging slots: one step's micro-batches, and the next step's first one, drawn while this step
    // runs on the device (BatchSlot).
    for (index_t i = 0; i <= cfg_.accum; ++i) slots_.push_back(be.template alloc_host<token_t>(2 * cfg_.batch * cfg_.seq));
    inputs_.resize(static_cast<std::size_t>(cfg_.batch * cfg_.seq));
    targets_.resize(inputs_.size());
    model_.reserve(cfg_.batch, cfg_.seq);
    apply_freeze(cfg_.freeze.value_or(std::vector<std::string>{}));
    progress_.set_enabled(cfg_.progress && rank_ == 0);
    // Validation batches are split over the ranks; each must have one (the evaluation hooks reduce what every
    // rank gathered).
    MOM_CHECK(val_ == nullptr || cfg_.eval_batches >= ranks_, "eval_batches ", cfg_.eval_batches, " < ", ranks_,
              " ranks: each rank validates at least one batch");
  }

  // Continues from a checkpoint (run dir or step folder): parameters, AdamW moments, step, sampler state and
  // freeze patterns (those of the checkpoint unless the configuration sets its own). Returns what differs
  // between the checkpoint's recorded configuration and this one ("lr 0.002 -> 0.001", "freeze [] ->
  // [\"wte\"]"), each applied from here on; a different tokenizer (token ids that mean other text) is refused,
  // so are token files other than those the checkpoint records (check_data_record: checksums; swapped
  // training and validation files are named), and so is a different number of data-parallel ranks: the
  // sampler's state continues a data order only with the rank count that drew it (and the windows per step,
  // ranks x batch, would change). With several
  // ranks every rank loads the checkpoint (a file system they share), and the replicas are compared.
  std::vector<std::string> resume(const std::filesystem::path& checkpoint) {
    TrainState s;
    const auto meta = Checkpointer<Instance>::load(checkpoint, model_, m_.span(), v_.span(), s);
    MOM_CHECK(s.ranks == ranks_, "--resume: the checkpoint was trained on ", s.ranks, s.ranks == 1 ? " rank" : " ranks",
              " and this run has ", ranks_, ": each step's windows are split by rank, so the data order depends on "
              "the rank count; resume with the same count (",
              s.ranks == 1 ? std::string("one process, without mpirun") : "mpirun -np " + std::to_string(s.ranks), ")");
    check_data_record(meta, train_, val_, "--resume");
    sampler_.set_state(s.sampler_state);
    prefetched_ = false;  // a batch drawn before the resume is not the checkpoint's next one
    step_ = s.step;
    resumed_from_ = s.step;
    flops_done_ = s.flops;
    flops_at_warmup_ = s.flops_at_warmup;
    check_replicas_now();
    if (!cfg_.freeze) {  // restored; a configuration that sets its own keeps it (compared below)
      cfg_.freeze = s.freeze;
      apply_freeze(s.freeze);
    }
    std::vector<std::string> changes;
    const auto it = meta.find("mom.config");
    auto before = it == meta.end() ? nlohmann::json::object() : nlohmann::json::parse(it->second, nullptr, false);
    if (!before.is_object()) before = nlohmann::json::object();
    before["freeze"] = s.freeze;  // the training state's (checked by load), also for checkpoints older than it
    const auto now = cfg_.to_json();
    for (const auto& [key, value] : now.items()) {
      if (!before.contains(key) || before[key] == value) continue;
      MOM_CHECK(key != "tokenizer", "--resume: the checkpoint was trained on ", safetensors::json_brief(before[key]),
                " tokens, this run's data is ", safetensors::json_brief(value));
      changes.push_back(key + " " + safetensors::json_brief(before[key]) + " -> " + safetensors::json_brief(value));
    }
    return changes;
  }

  index_t step() const { return step_; }
  // The run is over: `steps` steps, or with a FLOP budget, that many training FLOPs.
  bool finished() const { return step_ >= cfg_.steps || (cfg_.flops_budget > 0 && flops_done_ >= cfg_.flops_budget); }
  // Training FLOPs of every step so far (resumed from the checkpoint), summed over micro-batches and ranks.
  double flops_done() const { return flops_done_; }
  Communicator& communicator() const { return *comm_; }
  // With several ranks: parameters compared across ranks every this many steps (and at the start, at every
  // checkpoint and at the end; check_replicas); 0: only there.
  index_t replica_check_interval = 100;
  // What the freeze patterns and the model's buffers hold back from training: frozen()[i] for layout tensor i
  // (freeze_mask), the counts of tensors and parameters, and the parameters that train.
  const std::vector<bool>& frozen() const { return frozen_; }
  index_t frozen_params() const { return frozen_params_; }
  index_t frozen_tensors() const { return frozen_tensors_; }
  index_t trainable_params() const { return card_.params - frozen_params_; }
  // "freeze: 3 patterns, 12 tensors (2 of them buffers), 1,234 of 5,678 parameters frozen, 4,444 trainable"
  std::string freeze_summary() const {
    auto count = [](std::size_t n, const char* what) { return std::to_string(n) + " " + what + (n == 1 ? "" : "s"); };
    std::size_t buffers = 0;
    for (const auto& p : card_.layout) buffers += p.trainable ? 0 : 1;
    std::string s = "freeze: " + count(cfg_.freeze ? cfg_.freeze->size() : 0, "pattern") + ", " +
                    count(std::size_t(frozen_tensors_), "tensor");
    if (buffers > 0) s += " (" + std::to_string(buffers) + (buffers == 1 ? " of them a buffer)" : " of them buffers)");
    return s + ", " + mom::detail::with_commas(frozen_params_) + " of " + mom::detail::with_commas(card_.params) +
           " parameters frozen, " + mom::detail::with_commas(trainable_params()) + " trainable";
  }

  // Optional evaluation hooks (mom-train uses them to collect routing statistics): called after each
  // validation forward with the model, and after each validation with the step.
  std::function<void(Instance&)> on_eval_forward;
  std::function<void(index_t step)> on_eval_done;

  // Mean cross-entropy over cfg.eval_batches fixed validation micro-batches (the same windows every time;
  // the routers' and modules' auxiliary losses are left out, so architectures compare on the same measure).
  // With several ranks, rank r runs batches r, r + N, ...; the per-batch losses are gathered (a sum in which
  // each entry has one non-zero term) and summed in batch order on every rank, as one process sums them.
  // on_eval_forward sees this rank's batches only; on_eval_done runs on every rank (to reduce what it gathered).
  double evaluate() {
    MOM_CHECK(val_ != nullptr, "Trainer::evaluate: no validation data");
    if (ranks_ > 1) {
      std::vector<double> per_batch(std::size_t(cfg_.eval_batches), 0.0);
      for (index_t i = rank_; i < cfg_.eval_batches; i += ranks_) {
        eval_batch(*val_, cfg_.batch, cfg_.seq, i, inputs_, targets_);
        model_.forward_async(inputs_, targets_, cfg_.batch, cfg_.seq);
        per_batch[std::size_t(i)] = double(model_.cross_entropy());
        if (on_eval_forward) on_eval_forward(model_);
      }
      comm_->allreduce_sum(std::span<double>(per_batch));
      double sum = 0;
      for (const double l : per_batch) sum += l;
      return sum / double(cfg_.eval_batches);
    }
    double sum = 0;
    for (index_t i = 0; i < cfg_.eval_batches; ++i) {
      eval_batch(*val_, cfg_.batch, cfg_.seq, i, inputs_, targets_);
      model_.forward_async(inputs_, targets_, cfg_.batch, cfg_.seq);
      sum += double(model_.cross_entropy());  // the auxiliary losses are not part of the validation loss
      if (on_eval_forward) on_eval_forward(model_);
    }
    return sum / double(cfg_.eval_batches);
  }

  // One optimizer step (accum micro-batches). Returns the mean training loss. Everything is enqueued on
  // the backend and the host reads back once, at the end ({grad norm, loss}): on a GPU the step has no
  // host-device synchronisation inside it.
  //
  // Divergence: a step with a non-finite loss or gradient norm, or a gradient whose square would overflow
  // the second moment (cpu::adamw_skips), is skipped by AdamW itself (backend contract): parameters and
  // moments stay as they were. The step still counts (its data is consumed, the schedule moves on) and
  // last_step_skipped() says so; run() stops after cfg.max_skipped_steps such steps in a row.
  double train_step() {
    auto& be = model_.backend();
    double step_flops = 0;
    model_.zero_grad();
    const std::span<T> loss_sum = step_scalars_.span().subspan(1, 1);
    be.zero(loss_sum);
    {
      // Nothing writes the parameters until AdamW: the backend may read its products' weights from copies made once
      // a step (backend_concept.hpp, KeepsWeightCopies; the CUDA backend's bf16 copies under BF16).
      const WeightCopyWindow<std::remove_cvref_t<decltype(be)>, T> copies(be, std::span<const T>(model_.params()));
      for (index_t a = 0; a < cfg_.accum; ++a) {
        const BatchSlot b = a == 0 && prefetched_ ? slot(current_slot_) : draw_batch();
        prefetched_ = false;
        last_slot_ = current_slot_;  // save()'s check forward runs on the last micro-batch trained on
        trained_ = true;
        model_.forward_async(b.inputs, b.targets, cfg_.batch, cfg_.seq);
        step_flops += micro_batch_flops();
        be.axpy(loss_sum, T(1), model_.loss_data());
        model_.backward();
      }
    }
    if (ranks_ > 1) {
      reduce_step(loss_sum, step_flops);  // gradients, losses and the step's FLOPs summed over ranks
      be.scale(model_.grads(), T(1) / T(cfg_.accum * ranks_));  // the mean over every rank's micro-batches
    } else if (cfg_.accum > 1) {
      be.scale(model_.grads(), T(1) / T(cfg_.accum));  // the mean over micro-batches
    }
    // Buffers with an update rule of their own (DeepSeekMoE's selection bias, from the expert loads its
    // backward summed into the buffer's gradient slot over the micro-batches and ranks; routers/affinity.hpp).
    model_.update_buffers();
    // Frozen tensors' gradients are zeroed: they do not count in the norm (nor in clipping), and the gradient
    // the step leaves behind is the one AdamW saw.
    for (const auto& g : groups_)
      if (g.frozen) be.zero(model_.grads().subspan(std::size_t(g.begin), std::size_t(g.end - g.begin)));
    be.grad_norm(std::span<const T>(model_.grads()), step_scalars_.data());
    // norm += 0 · loss: unchanged for a finite loss, NaN for an inf or NaN one, so AdamW skips a step
    // whose loss diverged even where the gradients happen to stay finite, still without a host sync.
    be.axpy(step_scalars_.span().first(1), T(0), std::span<const T>(loss_sum));
    ++step_;
    last_step_flops_ = step_flops;
    flops_done_ += step_flops;
    if (step_ <= cfg_.warmup) flops_at_warmup_ = flops_done_;
    const double lr = learning_rate(cfg_, step_, flops_done_, flops_at_warmup_);
    for (const auto& g : groups_) {
      if (g.frozen) continue;  // no update, no weight decay, moments untouched
      const auto n = static_cast<std::size_t>(g.end - g.begin);
      const auto at = static_cast<std::size_t>(g.begin);
      cpu::AdamWConfig opt{.lr = lr, .beta1 = cfg_.beta1, .beta2 = cfg_.beta2, .eps = cfg_.eps,
                           .weight_decay = g.decay ? cfg_.weight_decay : 0.0};
      be.adamw_step(model_.params().subspan(at, n), std::span<const T>(model_.grads()).subspan(at, n),
                    m_.span().subspan(at, n), v_.span().subspan(at, n), opt, step_, step_scalars_.data(),
                    T(cfg_.grad_clip));
    }
    // The next step's first micro-batch is drawn (and its host -> device copy can start) while the device
    // still runs this one; the host waits only in the read below.
    if (!finished()) prefetch();
    T host[2];
    be.to_host(std::span<T>(host, 2), std::span<const T>(step_scalars_.span()));
    if (ranks_ > 1 && comm_->reduces_device_memory()) {  // the loss was summed on the device; agree on stopping
      global_loss_sum_ = double(host[1]);
      double stop = stop_requested.load() ? 1.0 : 0.0;
      comm_->allreduce_sum(std::span<double>(&stop, 1));
      stop_agreed_ = stop > 0;
    }
    const double loss = ranks_ > 1 ? global_loss_sum_ / double(cfg_.accum * ranks_) : double(host[1]) / double(cfg_.accum);
    last_skipped_ = cpu::adamw_skips(host[0], T(cfg_.grad_clip));
    last_lr_ = lr;
    last_grad_norm_ = double(host[0]);
    return loss;
  }
  // Forward + backward FLOPs of the last step over every micro-batch and rank ("flops" in metrics.jsonl): on a
  // host-memory backend as run (realised_training_flops: a routed model's realised routing, read back after each
  // forward; this rank's micro-batches counted for every rank), on a device backend the cost model's figure
  // (ModelCard::training_flops: reading the routing back would wait for the device inside the step).
  double last_step_flops() const { return last_step_flops_; }
  static constexpr bool counts_realised_flops = host_memory<typename Instance::backend_type>;
  bool last_step_skipped() const { return last_skipped_; }
  // The global gradient L2 norm of the last step (the trainable tensors' gradients only), before clipping.
  double last_grad_norm() const { return last_grad_norm_; }

  // Saves a checkpoint of the current state to cfg.out_dir. The parameters must still give a finite loss
  // (checked on the last training micro-batch, one forward) and the Checkpointer refuses non-finite
  // values, so a diverged state never becomes the checkpoint `latest` names.
  std::filesystem::path save() {
    MOM_CHECK(!cfg_.out_dir.empty(), "Trainer::save: no out_dir configured");
    if (step_ > 0) {
      const BatchSlot last = slot(last_slot_);
      const double check = double(model_.forward(last.inputs, last.targets, cfg_.batch, cfg_.seq));
      MOM_CHECK(std::isfinite(check), "training diverged at step ", step_, ": the parameters give a loss of ",
                check, "; no checkpoint written (the last one is kept; try a lower --lr)");
      if (trained_) {  // a batch this process trained on (not the zeros of a slot before the first step)
        const double ce = double(model_.cross_entropy());
        MOM_CHECK(ce <= divergence_bound(), "training diverged at step ", step_, ": the last batch's cross-entropy ",
                  ce, " is above 2 ln(vocab) = ", divergence_bound(), "; no checkpoint written (the last one is kept; "
                  "try a lower --lr)");
      }
    }
    // The sampler as it was before a prefetched batch was drawn: a resumed run draws that batch again.
    TrainState s{step_, prefetched_ ? state_before_prefetch_ : sampler_.state(),
                 cfg_.freeze.value_or(std::vector<std::string>{}), ranks_, flops_done_, flops_at_warmup_};
    return Checkpointer<Instance>::save(cfg_.out_dir, model_, std::span<const T>(m_.span()),
                                        std::span<const T>(v_.span()), s,
                                        {{"mom.arch", cfg_.arch_name},
                                         {"mom.tokenizer", cfg_.tokenizer_name},
                                         {"mom.data", data_record(train_, val_).dump()},
                                         {"mom.config", cfg_.to_json().dump()}});
  }

  // Trains from the current step up to cfg.steps.
  TrainResult run() {
    using clock = std::chrono::steady_clock;
    TrainResult result;
    result.first_step = step_ + 1;
    result.ranks = ranks_;
    const double comm_before = comm_seconds_;
    MetricsLog metrics;
    DirLock lock;  // a second process writing the same run is refused (file_io.hpp)
    if (!cfg_.out_dir.empty() && rank_ == 0) {
      ensure_writable_dir(cfg_.out_dir);  // also removes temporary files a killed writer left behind
      lock = DirLock(cfg_.out_dir);
      clean_run_dir(cfg_.out_dir);        // and half-written step folders
      metrics = MetricsLog(cfg_.out_dir / "metrics.jsonl");
      metrics.write({{"type", "run"}, {"arch", cfg_.arch_name}, {"describe", card_.describe},
                     {"config", cfg_.to_json()}, {"resumed_from", resumed_from_}, {"frozen_tensors", frozen_tensors_},
                     {"frozen_params", frozen_params_}, {"trainable_params", trainable_params()},
                     {"ranks", ranks_}, {"communicator", comm_->name()},
                     {"flops_counted", counts_realised_flops ? "realised" : "cost model"},
                     {"params", double(card_.params)}, {"training_flops_per_token", card_.training_flops_per_token(cfg_.seq)}});
    }
    if (frozen_tensors_ > 0) progress_.message(freeze_summary());
    check_replicas_now();  // the same initialisation (seed) or checkpoint on every rank
    const auto t0 = clock::now();
    auto elapsed = [&] { return std::chrono::duration<double>(clock::now() - t0).count(); };
    const double tokens_per_step = double(cfg_.batch * cfg_.seq * cfg_.accum) * double(ranks_);
    const index_t start_step = step_;
    double overhead = 0;  // seconds spent in validation and checkpoints
    index_t skipped_in_a_row = 0;
    const double start_flops = flops_done_;
    while (!finished()) {
      const double loss = train_step();
      result.losses.push_back(loss);
      // A step whose loss is finite but above divergence_bound() was applied (AdamW skips only non-finite ones),
      // and counts towards the same limit.
      const bool blown_up = !last_skipped_ && loss > divergence_bound();
      if (last_skipped_ || blown_up) {
        result.skipped_steps += last_skipped_ ? 1 : 0;
        ++skipped_in_a_row;
        char warn[200];
        std::snprintf(warn, sizeof warn, "step %6lld | %s: loss %g, gradient norm %g", static_cast<long long>(step_),
                      last_skipped_ ? "skipped (not applied)" : "diverging (above 2 ln(vocab))", loss, last_grad_norm_);
        progress_.message(warn);
        MOM_CHECK(skipped_in_a_row < cfg_.max_skipped_steps, "training diverged: ", skipped_in_a_row,
                  " steps in a row (to step ", step_, ") had a non-finite loss or gradients (skipped) or a loss above "
                  "2 ln(vocab) = ", divergence_bound(), "; the last checkpoint is kept (try a lower --lr or --grad-clip 1)");
      } else {
        skipped_in_a_row = 0;
      }
      const double secs = elapsed();
      const double done = double(step_ - start_step);
      const double tok_s = done * tokens_per_step / std::max(secs - overhead, 1e-9);  // training time only
      const double eta = cfg_.flops_budget > 0 && flops_done_ > start_flops
                             ? secs / (flops_done_ - start_flops) * std::max(cfg_.flops_budget - flops_done_, 0.0)
                             : secs / done * double(cfg_.steps - step_);
      char line[256];
      std::snprintf(line, sizeof line, "step %6lld/%lld | loss %.4f | lr %.3e | grad %.3f | %.0f tok/s | %s elapsed, ETA %s",
                    static_cast<long long>(step_), static_cast<long long>(cfg_.steps), loss, last_lr_,
                    last_grad_norm_, tok_s, format_duration(secs).c_str(), format_duration(eta).c_str());
      progress_.status(static_cast<long>(step_), line, finished() || step_ == start_step + 1);
      metrics.write({{"type", "train"}, {"step", step_}, {"loss", json_number(loss)}, {"lr", last_lr_},
                     {"grad_norm", json_number(last_grad_norm_)}, {"skipped", last_skipped_},
                     {"tokens", double(step_) * tokens_per_step}, {"tok_per_s", tok_s}, {"elapsed_s", secs},
                     {"flops", last_step_flops_}});
      result.training_flops += last_step_flops_;
      const bool last = finished();
      const double before_bookkeeping = elapsed();
      if (val_ && ((cfg_.eval_interval > 0 && step_ % cfg_.eval_interval == 0) || last)) {
        const double vl = evaluate();
        MOM_CHECK(std::isfinite(vl) && vl <= divergence_bound(), "training diverged at step ", step_,
                  ": validation loss is ", vl, vl > divergence_bound() ? " (above 2 ln(vocab) = " + std::to_string(
                  divergence_bound()) + ")" : std::string(), "; no checkpoint written (the last one is kept; try a "
                  "lower --lr)");
        result.final_val_loss = vl;
        char vline[160];
        std::snprintf(vline, sizeof vline, "step %6lld | val loss %.4f | val ppl %.3f", static_cast<long long>(step_),
                      vl, std::exp(vl));
        progress_.message(vline);
        metrics.write({{"type", "val"}, {"step", step_}, {"loss", vl}, {"ppl", std::exp(vl)}, {"elapsed_s", elapsed()}});
        if (on_eval_done) on_eval_done(step_);
      }
      // Several ranks stop together, at the step where any of them was asked to (reduced in train_step).
      const bool stop = (ranks_ > 1 ? stop_agreed_ : stop_requested.load()) && !last;
      if (stop) {
        result.interrupted = true;
        progress_.message("step " + std::to_string(step_) + " | interrupted");
      }
      const bool checkpoint = !cfg_.out_dir.empty() && cfg_.save_checkpoints &&
          ((cfg_.checkpoint_interval > 0 && step_ % cfg_.checkpoint_interval == 0) || last || stop);
      if (checkpoint || last || stop || (replica_check_interval > 0 && step_ % replica_check_interval == 0))
        check_replicas_now();
      if (checkpoint && rank_ == 0) {  // rank 0 writes; the others hold the same state (just checked)
        const auto dir = save();
        progress_.message("step " + std::to_string(step_) + " | checkpoint " + dir.string());
      }
      overhead += elapsed() - before_bookkeeping;
      if (stop) break;
    }
    progress_.finish();
    result.last_step = step_;
    result.seconds = elapsed();
    result.tokens_per_second = double(step_ - start_step) * tokens_per_step / std::max(result.seconds - overhead, 1e-9);
    result.train_seconds = std::max(result.seconds - overhead, 0.0);
    result.comm_seconds = comm_seconds_ - comm_before;
    return result;
  }

  // A finite blow-up is divergence too: a cross-entropy above twice that of guessing uniformly over the
  // vocabulary, 2 ln(vocab) (a fresh model starts near ln(vocab)), stops the run at a validation, and a save
  // refuses such parameters, so `latest` never names them and retention never deletes the last sane checkpoint.
  double divergence_bound() const { return 2.0 * std::log(double(card_.dims.vocab)); }

  std::span<const T> adam_m() const { return m_.span(); }
  std::span<const T> adam_v() const { return v_.span(); }
  const TrainConfig& config() const { return cfg_; }

 private:
  struct Group {
    index_t begin, end;
    bool decay, frozen;
  };

  // A micro-batch's tokens and targets in one staging slot (host memory the backend copies from fastest:
  // pinned on CUDA, so forward_async's copy to the device does not hold the host). Slots rotate: a slot is
  // written again accum + 1 micro-batches later, after the read that ends the step that used it, so its copy
  // to the device has completed.
  struct BatchSlot {
    std::span<token_t> inputs, targets;
  };
  BatchSlot slot(std::size_t i) {
    const std::span<token_t> all = slots_[i].span();
    const std::size_t n = all.size() / 2;
    return {all.first(n), all.subspan(n)};
  }
  // The sampler's next micro-batch, into the next slot.
  BatchSlot draw_batch() {
    current_slot_ = (current_slot_ + 1) % slots_.size();
    const BatchSlot b = slot(current_slot_);
    sampler_.next(b.inputs, b.targets);
    return b;
  }
  void prefetch() {
    state_before_prefetch_ = sampler_.state();
    draw_batch();
    prefetched_ = true;
  }

  // The optimizer's grouping under `patterns` (freeze_mask, which refuses a pattern that matches nothing):
  // contiguous runs of layout tensors that share a weight-decay setting and frozen-ness, one AdamW pass each
  // (none for a frozen run). Called by the constructor and by resume(), never inside a step.
  void apply_freeze(const std::vector<std::string>& patterns) {
    frozen_ = freeze_mask(card_.layout, patterns);
    groups_.clear();
    frozen_params_ = frozen_tensors_ = 0;
    for (std::size_t i = 0; i < frozen_.size(); ++i) {
      const auto& p = card_.layout[i];
      const bool decay = p.rows > 1 && p.cols > 1;
      if (frozen_[i]) frozen_params_ += p.size(), ++frozen_tensors_;
      if (!groups_.empty() && groups_.back().decay == decay && groups_.back().frozen == frozen_[i] &&
          groups_.back().end == p.offset)
        groups_.back().end = p.offset + p.size();
      else
        groups_.push_back({p.offset, p.offset + p.size(), decay, bool(frozen_[i])});
    }
  }

  // Several ranks: sums this rank's gradients and summed micro-batch losses with every other rank's (the
  // Communicator's rank-order sum: the same bits everywhere), and agrees on stopping. A backend whose buffers
  // are not host memory is reduced on the device by a communicator that can (NCCL), else staged through the host.
  // step_flops: this rank's FLOPs of the step in, every rank's out (the same on every rank, so is the schedule).
  void reduce_step(std::span<T> loss_sum, double& step_flops) {
    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    auto& be = model_.backend();
    if constexpr (!host_memory<typename Instance::backend_type> && std::is_same_v<T, float>) {
      if (comm_->reduces_device_memory()) {  // NCCL: gradients and the loss summed on the device's stream, no wait
        step_flops *= double(ranks_);  // a device backend counts the cost model's figure: the same on every rank
        comm_->allreduce_sum_device(model_.grads());
        comm_->allreduce_sum_device(loss_sum);  // AdamW skips a step whose loss diverged on any rank
        comm_seconds_ += std::chrono::duration<double>(clock::now() - t0).count();
        return;  // the stop request is agreed on after the step's read (train_step)
      }
    }
    T local_loss;
    be.to_host(std::span<T>(&local_loss, 1), std::span<const T>(loss_sum));
    double scalars[3] = {double(local_loss), stop_requested.load() ? 1.0 : 0.0, step_flops};
    comm_->allreduce_sum(std::span<double>(scalars, 3));
    global_loss_sum_ = scalars[0];
    stop_agreed_ = scalars[1] > 0;
    step_flops = scalars[2];
    const T global_loss = T(scalars[0]);
    be.from_host(loss_sum, std::span<const T>(&global_loss, 1));  // AdamW skips a step whose loss diverged anywhere
    if constexpr (host_memory<typename Instance::backend_type>) {  // (backend/backend_concept.hpp)
      comm_->allreduce_sum(model_.grads());
    } else {
      staging_.resize(model_.grads().size());
      be.to_host(std::span<T>(staging_), std::span<const T>(model_.grads()));
      comm_->allreduce_sum(std::span<T>(staging_));
      be.from_host(model_.grads(), std::span<const T>(staging_));
    }
    comm_seconds_ += std::chrono::duration<double>(clock::now() - t0).count();
  }

  // Collective (every rank calls it at the same points): the parameters are identical on every rank.
  void check_replicas_now() {
    if (ranks_ == 1) return;
    std::vector<T> host(model_.params().size());
    model_.backend().to_host(std::span<T>(host), std::span<const T>(model_.params()));
    check_replicas(*comm_, card_.layout, std::span<const T>(host), step_);
  }

  // Validates the configuration against the model and the data; returns it for the member initialisers.
  static const TrainConfig& check_config(const ModelCard& card, const TrainConfig& c, const TokenFile& train,
                                         const TokenFile* val) {
    c.check();
    MOM_CHECK(c.seq <= card.dims.context, "seq ", c.seq, " exceeds the model's context ", card.dims.context);
    MOM_CHECK(train.vocab() <= card.dims.vocab, "data file '", train.path().string(), "' has vocab ", train.vocab(),
              " (", train.tokenizer(), ") but the model's vocab is ", card.dims.vocab);
    if (val) {
      MOM_CHECK(val->vocab() <= card.dims.vocab, "validation file '", val->path().string(), "' has vocab ",
                val->vocab(), " but the model's vocab is ", card.dims.vocab);
      MOM_CHECK(val->size() >= c.seq + 1, "validation file '", val->path().string(), "' has ", val->size(),
                " tokens, fewer than seq + 1 = ", c.seq + 1);
    }
    return c;
  }

  Instance& model_;
  const ModelCard& card_;
  const TokenFile& train_;
  const TokenFile* val_;
  TrainConfig cfg_;
  SingleProcess single_;
  Communicator* comm_;
  int rank_, ranks_;
  BatchSampler sampler_;
  Progress progress_;
  typename Instance::backend_type::template Buffer<T> m_, v_, step_scalars_;
  std::vector<typename Instance::backend_type::template HostBuffer<token_t>> slots_;  // BatchSlot
  std::size_t current_slot_ = 0, last_slot_ = 0;
  bool prefetched_ = false;            // slots_[current_slot_] holds the next step's first micro-batch
  bool trained_ = false;               // a step has run (slots_[last_slot_] holds the tokens it trained on)
  std::string state_before_prefetch_;  // the sampler's state before that batch was drawn
  std::vector<token_t> inputs_, targets_;  // validation batches
  std::vector<Group> groups_;
  std::vector<bool> frozen_;
  index_t step_ = 0;
  index_t resumed_from_ = 0;
  index_t frozen_params_ = 0, frozen_tensors_ = 0;
  bool last_skipped_ = false;
  double last_lr_ = 0, last_grad_norm_ = 0, last_step_flops_ = 0;
  double flops_done_ = 0, flops_at_warmup_ = 0;  // training FLOPs of every step so far, and of the warm-up's
  double micro_batch_flops() {
    if constexpr (counts_realised_flops) return realised_training_flops(model_);
    else return card_.training_flops(cfg_.batch, cfg_.seq);
  }
  double global_loss_sum_ = 0, comm_seconds_ = 0;  // several ranks: the step's summed losses, time reducing
  bool stop_agreed_ = false;
  std::vector<T> staging_;  // several ranks on a device backend: the gradients' host copy
};

}  // namespace mom::train

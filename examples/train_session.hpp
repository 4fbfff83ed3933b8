// The part of mom-train's work that does not depend on the architecture, compiled once per backend: a training
// run's checks, data and loop (TrainSession), loading and evaluating a checkpoint. It works on the model through
// mom::AnyModel<Be> (models/any_model.hpp), so the family units (arch_<family>_<backend>.cpp) instantiate only
// what is the architecture's own (its forward and backward, its warm start, statistics and decoding), and the
// Trainer, the Checkpointer and everything here are compiled once per backend, in the generated unit
// session.cpp (train_session_impl.hpp; examples/CMakeLists.txt). This file only declares them.
#pragma once

#include <mom/models/any_model.hpp>
#include <mom/train/trainer.hpp>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "architectures.hpp"

namespace mom::examples {

// What a family's code adds to each validation: after every validation forward (statistics of the architecture's
// routing, read from the concrete model) and after each validation (with its step).
struct EvalHooks {
  std::function<void()> on_eval_forward;
  std::function<void(index_t step)> on_eval_done;
};

// One `mom-train` training run, less the model. The constructor checks the request against the architecture
// (its card: context, layout for --freeze, memory) and the output folder (--resume, --init-from, locks), opens
// the backend, prepares the data and prints the run's header — each refusal one line, before any work. The
// model is then made on take_backend(), and train() runs it (a resume first, with r.resume).
template <class Be>
class TrainSession {
 public:
  // twin_describe: describe<DenseTwin>() of a Mixture-of-Modules entry's dense twin (--init-from warm-starts
  // from it); empty for an entry without one.
  TrainSession(const ArchEntry& arch, const TrainRequest& r, const ModelCard& card, std::string twin_describe);
  ~TrainSession();
  TrainSession(const TrainSession&) = delete;
  TrainSession& operator=(const TrainSession&) = delete;

  Be take_backend();
  const train::TrainConfig& config() const;
  bool rank0() const;
  const train::TokenFile* validation() const;  // null without a validation split
  // With --init-from a checkpoint of this architecture itself (fine-tuning): loads its parameters into `model` and
  // returns true; false when --init-from names the dense twin (the caller warm-starts from it).
  bool init_from_own(AnyModel<Be>& model);
  // Resumes (r.resume) and trains `model`; prints the summary lines (tokens/s, skipped steps, final loss).
  train::TrainResult train(AnyModel<Be>& model, EvalHooks hooks);
  // The tokenizer the end-of-training sample decodes with (null when r.sample_tokens is 0).
  train::Tokenizer* sample_tokenizer();

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// The parameters of a checkpoint (run dir or step folder) of this architecture, into `model` (train::Checkpointer
// ::load_params); the model file's metadata.
template <class Be>
std::map<std::string, std::string> load_params(const std::filesystem::path& checkpoint, AnyModel<Be>& model);

struct EvalRequest;  // evaluate.hpp
// `mom-train eval`: the checkpoint r.checkpoint into `model`, its validation loss on r.data, printed.
template <class Be>
int evaluate_checkpoint(const EvalRequest& r, AnyModel<Be>& model);

}  // namespace mom::examples

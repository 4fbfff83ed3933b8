// mom-train: trains a named architecture on a text (or prepared token files) with the bundled Trainer, and
// mom-train sample / mom-sample: prints text generated from a checkpoint.
//
//   mom-train --data data/kjv.txt --arch tiny --steps 2000 --out runs/kjv      # train (Ctrl-C saves)
//   mom-train --data data/kjv.txt --arch tiny --steps 4000 --out runs/kjv --resume
//   mom-sample --checkpoint runs/kjv --prompt "And God said" --tokens 300
//   mom-train eval --checkpoint runs/kjv --data data/kjv.txt                  # validation loss of a checkpoint
//   mom-train prune --checkpoint runs/mf8 --data data/kjv.txt --tau 0.3 --into moduleformer8-c6-12 --out runs/mf8-p
//
// Two-phase training of a Mixture-of-Modules model (paper §3.4): phase 1 trains the dense twin, phase 2
// warm-starts the MoM model from it (routers freshly initialised) and trains on:
//   mom-train --data data/kjv.txt --arch dense8 --steps 300 --out runs/dense8
//   mom-train --data data/kjv.txt --arch mom8-p --steps 300 --out runs/mom8p --init-from runs/dense8
// A routed model also writes its routing statistics at each validation: <out>/routing.json (the latest),
// <out>/routing/step-NNNNNN.json and .csv (scripts/plot_routing.py draws them).
//
// Every error (missing / empty / binary data, unknown architecture, seq > context, an output directory that
// cannot be written, a checkpoint that would be overwritten) is one line on stderr and exit status 1.
#include "train_model.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <thread>

namespace mom::examples {

namespace {
struct Family {
  int order;
  DeviceKind kind;
  FamilyEntries entries;
};
std::vector<Family>& families() {
  static std::vector<Family> f;
  return f;
}
}  // namespace

bool register_family(int order, DeviceKind kind, FamilyEntries entries) {
  families().push_back({order, kind, entries});
  return true;
}

// The families in their listing order, each backend's entries merged by name into one entry per architecture.
const std::vector<ArchEntry>& registry() {
  static const std::vector<ArchEntry> archs = [] {
    auto fams = families();
    std::stable_sort(fams.begin(), fams.end(), [](const Family& a, const Family& b) {
      return a.order != b.order ? a.order < b.order : int(a.kind) < int(b.kind);
    });
    std::vector<ArchEntry> v;
    for (const Family& f : fams)
      for (ArchEntry& a : f.entries()) {
        auto same = std::find_if(v.begin(), v.end(), [&](const ArchEntry& e) { return e.name == a.name; });
        if (same == v.end()) {
          v.push_back(std::move(a));
        } else {
          MOM_CHECK(same->describe == a.describe, "internal: architecture '", a.name, "' registered as two types");
          same->code[int(f.kind)] = std::move(a.code[int(f.kind)]);
        }
      }
    return v;
  }();
  return archs;
}

}  // namespace mom::examples

namespace {

using namespace mom;
using namespace mom::examples;

std::string architectures_help() {
  std::string s = "Architectures (--arch):\n";
  for (const auto& a : registry())
    s += "  " + a.name + " (" + a.note + ")\n      " + a.describe +
         (a.kv_decode ? "; samples with the KV cache" : "; samples by a forward over the window per token") + "\n";
  return s;
}

extern "C" void on_interrupt(int) { train::stop_requested.store(true); }

// --help / --version print as CLI11 does (exit 0); a bad command line is one line on stderr, exit 1, like
// every other error of these tools.
int parse_error(const CLI::App& app, const CLI::ParseError& e, const std::string& prog) {
  if (e.get_exit_code() == 0) return app.exit(e);
  std::fprintf(stderr, "%s: error: %s\n", prog.c_str(), e.what());
  return 1;
}

// The value checks every subcommand shares (train, eval, prune, sample / mom-sample), applied once all options
// are declared: no option takes an empty value (CLI11 would read '' as 0: `--grad-clip ''` would turn clipping off;
// `--freeze ''` is the one meant to be empty), and a seed is a whole number in [0, 2^64 - 1] (CLI11 wraps -1).
// The numeric ranges are TrainConfig::check()'s (train/trainer.hpp), also for eval's and prune's counts.
void check_values(CLI::App& app) {
  const CLI::Validator non_empty(
      [](std::string& v) { return v.empty() ? std::string("an empty value (give one)") : std::string(); }, "", "non-empty");
  const CLI::Validator seed(
      [](std::string& v) {
        const bool digits = !v.empty() && v.size() <= 20 && v.find_first_not_of("0123456789") == std::string::npos;
        return digits && (v.size() < 20 || v <= "18446744073709551615")
                   ? std::string()
                   : "'" + v + "' is not a seed (a whole number in [0, 18446744073709551615])";
      },
      "", "seed");
  for (CLI::Option* o : app.get_options()) {
    if (o->get_type_size() == 0 || o->get_name() == "--freeze") continue;  // flags; --freeze '' unfreezes all
    o->check(non_empty);
    if (o->get_name() == "--seed") o->check(seed);
  }
}

// --device and --precision, on every command; parsed into a Device after the command line (parse_device).
void add_device_options(CLI::App& app, std::string& device, std::string& precision) {
  app.add_option("--device", device, "Where to run: cpu, cuda (GPU 0, or under mpirun the rank's own) or cuda:N")
      ->capture_default_str();
  app.add_option("--precision", precision,
                 "Matrix products in fp32, tf32 or bf16 (bf16: fp32 master weights, optimizer state and reductions); "
                 "default fp32 on the CPU (its only one), tf32 on CUDA");
}

// The architecture a checkpoint names (mom.arch).
const ArchEntry& checkpoint_architecture(const std::filesystem::path& checkpoint) {
  const auto dir = train::resolve_checkpoint(checkpoint);
  train::safetensors::File f(dir / "model.safetensors");
  const auto it = f.metadata().find("mom.arch");
  MOM_CHECK(it != f.metadata().end(), "checkpoint '", dir.string(), "' does not name its architecture (mom.arch)");
  const ArchEntry* arch = find_architecture(it->second);
  MOM_CHECK(arch != nullptr, "checkpoint '", dir.string(), "' is of architecture '", it->second,
            "' which this build does not know (known: ", architecture_names(), ")");
  return *arch;
}

int run_sample(int argc, char** argv, const std::string& prog) {
  CLI::App app{"Print text generated by a model trained with mom-train.", prog};
  SampleRequest r;
  r.repo_root = repo_root();
  app.add_option("-c,--checkpoint", r.checkpoint, "Run directory (uses its 'latest') or a step folder")->required();
  app.add_option("-p,--prompt", r.prompt, "Text to continue")->capture_default_str();
  app.add_option("-n,--tokens", r.tokens, "Tokens to generate")->capture_default_str();
  app.add_option("-t,--temperature", r.temperature, "Sampling temperature; 0 = greedy")->capture_default_str();
  app.add_option("-k,--top-k", r.top_k, "Sample among the k most likely tokens; 0 = all")->capture_default_str();
  app.add_option("--top-p", r.top_p, "Then among the most likely tokens holding this much probability (nucleus); 1 = all")
      ->capture_default_str();
  app.add_option("-s,--seed", r.seed, "Sampling seed")->capture_default_str();
  std::string device = "cpu", precision;
  add_device_options(app, device, precision);
  check_values(app);
  app.footer(architectures_help());
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return parse_error(app, e, prog);
  }
  MOM_CHECK(r.tokens >= 0 && r.tokens <= 100'000'000, "--tokens ", r.tokens, " must be in [0, 100000000]");
  MOM_CHECK(r.top_k >= 0, "--top-k ", r.top_k, " must be >= 0 (0: all tokens)");
  MOM_CHECK(std::isfinite(r.temperature) && r.temperature >= 0, "--temperature ", r.temperature,
            " must be a finite number >= 0 (0: greedy)");
  MOM_CHECK(std::isfinite(r.top_p) && r.top_p > 0 && r.top_p <= 1, "--top-p ", r.top_p, " must be in (0, 1]");
  r.device = parse_device(device, precision);
  std::cout << checkpoint_architecture(r.checkpoint).on(r.device).sample(r) << std::endl;
  return 0;
}

void add_eval_options(CLI::App& app, EvalRequest& r, std::string& checkpoint, std::string& data, std::string& device,
                      std::string& precision) {
  app.add_option("-c,--checkpoint", checkpoint, "Run directory (uses its 'latest') or a step folder")->required();
  app.add_option("-d,--data", data, "UTF-8 text (its tail --val-fraction is read), or a folder with val.bin")->required();
  app.add_option("--val-fraction", r.val_fraction, "Tail of a text held out for validation")->capture_default_str();
  app.add_option("-b,--batch", r.batch, "Sequences per forward")->capture_default_str();
  app.add_option("--seq", r.seq, "Tokens per sequence (<= the architecture's context)")->capture_default_str();
  app.add_option("--batches", r.batches, "Forwards (fixed validation windows, as mom-train validates)")->capture_default_str();
  add_device_options(app, device, precision);
}
void check_eval_request(EvalRequest& r, const std::string& checkpoint, const std::string& data, const std::string& device,
                        const std::string& precision) {
  MOM_CHECK(r.batch > 0 && r.batches > 0 && r.seq > 0, "--batch, --batches and --seq must be > 0");
  train::TrainConfig ranges;  // training's bounds: batch x seq within token ids, at most 10^9 batches
  ranges.batch = r.batch;
  ranges.seq = r.seq;
  ranges.eval_batches = r.batches;
  ranges.check();
  MOM_CHECK(std::isfinite(r.val_fraction) && r.val_fraction > 0 && r.val_fraction < 1, "--val-fraction ",
            r.val_fraction, " must be in (0, 1)");
  r.checkpoint = checkpoint;
  r.data = data;
  r.repo_root = repo_root();
  r.device = parse_device(device, precision);
}

int run_eval(int argc, char** argv, const std::string& prog) {
  CLI::App app{"Print a checkpoint's validation loss on a text (cross-entropy, nats/token).", prog};
  EvalRequest r;
  std::string checkpoint, data, device = "cpu", precision;
  add_eval_options(app, r, checkpoint, data, device, precision);
  check_values(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return parse_error(app, e, prog);
  }
  check_eval_request(r, checkpoint, data, device, precision);
  return checkpoint_architecture(r.checkpoint).on(r.device).evaluate(r);
}

int run_prune(int argc, char** argv, const std::string& prog) {
  CLI::App app{"Prune a ModuleFormer checkpoint's least-used modules (arXiv 2306.04640 §5.3): usage over validation "
               "windows, normalised by each layer's maximum, modules below --tau masked; --into compacts them into a "
               "smaller registered architecture.", prog};
  PruneRequest r;
  std::string checkpoint, data, out, device = "cpu", precision;
  add_eval_options(app, r.eval, checkpoint, data, device, precision);
  app.add_option("--tau", r.tau, "Threshold on the normalised usage, in [0, 1]")->capture_default_str();
  app.add_option("--into", r.into, "Compact into this architecture (e.g. moduleformer8-c6-12)");
  app.add_option("-o,--out", out, "Write the pruned checkpoint here (a new run directory)");
  check_values(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return parse_error(app, e, prog);
  }
  check_eval_request(r.eval, checkpoint, data, device, precision);
  MOM_CHECK(std::isfinite(r.tau) && r.tau >= 0 && r.tau <= 1, "--tau ", r.tau, " must be in [0, 1]");
  r.out = out;
  MOM_CHECK(r.out.empty() || !train::has_checkpoint(r.out), "--out '", out, "' already holds a checkpoint");
  const ArchEntry& arch = checkpoint_architecture(r.eval.checkpoint);
  MOM_CHECK(arch.prunable, "architecture '", arch.name, "' has no modules to prune (ModuleFormer models do)");
  return arch.on(r.eval.device).prune(r);
}

int run_train(int argc, char** argv, const std::string& prog, train::Communicator& comm) {
  CLI::App app{"Train a language model of the mom library on a text, with checkpoints and resume.", prog};
  TrainRequest r;
  auto& c = r.cfg;
  c.steps = 1200;
  c.batch = 16;
  c.seq = 128;
  c.lr = 2e-3;
  c.warmup = 50;
  c.eval_interval = 100;
  c.eval_batches = 16;
  c.checkpoint_interval = 200;
  c.out_dir = "runs/default";
  std::string arch_name = "tiny", out = c.out_dir.string(), data = r.data.string();
  int threads = 0;
  std::string device = "cpu", precision;
  app.add_option("-d,--data", data,
                 "UTF-8 text file (tokenized into <out>/data), a folder with train.bin/val.bin, or a token file")
      ->capture_default_str();
  app.add_option("-a,--arch", arch_name, "ArchEntry name (listed below)")->capture_default_str();
  app.add_option("--tokenizer", r.tokenizer, "byte or gpt2 (default: the architecture's)");
  app.add_option("--val-fraction", r.val_fraction, "Tail of the text held out for validation")->capture_default_str();
  app.add_option("-n,--steps", c.steps, "Optimizer steps in total")->capture_default_str();
  app.add_option("-b,--batch", c.batch, "Sequences per micro-batch")->capture_default_str();
  app.add_option("--seq", c.seq, "Tokens per sequence (<= the architecture's context)")->capture_default_str();
  app.add_option("--accum", c.accum, "Micro-batches per optimizer step (gradient accumulation)")->capture_default_str();
  app.add_option("--lr", c.lr, "Peak learning rate")->capture_default_str();
  app.add_option("--min-lr-ratio", c.min_lr_ratio, "Cosine floor as a fraction of --lr")->capture_default_str();
  app.add_option("--warmup", c.warmup, "Linear warm-up steps")->capture_default_str();
  app.add_option("--weight-decay", c.weight_decay, "AdamW weight decay (matrices only)")->capture_default_str();
  app.add_option("--grad-clip", c.grad_clip, "Max global gradient norm; 0 = off")->capture_default_str();
  app.add_option("--seed", c.seed, "Seed of the initialisation and the data sampler")->capture_default_str();
  app.add_option("-o,--out", out, "Output directory: checkpoints, metrics.jsonl, prepared data")->capture_default_str();
  app.add_flag("--resume", r.resume, "Continue the checkpoint in --out");
  std::string init_from;
  app.add_option("--init-from", init_from,
                 "Phase 2 (MoM archs): warm-start from a checkpoint of the dense twin (run dir, step folder or "
                 "model.safetensors, also a Hugging Face GPT-2 one); routers start fresh");
  std::vector<std::string> freeze;
  app.add_option("--freeze", freeze,
                 "Tensors that do not train (fine-tuning): comma-separated glob patterns over the parameter names, "
                 "e.g. 'wte,h.*.attn.*' ('*' matches any characters, dots included, '?' one; may be repeated). "
                 "With --resume the default is the checkpoint's; --freeze '' trains every tensor (docs/training.md)");
  app.add_option("--eval-interval", c.eval_interval, "Validate every N steps (0: only at the end)")->capture_default_str();
  app.add_option("--eval-batches", c.eval_batches, "Micro-batches per validation")->capture_default_str();
  app.add_option("--checkpoint-interval", c.checkpoint_interval, "Save every N steps (0: only at the end)")
      ->capture_default_str();
  app.add_option("--flops-budget", c.flops_budget,
                 "Stop once the steps' training FLOPs reach this (realised routing counted on the CPU; the cosine "
                 "then runs over the FLOPs, --steps is the cap): equal-compute comparisons (scripts/compare.py)")
      ->capture_default_str();
  bool no_checkpoint = false;
  app.add_flag("--no-checkpoint", no_checkpoint,
               "Write no checkpoint (metrics.jsonl, statistics and the sample only): quick comparisons; such a run "
               "cannot be resumed or sampled later");
  app.add_option("--log-interval", c.log_interval, "Progress line every N steps when not on a terminal")
      ->capture_default_str();
  app.add_option("--threads", threads, "OpenMP threads (default: OMP_NUM_THREADS or all cores)");
  app.add_option("--collective-timeout", r.collective_timeout,
                 "Under mpirun: seconds a rank may wait for the others in one collective once training starts "
                 "before it ends the job (a stopped or hung rank); 0: no limit")
      ->capture_default_str();
  add_device_options(app, device, precision);
  app.add_option("--sample-tokens", r.sample_tokens, "Tokens of text to print after training (0: none)")
      ->capture_default_str();
  app.add_option("--prompt", r.prompt, "Prompt of that sample")->capture_default_str();
  app.add_option("--temperature", r.temperature, "Temperature of that sample")->capture_default_str();
  check_values(app);
  app.footer(architectures_help() + "\nAlso: " + prog + " sample --help (or mom-sample) prints text from a checkpoint; " +
             prog + " eval --help its validation loss on a text; " + prog + " prune --help prunes a ModuleFormer's modules.");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return parse_error(app, e, prog);
  }
  const ArchEntry* arch = find_architecture(arch_name);
  MOM_CHECK(arch != nullptr, "unknown architecture '", arch_name, "' (known: ", architecture_names(), ")");
  // Every option in range before any data is prepared or memory allocated.
  c.check();
  const int max_threads = std::max(64, 4 * int(std::thread::hardware_concurrency()));  // OpenMP crashes far above
  MOM_CHECK(threads >= 0 && threads <= max_threads, "--threads ", threads, " must be in [0, ", max_threads,
            "] (0: OMP_NUM_THREADS or all cores)");
  MOM_CHECK(std::isfinite(r.collective_timeout) && r.collective_timeout >= 0 && r.collective_timeout <= 1e6,
            "--collective-timeout ", r.collective_timeout, " must be in [0, 1000000] seconds (0: no limit)");
  MOM_CHECK(std::isfinite(r.val_fraction) && r.val_fraction > 0 && r.val_fraction < 1, "--val-fraction ",
            r.val_fraction, " must be in (0, 1)");
  MOM_CHECK(r.sample_tokens >= 0 && r.sample_tokens <= 100'000'000, "--sample-tokens ", r.sample_tokens,
            " must be in [0, 100000000]");
  MOM_CHECK(std::isfinite(r.temperature) && r.temperature >= 0, "--temperature ", r.temperature,
            " must be a finite number >= 0 (0: greedy)");
  r.data = data;
  r.init_from = init_from;
  r.device = parse_device(device, precision);
  r.seed_given = app.count("--seed") > 0;
  r.tokenizer_given = app.count("--tokenizer") > 0;
  r.val_fraction_given = app.count("--val-fraction") > 0;
  if (app.count("--freeze") > 0) {  // given (even as ''): these patterns; else none, or the checkpoint's on --resume
    c.freeze.emplace();
    for (const auto& list : freeze)
      for (auto& pattern : train::split_patterns(list)) c.freeze->push_back(std::move(pattern));
  }
  c.out_dir = out;
  c.save_checkpoints = !no_checkpoint;
  if (threads > 0) omp_set_num_threads(threads);
  r.comm = &comm;
  std::signal(SIGINT, on_interrupt);
  std::signal(SIGTERM, on_interrupt);
  std::signal(SIGUSR1, on_interrupt);  // mpirun forwards SIGUSR1 to every rank (SIGINT / SIGTERM end the job)
  return arch->on(r.device).train(r);
}

}  // namespace

int main(int argc, char** argv) {
  mom::cpu::limit_openmp_spinning(argv);  // two threads stay as fast as one when another process is busy
  const std::string prog = std::filesystem::path(argv[0]).filename().string();
  // Started by mpirun: one rank of a data-parallel run (docs/distributed.md); rank 0 alone prints.
  std::unique_ptr<mom::train::Communicator> comm;
  std::string who = prog;
  auto fail = [&](const std::string& message) {
    std::fflush(stdout);
    std::fprintf(stderr, "%s: error: %s\n", who.c_str(), message.c_str());
    std::fflush(stderr);
    if (comm && comm->size() > 1) comm->abort(1);  // the other ranks would wait in their next collective
    return 1;
  };
  try {
    comm = mom::train::make_communicator(&argc, &argv);
    if (comm->size() > 1) {
      who += " (rank " + std::to_string(comm->rank()) + " of " + std::to_string(comm->size()) + ")";
      if (comm->rank() != 0) MOM_CHECK(std::freopen("/dev/null", "w", stdout) != nullptr, "cannot silence stdout");
    }
    if (prog == "mom-sample") return run_sample(argc, argv, prog);
    if (argc > 1 && std::string(argv[1]) == "sample") return run_sample(argc - 1, argv + 1, prog + " sample");
    if (argc > 1 && std::string(argv[1]) == "eval") return run_eval(argc - 1, argv + 1, prog + " eval");
    if (argc > 1 && std::string(argv[1]) == "prune") return run_prune(argc - 1, argv + 1, prog + " prune");
    return run_train(argc, argv, prog, *comm);
  } catch (const std::bad_alloc&) {
    return fail("out of memory (lower --batch or --seq)");
  } catch (const std::exception& e) {
    return fail(e.what());
  }
}

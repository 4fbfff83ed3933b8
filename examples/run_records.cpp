// The architecture-independent part of a family unit's work (run_records.hpp) and EvalData's members (evaluate.hpp),
// compiled once for mom-train.
#include "run_records.hpp"

#include "evaluate.hpp"

#include <mom/train/checkpoint.hpp>
#include <mom/train/metrics.hpp>
#include <mom/train/safetensors.hpp>

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cstdio>
#include <vector>

namespace mom::examples {

namespace {
// Several ranks validate different batches: the routing and depth statistics each gathered are summed over
// the ranks before rank 0 writes them (counts as doubles: exact below 2^53).
void reduce_stats(train::Communicator* comm, RoutingStats& routing) {
  if (!comm || comm->size() == 1) return;
  std::vector<double> flat;
  for (const auto& r : routing.routers) {
    flat.push_back(double(r.tokens));
    for (const long long c : r.usage) flat.push_back(double(c));
    for (const long long c : r.transitions) flat.push_back(double(c));
    for (const long long c : r.idle) flat.push_back(double(c));
  }
  comm->allreduce_sum(std::span<double>(flat));
  std::size_t at = 0;
  for (auto& r : routing.routers) {
    r.tokens = static_cast<long long>(flat[at++]);
    for (long long& c : r.usage) c = static_cast<long long>(flat[at++]);
    for (long long& c : r.transitions) c = static_cast<long long>(flat[at++]);
    for (long long& c : r.idle) c = static_cast<long long>(flat[at++]);
  }
}
void reduce_stats(train::Communicator* comm, DepthStats& depth) {
  if (!comm || comm->size() == 1) return;
  std::vector<double> flat{depth.aux_sum, depth.forwards};
  for (const auto& l : depth.layers) flat.insert(flat.end(), {l.run, l.tokens, l.correct, l.bce, l.forwards});
  comm->allreduce_sum(std::span<double>(flat));
  depth.aux_sum = flat[0];
  depth.forwards = flat[1];
  std::size_t at = 2;
  for (auto& l : depth.layers)
    for (double* v : {&l.run, &l.tokens, &l.correct, &l.bce, &l.forwards}) *v = flat[at++];
}
}  // namespace

void write_routing_stats(RoutingStats& routing, const std::filesystem::path& dir, train::Communicator* comm,
                         bool rank0, index_t step) {
  reduce_stats(comm, routing);
  if (!rank0) return routing.clear();
  std::filesystem::create_directories(dir / "routing");
  const std::string stem = (dir / "routing" / train::step_folder_name(step)).string();
  routing.write_json(stem + ".json");
  routing.write_csv(stem);
  routing.write_json((dir / "routing.json").string());
  // Expert usage in metrics.jsonl (issue 18): per router and round, each module's share, their coefficient of
  // variation and the largest share (docs/training.md).
  train::MetricsLog log(dir / "metrics.jsonl");
  for (const auto& r : routing.routers) {
    nlohmann::json rounds = nlohmann::json::array();
    for (int h = 0; h < r.rounds; ++h) {
      const RoutingStats::Load l = RoutingStats::load(r, h);
      rounds.push_back({{"share", l.share}, {"cv", l.cv}, {"max_share", l.max_share}, {"skip_share", l.skip_share},
                        {"idle_share", l.idle_share}});
    }
    log.write({{"type", "routing"}, {"step", step}, {"router", r.name}, {"k", r.k}, {"rounds", rounds}});
  }
  routing.clear();
}

void write_depth_stats(DepthStats& depth, const std::filesystem::path& dir, train::Communicator* comm, bool rank0,
                       index_t step) {
  reduce_stats(comm, depth);
  if (!rank0) return depth.clear();
  // Also in metrics.jsonl (issue 18's usage metrics for every routed family): the same record, "type": "depth".
  const auto record = nlohmann::json::parse(depth.json(step));
  train::MetricsLog(dir / "depth.jsonl").write(record);
  train::MetricsLog(dir / "metrics.jsonl").write(record);
  if (depth.causal_accuracy() >= 0)
    std::printf("step %6lld | causal routing accuracy %.4f (top-C membership)\n", static_cast<long long>(step),
                depth.causal_accuracy());
  depth.clear();
}

void write_causal_eval(const std::filesystem::path& dir, index_t step, double causal_loss, double top_c_loss) {
  std::printf("validation loss with causal routing (autoregressive sampling's routing) %.4f vs top-C %.4f\n",
              causal_loss, top_c_loss);
  train::MetricsLog(dir / "depth.jsonl")
      .write({{"type", "depth_causal_eval"}, {"step", step}, {"val_loss_causal_routing", causal_loss},
              {"val_loss_top_c", top_c_loss}});
}

std::string checkpoint_tokenizer_name(const std::map<std::string, std::string>& meta, index_t model_vocab,
                                      const std::filesystem::path& checkpoint) {
  return train::checkpoint_tokenizer(meta, model_vocab, "checkpoint '" + checkpoint.string() + "'");
}

std::unique_ptr<train::Tokenizer> checkpoint_tokenizer_for(const std::map<std::string, std::string>& meta,
                                                           index_t model_vocab, const std::filesystem::path& checkpoint,
                                                           const std::filesystem::path& repo_root) {
  return train::make_tokenizer(checkpoint_tokenizer_name(meta, model_vocab, checkpoint), repo_root);
}

EvalData::EvalData(const EvalRequest& r, const std::string& tokenizer) {
  namespace fs = std::filesystem;
  MOM_CHECK(fs::exists(r.data), "--data '", r.data.string(), "' does not exist");
  fs::path val;
  if (fs::is_directory(r.data)) {
    val = r.data / "val.bin";
    MOM_CHECK(fs::exists(val), "data folder '", r.data.string(), "' has no val.bin");
  } else if (train::is_token_file(r.data)) {
    val = r.data;
  } else {
    tmp_ = fs::temp_directory_path() / ("mom-eval-" + std::to_string(::getpid()));
    auto tok = train::make_tokenizer(tokenizer, r.repo_root);
    val = train::prepare_text(r.data, tmp_, *tok, r.val_fraction).val;
  }
  file_.emplace(val);
  MOM_CHECK(file_->tokenizer() == tokenizer, "--data '", val.string(), "' was tokenized by '", file_->tokenizer(),
            "' but the checkpoint's tokenizer is '", tokenizer, "'");
}

EvalData::~EvalData() {
  std::error_code ec;
  if (!tmp_.empty()) std::filesystem::remove_all(tmp_, ec);
}

bool read_checkpoint_params(const std::filesystem::path& file, std::span<const ParamInfo> layout,
                            std::span<float> params) {
  const train::safetensors::File f(file);
  if (!f.metadata().count("mom.describe")) return false;  // not ours: a Hugging Face file
  for (const auto& p : layout) {
    const train::safetensors::TensorInfo* t = f.find(p.name);
    MOM_CHECK(t != nullptr && t->shape == (p.rows == 1 ? std::vector<std::int64_t>{p.cols}
                                                        : std::vector<std::int64_t>{p.rows, p.cols}),
              "--init-from: '", file.string(), "': tensor '", p.name, "' is missing or has the wrong shape");
    f.read<float>(p.name, params.subspan(std::size_t(p.offset), std::size_t(p.size())));
  }
  return true;
}

}  // namespace mom::examples

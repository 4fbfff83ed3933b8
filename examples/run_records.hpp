// What a family unit (arch_<family>_<backend>.cpp) reads and writes that does not depend on the architecture:
// the routing and depth statistics of a validation, the causal-routing evaluation's record, a checkpoint's
// tokenizer, a checkpoint's tensors by a model's layout. Declared here, compiled once (run_records.cpp), so the
// family units (one per family and backend) do not each compile the JSON, file and tokenizer code behind them.
#pragma once

#include <mom/core/layout.hpp>
#include <mom/models/depth_stats.hpp>
#include <mom/models/routing_stats.hpp>
#include <mom/train/distributed.hpp>
#include <mom/train/tokenizer.hpp>

#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>

namespace mom::examples {

// After a validation: the statistics gathered over its batches, summed over the ranks (rank 0 writes them),
// then cleared. Routing: <dir>/routing.json, <dir>/routing/step-NNNNNN.{json,csv} and a "routing" record per
// router in metrics.jsonl. Depth: a "depth" record in <dir>/depth.jsonl and metrics.jsonl, and the causal
// routing accuracy printed when the model has a causal method.
void write_routing_stats(RoutingStats& routing, const std::filesystem::path& dir, train::Communicator* comm,
                         bool rank0, index_t step);
void write_depth_stats(DepthStats& depth, const std::filesystem::path& dir, train::Communicator* comm, bool rank0,
                       index_t step);

// Mixture-of-Depths with a causal-sampling method: the validation loss routed by the causal decision beside the
// top-C one, printed and recorded in <dir>/depth.jsonl.
void write_causal_eval(const std::filesystem::path& dir, index_t step, double causal_loss, double top_c_loss);

// The tokenizer a checkpoint was trained with (its model file's metadata `meta`; train::checkpoint_tokenizer),
// checked against the model's vocabulary; `checkpoint` names it in messages. Its name, or the tokenizer itself.
std::string checkpoint_tokenizer_name(const std::map<std::string, std::string>& meta, index_t model_vocab,
                                      const std::filesystem::path& checkpoint);
std::unique_ptr<train::Tokenizer> checkpoint_tokenizer_for(const std::map<std::string, std::string>& meta,
                                                           index_t model_vocab, const std::filesystem::path& checkpoint,
                                                           const std::filesystem::path& repo_root);

// A mom checkpoint's tensors by `layout` into the host array `params` (each tensor present with its shape, else
// one line naming it); false, with nothing read, when the file carries no mom metadata (a Hugging Face file).
bool read_checkpoint_params(const std::filesystem::path& file, std::span<const ParamInfo> layout,
                            std::span<float> params);

}  // namespace mom::examples

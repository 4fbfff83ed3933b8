#pragma once
// One model's rows of bench_decode (CPU, bench/decode.cpp) and bench_gpu_decode (CUDA, bench/gpu_decode.cpp):
// prefill and decode tokens/s at batch 1 and 8, the decoder's memory, the batch-1 step against the time to
// read the weights once at `gbps`, and the recompute loop at batch 1. Where the decoder records its steps as
// CUDA graphs (infer::Decoder::records_graphs), the step is timed replayed (after two warm-up steps: one op by
// op, one recorded) and again op by op. sync(): waits for the backend (the GPU's stream) before a clock stops.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include <mom/mom.hpp>

namespace mom::bench {

using clock_type = std::chrono::steady_clock;
inline double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// The table decode_rows' lines belong to.
inline void decode_table_header() {
  std::printf("| model | context | batch | prefill tok/s | prefill tok/s, passes of `batch` rows | ms per step | "
              "ms per step, op by op | decode tok/s | decoder memory | step / weight-read time |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
}

template <class Instance, class Sync>
void decode_rows(Instance& model, const char* name, index_t context, index_t new_tokens, double gbps, Sync&& sync) {
  using Model = typename Instance::model_type;
  const index_t V = Model::dims.vocab, half = context / 2;
  std::vector<std::vector<token_t>> prompts(8);
  for (std::size_t b = 0; b < prompts.size(); ++b)
    for (index_t t = 0; t < half; ++t) prompts[b].push_back(token_t((t * 7919 + b * 104729) % V));
  const double weight_bytes = double(Model::params) * sizeof(float);
  for (const index_t batch : {index_t(1), index_t(8)}) {
    infer::Decoder dec(model, batch, context);
    const std::span<const std::vector<token_t>> ps(prompts.data(), std::size_t(batch));
    dec.prefill(ps);  // warm-up (first touch of the caches)
    sync();
    auto t0 = clock_type::now();
    dec.prefill(ps);
    sync();
    const double prefill_s = seconds_since(t0);
    double narrow_s = 0;
    {
      infer::Decoder narrow(model, batch, context, batch);
      narrow.prefill(ps);
      sync();
      const auto t1 = clock_type::now();
      narrow.prefill(ps);
      sync();
      narrow_s = seconds_since(t1);
    }
    std::vector<token_t> next(static_cast<std::size_t>(batch));
    for (index_t b = 0; b < batch; ++b) next[std::size_t(b)] = token_t(b % V);
    const index_t steps = std::min(new_tokens, context - half - 2);
    const auto time_steps = [&] {  // ms per step, after two warm-up steps
      dec.step(next);
      dec.step(next);
      sync();
      const auto t = clock_type::now();
      for (index_t s = 0; s < steps; ++s) dec.step(next);
      sync();
      return seconds_since(t) / double(steps) * 1e3;
    };
    const double step_ms = time_steps();
    char by_ops[32] = "–";
    if constexpr (infer::Decoder<Instance>::records_graphs) {
      dec.use_graphs(false);
      dec.prefill(ps);
      std::snprintf(by_ops, sizeof by_ops, "%.2f", time_steps());
    }
    char ratio[32] = "–";
    if (batch == 1) std::snprintf(ratio, sizeof ratio, "%.2f", step_ms / (weight_bytes / (gbps * 1e9) * 1e3));
    std::printf("| %s | %lld | %lld | %.0f | %.0f | %.2f | %s | %.0f | %.1f MiB | %s |\n", name, (long long)context,
                (long long)batch, double(batch * half) / prefill_s, double(batch * half) / narrow_s, step_ms, by_ops,
                double(batch) * 1e3 / step_ms,
                double(dec.memory_elements()) * sizeof(float) / (1 << 20), ratio);
  }
  // The recompute loop at batch 1: a forward over the window for each new token.
  model.reserve(1, context);
  std::vector<token_t> seq = prompts[0];
  const index_t reps = std::max<index_t>(2, std::min<index_t>(new_tokens, 8));
  model.forward(seq, {}, 1, ssize(seq));  // warm-up
  std::vector<float> last(static_cast<std::size_t>(V));
  const auto t0 = clock_type::now();
  for (index_t i = 0; i < reps; ++i) {
    model.forward(seq, {}, 1, ssize(seq));
    model.backend().to_host(std::span<float>(last), std::span<const float>(model.logits().row(ssize(seq) - 1), last.size()));
    seq.push_back(token_t(std::max_element(last.begin(), last.end()) - last.begin()));
  }
  const double recompute_ms = seconds_since(t0) / double(reps) * 1e3;
  std::printf("| %s | %lld | 1 (recompute loop) | – | – | %.2f | – | %.0f | – | – |\n", name, (long long)context, recompute_ms,
              1e3 / recompute_ms);
}

}  // namespace mom::bench

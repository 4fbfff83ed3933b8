// Text generation from a trained model for `mom-sample` and the end of `mom-train`: greedy (temperature 0)
// or temperature / top-k / top-p sampling (infer::Sampler).
//
// Architectures that decode incrementally (infer::decodes: every one whose routing is causal: dense stacks,
// parameter sharing, MoE, MoM, layer-skip / early exit, MoEUT, ModuleFormer, and Mixture-of-Depths trained
// with a causal method, sampled as causal_sampling_arch) run on the KV-cache Decoder: one pass over the
// weights per token. Past the model's context the window restarts from the last context/2 tokens,
// re-prefilled: every token is conditioned on between context/2 and context earlier tokens, as a model
// trained at that context expects. Architectures whose routing is not causal (Mixture-of-Depths with plain
// top-C routing, MoDE staged) recompute a forward over the last `context` tokens for every new token (the
// window slides by one; the top-C is then taken among the window's tokens, all of them in the past).
#pragma once

#include <mom/mom.hpp>
#include <mom/train/train.hpp>

#include "architectures.hpp"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace mom::examples {

struct SampleRequest {
  std::filesystem::path checkpoint;  // run dir or step folder (empty: use the model as it is)
  std::string prompt = "\n";
  index_t tokens = 200;
  double temperature = 0.8;  // 0 = greedy
  index_t top_k = 0;         // 0 = all
  double top_p = 1.0;        // 1 = all
  std::uint64_t seed = 1;
  std::filesystem::path repo_root = ".";
  Device device;
};

// Appends n_new tokens to `tokens` (the prompt, at least one token), calling on_token(id) after each.
template <class Instance>
void generate(Instance& model, std::vector<token_t>& tokens, index_t n_new, const infer::SamplingOptions& sampling,
              std::uint64_t seed, const std::function<void(token_t)>& on_token = {}) {
  using T = typename Instance::scalar;
  using Be = typename Instance::backend_type;
  constexpr index_t context = Instance::dims.context, vocab = Instance::dims.vocab;
  MOM_CHECK(!tokens.empty(), "generate: the prompt must hold at least one token");
  sampling.check();
  infer::Sampler sampler(seed);
  const auto emit = [&](token_t t) {
    tokens.push_back(t);
    if (on_token) on_token(t);
  };
  if constexpr (infer::decodes<typename Instance::model_type, Be>) {
    infer::Decoder dec(model, 1, context);
    const std::vector<index_t> slot0{0};
    index_t produced = 0;
    bool first = true;
    while (produced < n_new) {
      // (Re)start the window: the whole prompt when it fits, else (and after a full window) the last
      // context/2 tokens.
      const index_t keep = first && ssize(tokens) <= context ? ssize(tokens) : std::min(ssize(tokens), context / 2);
      first = false;
      const std::vector<std::vector<token_t>> window{{tokens.end() - keep, tokens.end()}};
      dec.prefill(std::span<const std::vector<token_t>>(window));
      while (produced < n_new) {
        const token_t t = sampler(dec.last_logits(0), sampling);
        emit(t);
        if (++produced == n_new || dec.length(0) >= context) break;
        dec.step(slot0, std::span<const token_t>(&t, 1));
      }
    }
  } else {
    model.reserve(1, context);
    std::vector<T> row(static_cast<std::size_t>(vocab));  // the last position's logits, read from backend memory
    for (index_t i = 0; i < n_new; ++i) {
      const index_t len = std::min<index_t>(ssize(tokens), context);
      model.forward(std::span<const token_t>(tokens.data() + tokens.size() - len, std::size_t(len)), {}, 1, len);
      model.backend().to_host(std::span<T>(row), std::span<const T>(model.logits().row(len - 1), std::size_t(vocab)));
      emit(sampler(std::span<const T>(row), sampling));
    }
  }
}

}  // namespace mom::examples

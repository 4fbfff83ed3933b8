// Text generation from a trained model: greedy (temperature 0) or temperature / top-k sampling, with the
// context window sliding over the last `context` tokens. Used by `mom-sample` and at the end of `mom-train`.
#pragma once

#include <mom/mom.hpp>
#include <mom/train/train.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace mom::examples {

struct SampleRequest {
  std::filesystem::path checkpoint;  // run dir or step folder (empty: use the model as it is)
  std::string prompt = "\n";
  index_t tokens = 200;
  double temperature = 0.8;  // 0 = greedy
  index_t top_k = 0;         // 0 = all
  std::uint64_t seed = 1;
  std::filesystem::path repo_root = ".";
};

// Appends n_new tokens to `tokens`, calling on_token(id) after each (for streaming output).
template <class Instance>
void generate(Instance& model, std::vector<token_t>& tokens, index_t n_new, double temperature, index_t top_k,
              std::uint64_t seed, const std::function<void(token_t)>& on_token = {}) {
  using T = typename Instance::scalar;
  constexpr index_t context = Instance::dims.context;
  constexpr index_t vocab = Instance::dims.vocab;
  MOM_CHECK(!tokens.empty(), "generate: the prompt must hold at least one token");
  MOM_CHECK(temperature >= 0 && std::isfinite(temperature), "generate: temperature ", temperature, " must be >= 0");
  model.reserve(1, context);
  std::mt19937_64 rng(seed);
  std::vector<double> prob(static_cast<std::size_t>(vocab));
  std::vector<token_t> order(static_cast<std::size_t>(vocab));
  for (index_t i = 0; i < n_new; ++i) {
    const index_t len = std::min<index_t>(static_cast<index_t>(tokens.size()), context);
    const std::span<const token_t> window(tokens.data() + tokens.size() - len, static_cast<std::size_t>(len));
    model.forward(window, {}, 1, len);
    const MatrixView<const T> logits = model.logits();
    const T* last = logits.row(len - 1);
    token_t next = 0;
    if (temperature == 0) {
      next = static_cast<token_t>(std::max_element(last, last + vocab) - last);
    } else {
      // Softmax of logits / temperature over the top_k largest (all when top_k == 0).
      for (index_t v = 0; v < vocab; ++v) order[static_cast<std::size_t>(v)] = static_cast<token_t>(v);
      index_t k = top_k > 0 && top_k < vocab ? top_k : vocab;
      if (k < vocab)
        std::partial_sort(order.begin(), order.begin() + k, order.end(),
                          [&](token_t a, token_t b) { return last[a] > last[b] || (last[a] == last[b] && a < b); });
      double max_logit = -1e300;
      for (index_t j = 0; j < k; ++j) max_logit = std::max(max_logit, double(last[order[static_cast<std::size_t>(j)]]));
      double sum = 0;
      for (index_t j = 0; j < k; ++j) {
        const double p = std::exp((double(last[order[static_cast<std::size_t>(j)]]) - max_logit) / temperature);
        prob[static_cast<std::size_t>(j)] = p;
        sum += p;
      }
      // Uniform in [0, sum) from 53 random bits: the same draw on every platform.
      double u = double(rng() >> 11) * 0x1.0p-53 * sum;
      index_t j = 0;
      for (; j < k - 1; ++j) {
        u -= prob[static_cast<std::size_t>(j)];
        if (u < 0) break;
      }
      next = order[static_cast<std::size_t>(j)];
    }
    tokens.push_back(next);
    if (on_token) on_token(next);
  }
}

}  // namespace mom::examples

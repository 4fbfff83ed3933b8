#pragma once
// Text generation on a Decoder: greedy or sampled (temperature, top-k, top-p) continuation of a batch of
// prompts, with stop tokens, a seed and a per-token callback for streaming.
//
//   infer::Decoder dec(model, prompts.size());
//   auto out = infer::generate(dec, prompts, {.max_new_tokens = 200, .sampling = {.temperature = 0.8, .top_p = 0.95}},
//                              [](index_t seq, token_t t) { print(seq, t); });
//
// Sequence b draws from its own mt19937_64 seeded with seed + b, so its text does not depend on which other
// sequences share the batch. A sequence stops at a stop token (kept in its output), after max_new_tokens,
// or when it fills the decoder's max_len (its context): no window slides, so every token a model emits is
// conditioned exactly as in training.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "mom/infer/decoder.hpp"

namespace mom::infer {

struct SamplingOptions {
  double temperature = 0.8;  // 0: greedy (the most likely token, lowest id on ties)
  index_t top_k = 0;         // sample among the k most likely tokens; 0: all
  double top_p = 1.0;        // then among the smallest set whose probability reaches top_p (nucleus); 1: all
  void check() const {
    MOM_CHECK(std::isfinite(temperature) && temperature >= 0, "temperature ", temperature,
              " must be a finite number >= 0 (0: greedy)");
    MOM_CHECK(top_k >= 0, "top_k ", top_k, " must be >= 0 (0: all tokens)");
    MOM_CHECK(std::isfinite(top_p) && top_p > 0 && top_p <= 1, "top_p ", top_p, " must be in (0, 1]");
  }
};

// Picks the next token from one row of logits. Deterministic for a seed on every platform (the uniform
// draw is built from 53 bits of mt19937_64, not a library distribution).
class Sampler {
 public:
  explicit Sampler(std::uint64_t seed = 1) : rng_(seed) {}

  template <class T>
  token_t operator()(std::span<const T> logits, const SamplingOptions& o) {
    const index_t vocab = ssize(logits);
    if (o.temperature == 0)
      return static_cast<token_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    order_.resize(std::size_t(vocab));
    for (index_t v = 0; v < vocab; ++v) order_[std::size_t(v)] = static_cast<token_t>(v);
    // Candidates by decreasing logit (ties: lower id first): the top k, or all.
    const index_t k = o.top_k > 0 && o.top_k < vocab ? o.top_k : vocab;
    const auto by_logit = [&](token_t a, token_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
    if (k < vocab)  // only the k candidates need their order (also for top-p, which cuts inside them)
      std::partial_sort(order_.begin(), order_.begin() + k, order_.end(), by_logit);
    else if (o.top_p < 1)
      std::sort(order_.begin(), order_.end(), by_logit);
    // Softmax of logits / temperature over the candidates, shifted by the largest logit (always one).
    const double m = double(*std::max_element(logits.begin(), logits.end()));
    prob_.resize(std::size_t(k));
    double sum = 0;
    for (index_t j = 0; j < k; ++j) {
      prob_[std::size_t(j)] = std::exp((double(logits[order_[std::size_t(j)]]) - m) / o.temperature);
      sum += prob_[std::size_t(j)];
    }
    index_t n = k;
    if (o.top_p < 1) {  // the nucleus: the shortest prefix (by probability) reaching top_p of the mass
      double mass = 0;
      for (n = 0; n < k;) {
        mass += prob_[std::size_t(n++)];
        if (mass >= o.top_p * sum) break;
      }
      sum = mass;
    }
    double u = double(rng_() >> 11) * 0x1.0p-53 * sum;  // uniform in [0, sum)
    index_t j = 0;
    for (; j < n - 1; ++j) {
      u -= prob_[std::size_t(j)];
      if (u < 0) break;
    }
    return order_[std::size_t(j)];
  }

 private:
  std::mt19937_64 rng_;
  std::vector<token_t> order_;
  std::vector<double> prob_;
};

struct GenerateOptions {
  index_t max_new_tokens = 200;
  SamplingOptions sampling{};
  std::vector<token_t> stop_tokens{};  // a sequence ends after emitting one of these
  std::uint64_t seed = 1;
};

enum class StopReason { StopToken, MaxNewTokens, Context };

struct Generated {
  std::vector<token_t> tokens;  // the new tokens (the prompt not included)
  StopReason reason = StopReason::MaxNewTokens;
};

// Continues prompts[b] in slot b of `dec` (reset first). on_token(b, token) is called for every new token
// as it is chosen, in step order.
template <class Instance>
std::vector<Generated> generate(Decoder<Instance>& dec, std::span<const std::vector<token_t>> prompts,
                                const GenerateOptions& o,
                                const std::function<void(index_t, token_t)>& on_token = {}) {
  o.sampling.check();
  MOM_CHECK(o.max_new_tokens >= 0, "max_new_tokens ", o.max_new_tokens, " must be >= 0");
  const index_t n = ssize(prompts);
  std::vector<Generated> out(static_cast<std::size_t>(n));
  if (o.max_new_tokens == 0) return out;
  dec.prefill(prompts);
  std::vector<Sampler> samplers;
  for (index_t b = 0; b < n; ++b) samplers.emplace_back(o.seed + std::uint64_t(b));
  std::vector<index_t> active;
  for (index_t b = 0; b < n; ++b) active.push_back(b);
  std::vector<index_t> next_slots;
  std::vector<token_t> next_tokens;
  while (!active.empty()) {
    next_slots.clear();
    next_tokens.clear();
    for (const index_t b : active) {
      const token_t t = samplers[std::size_t(b)](dec.last_logits(b), o.sampling);
      auto& g = out[std::size_t(b)];
      g.tokens.push_back(t);
      if (on_token) on_token(b, t);
      if (std::find(o.stop_tokens.begin(), o.stop_tokens.end(), t) != o.stop_tokens.end()) {
        g.reason = StopReason::StopToken;
      } else if (ssize(g.tokens) >= o.max_new_tokens) {
        g.reason = StopReason::MaxNewTokens;
      } else if (dec.length(b) >= dec.max_len()) {
        g.reason = StopReason::Context;
      } else {
        next_slots.push_back(b);
        next_tokens.push_back(t);
      }
    }
    if (!next_slots.empty()) dec.step(next_slots, next_tokens);
    active = next_slots;
  }
  return out;
}

}  // namespace mom::infer

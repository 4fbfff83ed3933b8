#pragma once
// Random token ids and parameters for checks of a model (mom/testing.hpp).
#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "mom/core/tensor.hpp"

namespace mom::testing {

// n uniform ids in [0, vocab), reproducible from seed.
inline std::vector<token_t> random_tokens(index_t n, index_t vocab, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<token_t> dist(0, token_t(vocab - 1));
  std::vector<token_t> out(static_cast<std::size_t>(n));
  for (auto& t : out) t = dist(rng);
  return out;
}

// Every trainable parameter N(0, sd²), reproducible from seed (a model's own initialisation is too small for
// routing decisions and gradient checks to see every path). Buffers (TensorSpec::trainable = false, such as
// ModuleFormer's pruning masks) keep their meaning: zero.
template <class Instance>
void randomise(Instance& m, std::uint64_t seed, double sd = 0.3) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, sd);
  for (auto& p : m.params()) p = static_cast<typename Instance::scalar>(normal(rng));
  for (const auto& t : Instance::model_type::layout)
    if (!t.trainable) std::fill_n(m.params().begin() + t.offset, t.size(), typename Instance::scalar(0));
}

}  // namespace mom::testing

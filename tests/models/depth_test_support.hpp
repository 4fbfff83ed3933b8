#pragma once
// What the depth-routing model tests share (tests/models/depth_model_test.cpp: Mixture-of-Depths, layer-skip,
// early exit; tests/models/recursion_test.cpp: Mixture-of-Recursions): a model's logits on the host, their
// largest difference, the executor of a part, the tokens each routed layer (or recursion) ran, and the check
// that a batch of two sequences computes what each sequence does alone.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "models/random_tokens.hpp"
#include "mom/mom.hpp"

namespace mom::test {

template <class Instance>
std::vector<double> logits_of(Instance& m) {
  const auto l = m.logits();
  return std::vector<double>(l.data, l.data + l.rows * l.cols);
}

inline double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double e = 0;
  for (std::size_t i = 0; i < a.size(); ++i) e = std::max(e, std::abs(a[i] - b[i]));
  return e;
}

// The executor of part I of the model.
template <std::size_t I, class List>
struct list_at;
template <std::size_t I, class T, class... Ts>
struct list_at<I, TypeList<T, Ts...>> : list_at<I - 1, TypeList<Ts...>> {};
template <class T, class... Ts>
struct list_at<0, TypeList<T, Ts...>> {
  using type = T;
};
template <class Instance, std::size_t I = 0>
using ExecOf = typename list_at<I, typename Instance::model_type::core::executors>::type;

// The flat indices of the tokens each routed layer (recursion) of part I ran in the last forward.
template <std::size_t I = 0, class Instance>
std::vector<std::vector<token_t>> selections(Instance& m) {
  using E = ExecOf<Instance, I>;
  std::vector<std::vector<token_t>> out;
  for (int h = 0; h < E::L; ++h)
    if (E::routed(h))
      out.push_back(E::read_selected(m.backend(), m.workspace_data(), std::get<I>(m.plan().parts), h, m.batch(), m.seq()));
  return out;
}

// Two different sequences of `seq` tokens batched give each sequence's own logits (1e-12), and every routed
// layer picks for the second sequence its own picks shifted by the batch offset.
template <class Instance>
void check_batch_independence(Instance& m, index_t seq, std::uint64_t seed_a, std::uint64_t seed_b) {
  constexpr index_t vocab = Instance::model_type::dims.vocab;
  m.reserve(2, seq);
  const auto a = random_tokens(seq, vocab, seed_a), b = random_tokens(seq, vocab, seed_b);
  std::vector<token_t> ab(a);
  ab.insert(ab.end(), b.begin(), b.end());
  m.forward(ab, {}, 2, seq);
  const auto both = logits_of(m);
  const auto sel_both = selections(m);
  m.forward(a, {}, 1, seq);
  const auto la = logits_of(m);
  const auto sel_a = selections(m);
  m.forward(b, {}, 1, seq);
  const auto lb = logits_of(m);
  const auto sel_b = selections(m);
  CHECK(max_abs_diff(std::vector<double>(both.begin(), both.begin() + long(la.size())), la) < 1e-12);
  CHECK(max_abs_diff(std::vector<double>(both.begin() + long(la.size()), both.end()), lb) < 1e-12);
  REQUIRE(sel_both.size() == sel_a.size());
  for (std::size_t r = 0; r < sel_both.size(); ++r) {
    const std::size_t C = sel_a[r].size();
    REQUIRE(sel_both[r].size() == C + sel_b[r].size());
    for (std::size_t j = 0; j < C; ++j) CHECK(sel_both[r][j] == sel_a[r][j]);
    for (std::size_t j = 0; j < sel_b[r].size(); ++j) CHECK(sel_both[r][C + j] == sel_b[r][j] + token_t(seq));
  }
}

}  // namespace mom::test

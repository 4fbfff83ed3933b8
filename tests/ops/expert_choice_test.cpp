// Expert-choice routing ops (cpu/expert_choice.hpp): each expert's top-c rows against a naive sort (ties to the
// lower row, capacity 0 and all rows), the no-op slots, and the backward's mask.
#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>
#include <vector>

#include <mom/backend/cpu.hpp>

#include "ops/grad_check.hpp"

using namespace mom;
using namespace mom::test;

TEST_CASE("expert_choice_forward: every expert takes its top-c rows (naive sort, ties, c = 0 and c = n)",
          "[ops][expert-choice]") {
  Rng rng(3);
  const index_t n = 37, E = 5;
  auto probs = random_vec(n * E, rng, 0, 1);
  probs[std::size_t(4 * E + 2)] = probs[std::size_t(9 * E + 2)];  // a tie in expert 2's column
  for (const index_t c : {index_t(0), index_t(1), index_t(7), index_t(20), n}) {
    std::vector<double> w(std::size_t(n * E), -1.0);
    std::vector<token_t> picks(std::size_t(n * E), -1);
    cpu::expert_choice_forward<double>(mat(w, n, E), MatrixView<token_t>{picks.data(), n, E}, cmat(probs, n, E), c);
    INFO("capacity " << c);
    for (index_t e = 0; e < E; ++e) {
      std::vector<index_t> order(static_cast<std::size_t>(n));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](index_t a, index_t b) { return probs[std::size_t(a * E + e)] > probs[std::size_t(b * E + e)]; });
      std::vector<bool> taken(std::size_t(n), false);
      for (index_t i = 0; i < c; ++i) taken[std::size_t(order[std::size_t(i)])] = true;
      for (index_t r = 0; r < n; ++r) {
        const auto at = std::size_t(r * E + e);
        CHECK(picks[at] == (taken[std::size_t(r)] ? token_t(e) : token_t(E)));
        CHECK(w[at] == (taken[std::size_t(r)] ? probs[at] : 0.0));
      }
    }
  }
  std::vector<double> w(std::size_t(n * E));
  std::vector<token_t> picks(std::size_t(n * E));
  CHECK_THROWS_WITH(cpu::expert_choice_forward<double>(mat(w, n, E), MatrixView<token_t>{picks.data(), n, E},
                                                       cmat(probs, n, E), n + 1),
                    Catch::Contains("capacity 38 must be in [0, 37]"));
}

TEST_CASE("expert_choice_backward: the taken slots' gradient reaches their scores, the others' does not",
          "[ops][expert-choice]") {
  const index_t n = 3, E = 2;
  const std::vector<token_t> picks{0, 2, 2, 1, 0, 1};  // class 2: the no-op
  const std::vector<double> dw{1, 2, 3, 4, 5, 6};
  std::vector<double> dp(6, 0.5);
  cpu::expert_choice_backward<double>(mat(dp, n, E), cmat(dw, n, E), MatrixView<const token_t>{picks.data(), n, E});
  CHECK(dp == std::vector<double>{1.5, 0.5, 0.5, 4.5, 5.5, 6.5});
}

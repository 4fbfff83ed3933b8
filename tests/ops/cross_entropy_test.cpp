// softmax cross-entropy: finite-difference gradients (double), float vs naive loops, ignore_index.
#include <catch2/catch.hpp>

#include <cmath>

#include <mom/backend/cpu.hpp>

#include "ops/grad_check.hpp"

using namespace mom;
using namespace mom::test;

namespace {
// Naive loss in double: mean over counted rows of log Σ exp(l) - l[target].
double naive_ce(const std::vector<float>& logits, const std::vector<token_t>& targets, index_t V, token_t ignore,
                std::vector<double>* lse_out = nullptr) {
  double total = 0;
  index_t count = 0;
  for (std::size_t i = 0; i < targets.size(); ++i) {
    double m = -1e300;
    for (index_t j = 0; j < V; ++j) m = std::max(m, double(logits[i * V + j]));
    double s = 0;
    for (index_t j = 0; j < V; ++j) s += std::exp(double(logits[i * V + j]) - m);
    const double lse = m + std::log(s);
    if (lse_out) lse_out->push_back(lse);
    if (targets[i] == ignore) continue;
    total += lse - logits[i * V + targets[i]];
    ++count;
  }
  return total / double(count);
}
}  // namespace

TEST_CASE("cross_entropy: gradient matches finite differences (double), with an ignored row", "[ops][cross_entropy]") {
  Rng rng(20);
  const index_t n = 5, V = 7;
  auto logits = random_vec(n * V, rng, -3, 3);
  const std::vector<token_t> targets{2, -1, 0, 6, 2};
  std::vector<double> loss(1), lse(n);
  const double dloss = 1.7;
  auto f = [&] {
    cpu::cross_entropy_forward<double>(loss, lse, cmat(logits, n, V), targets);
    return dloss * loss[0];
  };
  f();
  std::vector<double> dlogits(n * V, 99.0);  // written, not accumulated
  cpu::cross_entropy_backward<double>(mat(dlogits, n, V), cmat(logits, n, V), lse, targets, dloss);
  CHECK(rel_error(dlogits, numeric_grad(logits, f)) < fd_tol);
  for (index_t j = 0; j < V; ++j) CHECK(dlogits[1 * V + j] == 0.0);  // the ignored row
}

TEST_CASE("cross_entropy: float over a GPT-2 vocabulary matches naive loops, in-place backward",
          "[ops][cross_entropy]") {
  Rng rng(21);
  const index_t n = 6, V = 50257;
  auto logits = random_vec<float>(n * V, rng, -8, 8);
  logits[3 * V + 17] = 30.f;  // a dominant logit late in a row exercises the online max rescaling
  const std::vector<token_t> targets{5, 50256, 0, 17, -100, 1234};
  std::vector<float> loss(1), lse(n);
  cpu::cross_entropy_forward<float>(loss, lse, cmat(logits, n, V), targets, -100);
  std::vector<double> want_lse;
  const double want = naive_ce(logits, targets, V, -100, &want_lse);
  CHECK(loss[0] == Approx(want).epsilon(1e-5));
  CHECK(rel_error(lse, want_lse) < float_tol);

  // Backward in place (dlogits aliases logits): rows sum to 0, the target entry is p - 1.
  const std::vector<float> saved = logits;
  cpu::cross_entropy_backward<float>(mat(logits, n, V), cmat(logits, n, V), lse, targets, 1.f, -100);
  const double inv_count = 1.0 / 5;
  for (index_t i = 0; i < n; ++i) {
    double row_sum = 0, max_err = 0;
    for (index_t j = 0; j < V; ++j) {
      double want_g = 0;
      if (targets[i] != -100) want_g = (std::exp(saved[i * V + j] - want_lse[i]) - (j == targets[i])) * inv_count;
      max_err = std::max(max_err, std::abs(want_g - logits[i * V + j]));
      row_sum += logits[i * V + j];
    }
    CHECK(max_err < 1e-6);
    CHECK(std::abs(row_sum) < 1e-5);
  }
}

TEST_CASE("cross_entropy: ignore_index excludes rows from the mean, all ignored gives 0", "[ops][cross_entropy]") {
  const index_t V = 3;
  // Row 0: uniform logits, target 1 -> loss log 3. Row 1 is ignored whatever its logits.
  std::vector<double> logits{0, 0, 0, 100, -100, 5};
  std::vector<double> loss(1), lse(2);
  cpu::cross_entropy_forward<double>(loss, lse, cmat(logits, 2, V), std::vector<token_t>{1, -1});
  CHECK(loss[0] == Approx(std::log(3.0)).epsilon(1e-14));
  CHECK(lse[0] == Approx(std::log(3.0)).epsilon(1e-14));
  cpu::cross_entropy_forward<double>(loss, lse, cmat(logits, 2, V), std::vector<token_t>{-1, -1});
  CHECK(loss[0] == 0.0);
  std::vector<double> d(6, 5.0);
  cpu::cross_entropy_backward<double>(mat(d, 2, V), cmat(logits, 2, V), lse, std::vector<token_t>{-1, -1}, 1.0);
  CHECK(d == std::vector<double>(6, 0.0));
}

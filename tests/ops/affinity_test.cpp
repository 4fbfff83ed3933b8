// DeepSeekMoE's affinity routing ops (cpu/affinity.hpp): the biased top-K against a naive reference written
// as V3 §2.1.2 reads (shared slots, the bias selecting only, group-limited routing, ties), its backward
// against finite differences in double, the loads and the bias's sign update.
#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>
#include <vector>

#include <mom/backend/cpu.hpp>

#include "ops/grad_check.hpp"

using namespace mom;
using namespace mom::test;

namespace {

// One row, as the equations read: the allowed experts (the M best groups by the sum of their two largest
// biased scores), then the k allowed experts of largest s + b (lower index first on ties), weights
// scale · s / Σ s over them (or scale · s).
struct NaiveRow {
  std::vector<token_t> picks;
  std::vector<double> weights;
};
NaiveRow naive_row(const double* s, const std::vector<double>& bias, index_t E, index_t shared, index_t k, index_t G,
                   index_t M, bool renormalise, double scale) {
  std::vector<index_t> allowed;
  const index_t per = E / G;
  std::vector<index_t> groups(static_cast<std::size_t>(G));
  std::iota(groups.begin(), groups.end(), 0);
  auto group_score = [&](index_t g) {
    std::vector<double> v;
    for (index_t e = g * per; e < (g + 1) * per; ++e) v.push_back(s[e] + bias[std::size_t(e)]);
    std::sort(v.rbegin(), v.rend());
    return per > 1 ? v[0] + v[1] : v[0];
  };
  std::stable_sort(groups.begin(), groups.end(), [&](index_t a, index_t b) { return group_score(a) > group_score(b); });
  for (index_t e = 0; e < E; ++e)
    if (G == 1 || std::find(groups.begin(), groups.begin() + M, e / per) != groups.begin() + M) allowed.push_back(e);
  std::stable_sort(allowed.begin(), allowed.end(), [&](index_t a, index_t b) {
    return s[a] + bias[std::size_t(a)] > s[b] + bias[std::size_t(b)];
  });
  NaiveRow r;
  for (index_t j = 0; j < shared; ++j) r.picks.push_back(token_t(j)), r.weights.push_back(1.0);
  double sum = 0;
  for (index_t j = 0; j < k; ++j) sum += s[allowed[std::size_t(j)]];
  for (index_t j = 0; j < k; ++j) {
    const index_t e = allowed[std::size_t(j)];
    r.picks.push_back(token_t(shared + e));
    r.weights.push_back(renormalise ? scale * s[e] / sum : scale * s[e]);
  }
  return r;
}

}  // namespace

TEST_CASE("affinity_topk_forward equals the naive selection (shared slots, bias selects only, groups, ties)",
          "[ops][affinity]") {
  struct Case {
    index_t shared, k, G, M;
    bool renormalise;
    double scale;
  };
  for (const Case c : {Case{0, 2, 1, 1, true, 1.0}, Case{2, 3, 1, 1, true, 2.5}, Case{1, 2, 4, 2, true, 1.0},
                       Case{1, 4, 4, 2, false, 1.0}, Case{0, 1, 8, 3, true, 1.0}}) {
    Rng rng(7 + std::uint64_t(c.k * 10 + c.G));
    const index_t n = 9, E = 8, K = c.shared + c.k;
    auto s = random_vec(n * E, rng, 0.01, 0.99);
    s[3] = s[5];  // a tie inside a row: the lower index wins
    auto bias = random_vec(std::size_t(E), rng, -0.3, 0.3);
    std::vector<double> w(std::size_t(n * K)), probs(std::size_t(n * E));
    std::vector<token_t> picks(std::size_t(n * K));
    cpu::affinity_topk_forward<double>(mat(w, n, K), MatrixView<token_t>{picks.data(), n, K}, mat(probs, n, E),
                                       cmat(s, n, E), bias, c.shared, c.G, c.M, c.renormalise, c.scale);
    INFO("shared " << c.shared << " k " << c.k << " groups " << c.G << "/" << c.M);
    for (index_t r = 0; r < n; ++r) {
      const NaiveRow ref = naive_row(s.data() + r * E, bias, E, c.shared, c.k, c.G, c.M, c.renormalise, c.scale);
      for (index_t j = 0; j < K; ++j) {
        CHECK(picks[std::size_t(r * K + j)] == ref.picks[std::size_t(j)]);
        CHECK(w[std::size_t(r * K + j)] == Approx(ref.weights[std::size_t(j)]).epsilon(1e-14));
      }
      double all = 0;
      for (index_t e = 0; e < E; ++e) all += s[std::size_t(r * E + e)];
      for (index_t e = 0; e < E; ++e) CHECK(probs[std::size_t(r * E + e)] == Approx(s[std::size_t(r * E + e)] / all));
    }
  }
}

TEST_CASE("affinity_topk: the bias changes which experts are picked, never their weights", "[ops][affinity]") {
  const index_t E = 4, K = 2;
  const std::vector<double> s{0.9, 0.8, 0.2, 0.1};
  std::vector<double> w(K);
  std::vector<token_t> picks(K);
  const std::vector<double> none(E, 0.0), favour{0.0, -1.0, 1.0, 0.0};  // pushes expert 2 up, 1 down
  cpu::affinity_topk_forward<double>(mat(w, 1, K), MatrixView<token_t>{picks.data(), 1, K}, MatrixView<double>{},
                                     cmat(s, 1, E), none, 0, 1, 1, true, 1.0);
  CHECK(picks == std::vector<token_t>{0, 1});
  CHECK(w[0] == Approx(0.9 / 1.7));
  cpu::affinity_topk_forward<double>(mat(w, 1, K), MatrixView<token_t>{picks.data(), 1, K}, MatrixView<double>{},
                                     cmat(s, 1, E), favour, 0, 1, 1, true, 1.0);
  CHECK(picks == std::vector<token_t>{2, 0});  // 0.2 + 1 > 0.9 > 0.8 − 1
  CHECK(w[0] == Approx(0.2 / 1.1));            // from s alone
  CHECK(w[1] == Approx(0.9 / 1.1));
}

TEST_CASE("affinity_topk_backward matches finite differences (double, renormalised or not, balance column)",
          "[ops][affinity]") {
  for (const bool renormalise : {true, false}) {
    Rng rng(renormalise ? 21 : 22);
    const index_t n = 5, E = 6, shared = 1, K = 3;
    auto s = random_vec(n * E, rng, 0.05, 0.95);
    const auto bias = random_vec(std::size_t(E), rng, -0.2, 0.2);
    const auto dw = random_vec(n * K, rng), dp = random_vec(std::size_t(E), rng);
    std::vector<double> w(std::size_t(n * K)), probs(std::size_t(n * E));
    std::vector<token_t> picks(std::size_t(n * K)), fixed;
    auto loss = [&] {
      cpu::affinity_topk_forward<double>(mat(w, n, K), MatrixView<token_t>{picks.data(), n, K}, mat(probs, n, E),
                                         cmat(s, n, E), bias, shared, 2, 1, renormalise, 1.5);
      if (!fixed.empty()) REQUIRE(picks == fixed);  // finite differences do not cross a selection change
      double l = 0;
      for (index_t i = 0; i < n * K; ++i) l += dw[std::size_t(i)] * w[std::size_t(i)];
      for (index_t r = 0; r < n; ++r)
        for (index_t e = 0; e < E; ++e) l += dp[std::size_t(e)] * probs[std::size_t(r * E + e)];
      return l;
    };
    loss();
    fixed = picks;
    std::vector<double> ds(std::size_t(n * E), 0.0);
    cpu::affinity_topk_backward<double>(mat(ds, n, E), cmat(dw, n, K), cmat(s, n, E),
                                        MatrixView<const token_t>{picks.data(), n, K}, shared, renormalise, 1.5, dp);
    CHECK(rel_error(ds, numeric_grad(s, loss)) < fd_tol);
  }
}

TEST_CASE("sequence_balance_forward: V3's per-sequence f·P loss against a naive sum, its gradient by finite differences",
          "[ops][affinity]") {
  Rng rng(23);
  const index_t seq = 4, batch = 3, n = seq * batch, E = 5, shared = 1, K = 3, kr = K - shared;
  auto s = random_vec(n * E, rng, 0.05, 0.95);
  std::vector<token_t> picks(std::size_t(n * K));
  for (index_t t = 0; t < n; ++t) {  // shared class 0, then two distinct routed classes
    picks[std::size_t(t * K)] = 0;
    picks[std::size_t(t * K + 1)] = token_t(1 + t % E);
    picks[std::size_t(t * K + 2)] = token_t(1 + (t * 3 + 1) % E == 1 + t % E ? 1 + (t + 2) % E : 1 + (t * 3 + 1) % E);
  }
  const double coef = 0.7;
  // Naive, as V3 eqs. (17)–(20) read, averaged over the sequences.
  double want = 0;
  for (index_t b = 0; b < batch; ++b) {
    std::vector<double> f(std::size_t(E), 0.0), P(std::size_t(E), 0.0);
    for (index_t t = b * seq; t < (b + 1) * seq; ++t) {
      for (index_t j = shared; j < K; ++j) f[std::size_t(picks[std::size_t(t * K + j)] - shared)] += double(E) / double(kr * seq);
      double A = 0;
      for (index_t e = 0; e < E; ++e) A += s[std::size_t(t * E + e)];
      for (index_t e = 0; e < E; ++e) P[std::size_t(e)] += s[std::size_t(t * E + e)] / A / double(seq);
    }
    for (index_t e = 0; e < E; ++e) want += coef * f[std::size_t(e)] * P[std::size_t(e)] / double(batch);
  }
  std::vector<double> loss(1), ds(std::size_t(n * E)), freq(std::size_t(batch * E));
  auto run = [&] {
    cpu::sequence_balance_forward<double>(loss, mat(ds, n, E), mat(freq, batch, E), cmat(s, n, E),
                                          MatrixView<const token_t>{picks.data(), n, K}, shared, seq, coef);
    return loss[0];
  };
  CHECK(run() == Approx(want).epsilon(1e-12));
  const std::vector<double> grad = ds;
  CHECK(rel_error(grad, numeric_grad(s, run)) < fd_tol);
  // Balanced picks (every routed expert equally often in every sequence) and equal affinities give the minimum, 1.
  std::vector<double> flat(std::size_t(5 * 5), 0.5);
  std::vector<token_t> even(std::size_t(5 * 2));
  for (index_t t = 0; t < 5; ++t) even[std::size_t(2 * t)] = 0, even[std::size_t(2 * t + 1)] = token_t(1 + t);
  std::vector<double> ds5(25), f5(5);
  cpu::sequence_balance_forward<double>(loss, mat(ds5, 5, 5), mat(f5, 1, 5), cmat(flat, 5, 5),
                                        MatrixView<const token_t>{even.data(), 5, 2}, 1, 5, 1.0);
  CHECK(loss[0] == Approx(1.0));
  CHECK_THROWS_WITH(cpu::sequence_balance_forward<double>(loss, mat(ds, n, E), mat(freq, batch, E), cmat(s, n, E),
                                                          MatrixView<const token_t>{picks.data(), n, K}, shared, 5, coef),
                    Catch::Contains("rows are not sequences of 5"));
}

TEST_CASE("expert_load_add and bias_balance_update: loads from group offsets, the sign rule", "[ops][affinity]") {
  std::vector<double> load(4, 1.0);
  const std::vector<token_t> offsets{0, 3, 3, 7, 8};
  cpu::expert_load_add<double>(load, offsets);
  CHECK(load == std::vector<double>{4, 1, 5, 2});  // mean 3
  std::vector<double> bias{0.5, 0.5, 0.5, 0.5};
  cpu::bias_balance_update<double>(bias, load, 0.01);
  CHECK(bias == std::vector<double>{0.49, 0.51, 0.49, 0.51});  // overloaded down, underloaded up
  const std::vector<double> even(4, 2.0);
  cpu::bias_balance_update<double>(bias, even, 0.01);  // balanced: unchanged
  CHECK(bias == std::vector<double>{0.49, 0.51, 0.49, 0.51});
  CHECK_THROWS_WITH(cpu::expert_load_add<double>(load, std::span<const token_t>(offsets).first(4)),
                    Catch::Contains("4 offsets for 4 classes"));
}

TEST_CASE("affinity_topk: bad shapes are one-line errors", "[ops][affinity][bad-input]") {
  std::vector<double> s(2 * 6, 0.5), w(2 * 3), bias(6, 0.0);
  std::vector<token_t> picks(2 * 3);
  auto call = [&](index_t shared, index_t G, index_t M) {
    cpu::affinity_topk_forward<double>(mat(w, 2, 3), MatrixView<token_t>{picks.data(), 2, 3}, MatrixView<double>{},
                                       cmat(s, 2, 6), bias, shared, G, M, true, 1.0);
  };
  CHECK_THROWS_WITH(call(3, 1, 1), Catch::Contains("leave k = 0 routed picks"));
  CHECK_THROWS_WITH(call(0, 4, 1), Catch::Contains("groups must divide the experts"));
  CHECK_THROWS_WITH(call(0, 3, 1), Catch::Contains("it must be in [1, 2]"));  // 3 picks, 2 experts per group
  CHECK_NOTHROW(call(1, 3, 1));
}

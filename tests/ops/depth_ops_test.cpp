// Ops of the depth routers (backend/cpu/depth.hpp): per-sequence expert-choice top-C, the skip
// decision with early-exit state, the selection mask, the logistic gate and BCE on logits, each
// against a naive reference, with finite-difference gradients in double where differentiable.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "mom/backend/cpu/backend.hpp"
#include "ops/grad_check.hpp"

using namespace mom;
using namespace mom::test;

namespace {
// The C largest of one sequence's scores by a full sort (ties: the earlier position), ascending.
std::vector<token_t> naive_topc(const std::vector<double>& s, index_t b, index_t seq, index_t C) {
  std::vector<token_t> pos(static_cast<std::size_t>(seq));
  std::iota(pos.begin(), pos.end(), token_t(0));
  std::stable_sort(pos.begin(), pos.end(), [&](token_t x, token_t y) {
    return s[std::size_t(b * seq + x)] > s[std::size_t(b * seq + y)];
  });
  pos.resize(std::size_t(C));
  std::sort(pos.begin(), pos.end());
  for (auto& p : pos) p = token_t(b * seq + p);
  return pos;
}
}  // namespace

TEST_CASE("select_topc_per_sequence: exactly C per sequence, ascending, with the batch offset", "[depth][ops]") {
  cpu::Backend<double> be;
  Rng rng(3);
  for (index_t seq : {1, 7, 64, 300}) {
    const index_t batch = 3;
    auto scores = random_vec<double>(std::size_t(batch * seq), rng);
    if (seq >= 7) scores[2] = scores[5];  // a tie: the earlier position wins
    for (index_t C : {index_t(0), index_t(1), seq / 8, seq / 2, seq - 1, seq}) {
      if (C < 0) continue;
      std::vector<token_t> idx(std::size_t(batch * C), -7);
      be.select_topc_per_sequence(std::span<token_t>(idx), std::span<const double>(scores), batch, seq);
      std::vector<token_t> want;
      for (index_t b = 0; b < batch; ++b) {
        const auto w = naive_topc(scores, b, seq, C);
        want.insert(want.end(), w.begin(), w.end());
      }
      INFO("seq " << seq << " C " << C);
      CHECK(idx == want);  // C (not C-1) tokens of every sequence, b·seq + position, ascending
    }
  }
  // C = seq selects everything in order; a wrong count is an error.
  std::vector<double> s = {3, 1, 2, 0.5, 9, 8};
  std::vector<token_t> all(6);
  be.select_topc_per_sequence(std::span<token_t>(all), std::span<const double>(s), 2, 3);
  CHECK(all == std::vector<token_t>{0, 1, 2, 3, 4, 5});
  std::vector<token_t> two(4);
  be.select_topc_per_sequence(std::span<token_t>(two), std::span<const double>(s), 2, 3);
  CHECK(two == std::vector<token_t>{0, 2, 4, 5});
  std::vector<token_t> bad(5);
  CHECK_THROWS_WITH(be.select_topc_per_sequence(std::span<token_t>(bad), std::span<const double>(s), 2, 3),
                    Catch::Contains("not C per sequence"));
}

TEST_CASE("selection_mask and skip_select (layer-skip and early-exit state)", "[depth][ops]") {
  cpu::Backend<float> be;
  std::vector<float> mask(6, 5.f);
  const std::vector<token_t> sel = {1, 4};
  be.selection_mask(std::span<float>(mask), std::span<const token_t>(sel));
  CHECK(mask == std::vector<float>{0, 1, 0, 0, 1, 0});

  const std::vector<float> logits = {0.5f, -1.f, 2.f, 0.f, 3.f, -0.1f};
  std::vector<token_t> idx(6, -1), count(1, -1);
  be.skip_select(std::span<token_t>(idx), std::span<token_t>(count), std::span<token_t>{}, std::span<const float>(logits));
  REQUIRE(count[0] == 3);  // logit > 0 runs (0 does not: σ(0) = ½ is not > ½)
  CHECK(std::vector<token_t>(idx.begin(), idx.begin() + 3) == std::vector<token_t>{0, 2, 4});
  // Early exit: token 2 already exited, so it stays out; alive becomes "ran this layer".
  std::vector<token_t> alive = {1, 1, 0, 1, 1, 1};
  be.skip_select(std::span<token_t>(idx), std::span<token_t>(count), std::span<token_t>(alive), std::span<const float>(logits));
  REQUIRE(count[0] == 2);
  CHECK(std::vector<token_t>(idx.begin(), idx.begin() + 2) == std::vector<token_t>{0, 4});
  CHECK(alive == std::vector<token_t>{1, 0, 0, 0, 1, 0});
}

TEST_CASE("sigmoid_forward over the threads (a selection's 16384 scores): each element is the one-element formula's",
          "[depth][ops]") {
  Rng rng(9);
  const std::size_t n = 16384 + 3;
  const auto x = random_vec<float>(n, rng, -20, 20);
  std::vector<float> y(n);
  cpu::Backend<float>{}.sigmoid_forward(std::span<float>(y), std::span<const float>(x));
  for (std::size_t i = 0; i < n; ++i) REQUIRE(y[i] == 1.0f / (1.0f + std::exp(-x[i])));
  cpu::Backend<float>{}.sigmoid_forward(std::span<float>(y), std::span<const float>(y));  // in place
  for (std::size_t i = 0; i < n; ++i) REQUIRE(y[i] == 1.0f / (1.0f + std::exp(-(1.0f / (1.0f + std::exp(-x[i]))))));
}

TEST_CASE("sigmoid and BCE on logits: naive reference and finite-difference gradients", "[depth][ops]") {
  cpu::Backend<double> be;
  Rng rng(5);
  const std::size_t n = 37;
  auto x = random_vec<double>(n, rng, -4, 4);
  x[0] = 60;  // stable at large |l|
  x[1] = -60;
  std::vector<double> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = rng.uniform() > 0 ? 1.0 : 0.0;
  t[0] = 1, t[1] = 0;

  // sigmoid: forward and the backward of Σ c_i σ(x_i).
  const auto c = random_vec<double>(n, rng);
  std::vector<double> y(n), dx(n, 0.0);
  be.sigmoid_forward(std::span<double>(y), std::span<const double>(x));
  for (std::size_t i = 0; i < n; ++i) CHECK(y[i] == Approx(1 / (1 + std::exp(-x[i]))).epsilon(1e-14));
  be.sigmoid_backward(std::span<double>(dx), std::span<const double>(y), std::span<const double>(c));
  auto xs = x;
  const auto num = numeric_grad(xs, [&] {
    double s = 0;
    for (std::size_t i = 0; i < n; ++i) s += c[i] / (1 + std::exp(-xs[i]));
    return s;
  });
  CHECK(rel_error(dx, num) < fd_tol);

  // BCE: mean loss, number of correct decisions, gradient of coef · loss.
  std::vector<double> out(2);
  be.bce_logits_forward(std::span<double>(out), std::span<const double>(x), std::span<const double>(t));
  double want = 0, correct = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double p = 1 / (1 + std::exp(-x[i]));
    want += -(t[i] * std::log(std::max(p, 1e-300)) + (1 - t[i]) * std::log(std::max(1 - p, 1e-300)));
    correct += (x[i] > 0) == (t[i] > 0.5);
  }
  CHECK(out[0] == Approx(want / double(n)).epsilon(1e-12));
  CHECK(out[1] == correct);
  std::vector<double> dl(n, 0.0);
  const double coef = 0.3;
  be.bce_logits_backward(std::span<double>(dl), std::span<const double>(x), std::span<const double>(t), coef / double(n));
  xs = x;
  const auto num2 = numeric_grad(xs, [&] {
    std::vector<double> o(2);
    be.bce_logits_forward(std::span<double>(o), std::span<const double>(xs), std::span<const double>(t));
    return coef * o[0];
  });
  CHECK(rel_error(dl, num2) < fd_tol);
}

TEST_CASE("depth_choice_rows: token-choice MoR's run decision and update factor per recursion, and its backward",
          "[depth][ops]") {
  const std::vector<token_t> picks = {0, 2, 1, 2, 0};
  const std::vector<double> w = {0.5, 0.25, 0.75, 0.125, 0.9};
  std::vector<double> decision(5), coef(5);
  cpu::depth_choice_rows<double>(decision, coef, picks, w, 1);
  CHECK(decision == std::vector<double>{-1, 1, 1, 1, -1});        // runs recursion 1 iff its depth is >= 1
  CHECK(coef == std::vector<double>{1, 1, 0.75, 1, 1});          // weighted at its last recursion only
  cpu::depth_choice_rows<double>(decision, coef, picks, w, 2);
  CHECK(decision == std::vector<double>{-1, 1, -1, 1, -1});
  CHECK(coef == std::vector<double>{1, 0.25, 1, 0.125, 1});
  std::vector<double> dw = {1, 1, 1, 1, 1};
  cpu::depth_choice_rows_backward<double>(dw, std::vector<double>{3, 4, 5, 6, 7}, picks, 2);
  CHECK(dw == std::vector<double>{1, 5, 1, 7, 1});
  CHECK_THROWS_WITH(cpu::depth_choice_rows<double>(std::span<double>(decision).first(4), coef, picks, w, 0),
                    Catch::Contains("depth_choice_rows: decision 4"));
}

// AdamW (bias correction, decoupled weight decay, fused clipping) against hand-computed steps,
// and the global gradient norm against a naive sum.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include <mom/backend/cpu.hpp>

#include "ops/grad_check.hpp"

using namespace mom;
using namespace mom::test;

TEST_CASE("adamw_step: one and two steps match hand-computed values", "[ops][optim]") {
  const cpu::AdamWConfig cfg{.lr = 0.1, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.5};
  std::vector<double> p{1.0, -2.0}, m(2, 0.0), v(2, 0.0);
  const std::vector<double> g1{0.5, -0.25};
  cpu::adamw_step<double>(p, g1, m, v, cfg, 1);
  // Step 1: m = 0.1 g, v = 0.05 g²; m̂ = g, v̂ = g² -> update = g/|g| = sign(g) (up to eps).
  // p = 1 - 0.1 (1 + 0.5·1) = 0.85;  p = -2 - 0.1 (-1 + 0.5·(-2)) = -1.8.
  CHECK(m[0] == Approx(0.05).epsilon(1e-15));
  CHECK(v[1] == Approx(0.05 * 0.0625).epsilon(1e-15));
  CHECK(p[0] == Approx(0.85 - 0.1 * (0.5 / (0.5 + 1e-8) - 1)).epsilon(1e-14));
  CHECK(p[0] == Approx(0.85).epsilon(1e-7));
  CHECK(p[1] == Approx(-1.8).epsilon(1e-7));

  // Step 2 with g2 = (0.1, 0.3): hand-computed.
  const std::vector<double> g2{0.1, 0.3};
  cpu::adamw_step<double>(p, g2, m, v, cfg, 2);
  auto expect = [&](double p1, double gA, double gB) {
    const double m2 = 0.9 * (0.1 * gA) + 0.1 * gB;
    const double v2 = 0.95 * (0.05 * gA * gA) + 0.05 * gB * gB;
    const double mhat = m2 / (1 - 0.81), vhat = v2 / (1 - 0.9025);
    return p1 - 0.1 * (mhat / (std::sqrt(vhat) + 1e-8) + 0.5 * p1);
  };
  CHECK(p[0] == Approx(expect(0.85, 0.5, 0.1)).epsilon(1e-7));
  CHECK(p[1] == Approx(expect(-1.8, -0.25, 0.3)).epsilon(1e-7));
  // p[0]: m2 = 0.055, v2 = 0.012375; m̂ = 0.289474, v̂ = 0.126923 -> p = 0.85 - 0.1 (0.812527 + 0.425) = 0.726247.
  CHECK(p[0] == Approx(0.726247).epsilon(1e-5));
}

TEST_CASE("adamw_step: fused clipping scales the gradient by max_norm / norm", "[ops][optim]") {
  const cpu::AdamWConfig cfg{.lr = 0.01, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.0};
  std::vector<float> grads{3.f, 4.f};  // norm 5
  float norm = 0;
  cpu::grad_norm<float>(grads, &norm);
  CHECK(norm == Approx(5.0f));

  std::vector<float> p1{1.f, 1.f}, m1(2, 0.f), v1(2, 0.f), p2 = p1, m2 = m1, v2 = v1;
  cpu::adamw_step<float>(p1, grads, m1, v1, cfg, 1, &norm, 1.0f);  // clipped to norm 1
  const std::vector<float> scaled{0.6f, 0.8f};
  cpu::adamw_step<float>(p2, scaled, m2, v2, cfg, 1);  // the same gradient, clipped by hand
  CHECK(m1[0] == Approx(0.06f));
  CHECK(v1[1] == Approx(0.001 * 0.64).epsilon(1e-4));  // 1 - 0.999 is inexact in float
  CHECK(p1[0] == Approx(p2[0]).epsilon(1e-7));
  for (int i = 0; i < 2; ++i) {
    CHECK(m1[i] == Approx(m2[i]).epsilon(1e-6));
    CHECK(v1[i] == Approx(v2[i]).epsilon(1e-6));
  }

  // max_norm above the norm: no clipping.
  std::vector<float> p3{1.f, 1.f}, m3(2, 0.f), v3(2, 0.f);
  cpu::adamw_step<float>(p3, grads, m3, v3, cfg, 1, &norm, 10.0f);
  CHECK(m3[0] == Approx(0.3f));
}

TEST_CASE("adamw_step: a non-finite gradient norm skips the update", "[ops][optim]") {
  const cpu::AdamWConfig cfg{.lr = 0.01, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1};
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    std::vector<float> grads{bad, 1.f};
    float norm = 0;
    cpu::grad_norm<float>(grads, &norm);
    REQUIRE_FALSE(std::isfinite(norm));
    std::vector<float> p{1.f, 2.f}, m{0.1f, 0.2f}, v{0.3f, 0.4f};
    for (const float max_norm : {0.f, 1.f}) {  // with and without clipping
      cpu::adamw_step<float>(p, grads, m, v, cfg, 3, &norm, max_norm);
      CHECK(p == std::vector<float>{1.f, 2.f});
      CHECK(m == std::vector<float>{0.1f, 0.2f});
      CHECK(v == std::vector<float>{0.3f, 0.4f});
    }
  }
}

TEST_CASE("adamw_step: a gradient whose square overflows the second moment skips the update", "[ops][optim]") {
  // Without clipping, |g| = 2e19 makes g² = 4e38 > FLT_MAX: v would hold +Inf and the parameter would never
  // move again. adamw_skips refuses such a step; with clipping the same gradient is scaled down and applied.
  const cpu::AdamWConfig cfg{.lr = 0.01, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1};
  std::vector<float> grads{2e19f, 1.f};
  float norm = 0;
  cpu::grad_norm<float>(grads, &norm);
  REQUIRE(std::isfinite(norm));
  CHECK(cpu::adamw_skips(norm, 0.f));
  CHECK_FALSE(cpu::adamw_skips(norm, 1.f));
  CHECK_FALSE(cpu::adamw_skips(1e19f, 0.f));  // just below sqrt(FLT_MAX) = 1.84e19: applied
  CHECK(cpu::adamw_skips(std::numeric_limits<float>::infinity(), 1.f));
  CHECK(cpu::adamw_skips(std::numeric_limits<float>::quiet_NaN(), 0.f));
  std::vector<float> p{1.f, 2.f}, m{0.1f, 0.2f}, v{0.3f, 0.4f};
  cpu::adamw_step<float>(p, grads, m, v, cfg, 3, &norm, 0.f);
  CHECK(p == std::vector<float>{1.f, 2.f});
  CHECK(v == std::vector<float>{0.3f, 0.4f});
  cpu::adamw_step<float>(p, grads, m, v, cfg, 3, &norm, 1.f);
  CHECK(p != std::vector<float>{1.f, 2.f});
  for (float x : v) CHECK(std::isfinite(x));
}

TEST_CASE("grad_norm: matches a naive sum (parallel size, float and double)", "[ops][optim]") {
  Rng rng(60);
  const auto g = random_vec<float>(1000003, rng);
  double want = 0;
  for (float x : g) want += double(x) * x;
  want = std::sqrt(want);
  float got = 0;
  cpu::grad_norm<float>(g, &got);
  CHECK(got == Approx(want).epsilon(1e-6));
  std::vector<double> gd(g.begin(), g.end());
  double gotd = 0;
  cpu::grad_norm<double>(gd, &gotd);
  CHECK(gotd == Approx(want).epsilon(1e-12));
}

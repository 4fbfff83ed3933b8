// The run-time dispatched float math (backend/cpu/vecmath.hpp) against double references, on every
// instruction set this CPU has (the ISA follows cpu::set_gemm_kernel: avx512, avx2, eigen = 128-bit
// baseline): exp to ~1 ulp, GELU and its derivative to a small relative error everywhere (no cancellation
// where tanh is near -1), NaN propagated (a diverged step must stay visible), and a tail element computed
// exactly as the same value inside a full vector; log1p on [0, 1] to a few ulp, and the stick-breaking lane
// kernels (weights, σ, the spent-stick exit and their backward) against the double path of cpu/stick_breaking.hpp.
#include <catch2/catch.hpp>

#include <mom/backend/cpu.hpp>
#include <mom/backend/cpu/stick_breaking.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

using namespace mom;
namespace vm = mom::cpu::detail::vecmath;

namespace {
// References in double, in the form without cancellation (0.5·x·(1 + tanh u) loses every digit in double
// too once tanh u is within 1e-16 of -1): 1 + tanh u = 2σ(2u).
double sig2u(double x) { return 1 / (1 + std::exp(-2 * 0.7978845608028654 * (x + 0.044715 * x * x * x))); }
double gelu_ref(double x) { return x * sig2u(x); }
double gelu_grad_ref(double x) {
  const double s = sig2u(x);
  return s + 2 * x * s * (1 - s) * 0.7978845608028654 * (1 + 3 * 0.044715 * x * x);
}
}  // namespace

TEST_CASE("vecmath: exp, GELU and GELU' match double on every ISA of this CPU", "[ops][vecmath]") {
  const std::string best = cpu::gemm_kernel();
  int tested = 0;
  for (const char* kernel : {"avx512", "avx2", "eigen"}) {
    if (!cpu::set_gemm_kernel(kernel)) continue;
    ++tested;
    INFO("ISA " << kernel);
    // exp over the softmax range (x <= 0), n not a multiple of any vector width.
    std::vector<float> x;
    for (float v = -87.0f; v <= 0.0f; v += 0.0137f) x.push_back(v);
    x.push_back(0.0f);
    std::vector<float> y = x;
    const float sum = vm::exp_affine(y.data(), ssize(y), 0.5f, -1.25f);  // exp(0.5 x + 1.25)
    double ref_sum = 0, worst = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double r = std::exp(0.5 * double(x[i]) + 1.25);
      ref_sum += r;
      worst = std::max(worst, std::abs(double(y[i]) - r) / r);
    }
    CHECK(worst < 2.5e-7);
    CHECK(std::abs(double(sum) - ref_sum) / ref_sum < 1e-5);
    // GELU and its derivative over [-12, 12] (saturated tails included), relative to the value.
    std::vector<float> xs;
    for (float v = -12.0f; v <= 12.0f; v += 0.00173f) xs.push_back(v);
    std::vector<float> g(xs.size()), dx(xs.size(), 0.5f), dout(xs.size());
    for (std::size_t i = 0; i < xs.size(); ++i) dout[i] = float(1 + (i % 7)) * 0.25f;
    vm::gelu_forward(g.data(), xs.data(), ssize(xs));
    vm::gelu_backward(dx.data(), xs.data(), dout.data(), ssize(xs));
    // Relative error of GELU: ~1 ulp where |x| <= 3; in the far negative tail GELU ≈ x·exp(-2u) and the
    // float rounding of u (|2u| up to ~70 where GELU > 1e-30) is amplified |2u| times: ~1e-5 there, the
    // conditioning of the function in float, not of the kernel.
    double worst_core = 0, worst_tail = 0, worst_d = 0;
    for (std::size_t i = 0; i < xs.size(); ++i) {
      const double G = gelu_ref(xs[i]), D = 0.5 + double(dout[i]) * gelu_grad_ref(xs[i]);
      const double rel = std::abs(G) > 1e-30 ? std::abs(double(g[i]) - G) / std::abs(G) : 0.0;
      (std::abs(xs[i]) <= 3 ? worst_core : worst_tail) = std::max(std::abs(xs[i]) <= 3 ? worst_core : worst_tail, rel);
      worst_d = std::max(worst_d, std::abs(double(dx[i]) - D) / std::max(std::abs(D), 1e-3));
    }
    CHECK(worst_core < 1e-6);
    CHECK(worst_tail < 3e-5);
    CHECK(worst_d < 2e-6);
    // NaN stays NaN; +inf saturates exp at exp(88) (finite) and GELU(+inf) = +inf.
    float special[3] = {std::numeric_limits<float>::quiet_NaN(), 1.0f, 0.0f};
    vm::exp_affine(special, 3, 1.0f, 0.0f);
    CHECK(std::isnan(special[0]));
    CHECK(special[1] == Approx(std::exp(1.0)).epsilon(1e-6));
    float gin[2] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}, gout[2];
    vm::gelu_forward(gout, gin, 2);
    CHECK(std::isnan(gout[0]));
    CHECK(gout[1] == std::numeric_limits<float>::infinity());
    // A tail element is computed as the same value at the head of a full buffer (same instructions).
    for (index_t n = 1; n <= 37; ++n) {
      std::vector<float> head(64, 0.3f), tail(std::size_t(n), 0.3f);
      head[0] = tail[std::size_t(n - 1)] = -1.7f;
      vm::gelu_forward(head.data(), head.data(), 64);
      vm::gelu_forward(tail.data(), tail.data(), n);
      CHECK(tail[std::size_t(n - 1)] == head[0]);
    }
  }
  CHECK(tested >= 1);
  REQUIRE(cpu::set_gemm_kernel(best.c_str()));  // back to the default for the other tests
}

TEST_CASE("vecmath: log1p on [0, 1] to a few ulp (the source every ISA compiles)", "[ops][vecmath]") {
  namespace b = vm::baseline;
  double worst = 0;
  std::vector<float> e;
  for (float v = 0.0f; v <= 1.0f; v += 1.0f / 4099) e.push_back(v);
  for (float v = 1e-30f; v < 1e-3f; v *= 1.7f) e.push_back(v);  // where 1 + e rounds to 1 or near it
  e.push_back(1.0f);
  for (std::size_t i = 0; i + b::W <= e.size(); i += b::W) {
    const b::vf r = b::log1p_unit(b::load(e.data() + i));
    for (int l = 0; l < b::W; ++l) {
      const double want = std::log1p(double(e[i + std::size_t(l)]));
      worst = std::max(worst, want == 0 ? std::abs(double(r[l])) : std::abs(double(r[l]) - want) / want);
    }
  }
  CHECK(worst < 4e-7);
  CHECK(b::exp_or_zero(b::splat(-87.5f))[0] == 0.0f);  // below float's normal range: 0, not exp's clamp
  CHECK(b::exp_or_zero(b::splat(-80.0f))[0] == Approx(std::exp(-80.0)).epsilon(1e-6));
}

TEST_CASE("vecmath: stick-breaking lanes match the double path on every ISA of this CPU", "[ops][vecmath]") {
  // 16 key-major columns of 300 keys: queries ending at various keys (one column without a query), scores of a
  // few units (the weights spread over ~100 keys) and, in a second round, large positive ones (every stick spent
  // within a few keys: the early exit, all weights below it 0).
  namespace sb = mom::cpu::detail;
  const index_t keys = 300, ld = 32, L = sb::kStickBreakingLanes;
  std::int32_t top[16];
  for (index_t c = 0; c < L; ++c) top[c] = c == 5 ? -1 : std::int32_t(keys - 1 - 17 * c);
  const std::string best = cpu::gemm_kernel();
  int tested = 0;
  for (const char* kernel : {"avx512", "avx2", "eigen"}) {
    if (!cpu::set_gemm_kernel(kernel)) continue;
    ++tested;
    for (const double spread : {2.0, 40.0}) {
      INFO("ISA " << kernel << ", scores of spread " << spread);
      std::mt19937 rng(7);
      std::normal_distribution<double> nd(spread > 10 ? 20.0 : 0.0, spread);
      std::vector<double> zd(std::size_t(keys * ld)), gd(zd.size());
      for (auto& v : zd) v = nd(rng);
      for (auto& v : gd) v = nd(rng) / spread;
      std::vector<float> zf(zd.begin(), zd.end()), gf(gd.begin(), gd.end()), sf(zd.size());
      for (std::size_t i = 0; i < zd.size(); ++i) zd[i] = zf[i], gd[i] = gf[i];  // the same inputs
      std::vector<double> sd(zd.size());
      const std::vector<double> g_in = gd;
      const index_t jmax = keys - 1;
      const index_t lo_d = sb::stick_breaking_lanes<double>(zd.data(), sd.data(), ld, top, jmax);
      const index_t lo_f = sb::stick_breaking_lanes<float>(zf.data(), sf.data(), ld, top, jmax);
      sb::stick_breaking_lanes_backward<double>(gd.data(), zd.data(), sd.data(), ld, top, lo_d, jmax, 0.125);
      sb::stick_breaking_lanes_backward<float>(gf.data(), zf.data(), sf.data(), ld, top, lo_f, jmax, 0.125f);
      if (spread > 10) CHECK(lo_f > 0);  // the sticks were spent: the descent stopped early
      double worst_p = 0, worst_s = 0, worst_g = 0, gscale = 0;
      bool zeros = true;
      for (index_t j = 0; j < keys; ++j)
        for (index_t c = 0; c < L; ++c) {
          const std::size_t i = std::size_t(j * ld + c);
          if (j > top[c] || j < lo_f) zeros = zeros && zf[i] == 0.0f && sf[i] == 0.0f && gf[i] == 0.0f;
          // the suffix (up to ~110) rounds to float before the exp: ~1e-5 relative at the cutoff
          worst_p = std::max(worst_p, std::abs(double(zf[i]) - zd[i]) / std::max(zd[i], 1e-30));
          // σ where the float weight is 0 is not used (the prefix is 0 there too): the double path carries its
          // weights down to 1e-300 (cutoff 750), the float stops where they leave float's range
          if (zf[i] > 0) worst_s = std::max(worst_s, std::abs(double(sf[i]) - sd[i]));
          // dz = scale·(g p − σ Σ g p) cancels where σ ~ 1: its error is relative to the terms, not the result
          worst_g = std::max(worst_g, std::abs(double(gf[i]) - gd[i]));
          gscale = std::max(gscale, 0.125 * std::abs(double(g_in[i]) * zd[i]));
        }
      CHECK(zeros);
      CHECK(worst_p < 2e-5);
      CHECK(worst_s < 3e-7);
      CHECK(worst_g < 1e-5 * gscale);
    }
  }
  CHECK(tested >= 1);
  REQUIRE(cpu::set_gemm_kernel(best.c_str()));
}

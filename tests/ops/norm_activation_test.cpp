// layernorm, gelu, relu, add/axpy/scale: finite-difference gradients (double), float forward vs naive loops.
#include <catch2/catch.hpp>

#include <cmath>

#include <mom/backend/cpu.hpp>

#include "ops/grad_check.hpp"

using namespace mom;
using namespace mom::test;

namespace {
double gelu_ref(double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }
}  // namespace

TEST_CASE("layernorm: gradients match finite differences (double)", "[ops][layernorm]") {
  Rng rng(10);
  const index_t n = 4, d = 9;
  auto x = random_vec(n * d, rng, -2, 2), gamma = random_vec(d, rng, 0.5, 1.5), beta = random_vec(d, rng);
  const auto proj = random_vec(n * d, rng);
  std::vector<double> out(n * d), mean(n), rstd(n);
  auto loss = [&] {
    cpu::layernorm_forward<double>(mat(out, n, d), mean, rstd, cmat(x, n, d), gamma, beta);
    return dot(proj, out);
  };
  loss();
  std::vector<double> dx(n * d, 0.0), dgamma(d, 0.0), dbeta(d, 0.0);
  cpu::layernorm_backward<double>(mat(dx, n, d), dgamma, dbeta, cmat(proj, n, d), cmat(x, n, d), mean, rstd, gamma);
  CHECK(rel_error(dx, numeric_grad(x, loss)) < fd_tol);
  CHECK(rel_error(dgamma, numeric_grad(gamma, loss)) < fd_tol);
  CHECK(rel_error(dbeta, numeric_grad(beta, loss)) < fd_tol);
}

TEST_CASE("layernorm: float forward/backward match naive loops (parallel size)", "[ops][layernorm]") {
  Rng rng(11);
  const index_t n = 300, d = 200;
  auto x = random_vec<float>(n * d, rng, -3, 5), gamma = random_vec<float>(d, rng), beta = random_vec<float>(d, rng);
  std::vector<float> out(n * d), mean(n), rstd(n);
  cpu::layernorm_forward<float>(mat(out, n, d), mean, rstd, cmat(x, n, d), gamma, beta);
  std::vector<double> want(n * d), want_mean(n), want_rstd(n);
  for (index_t i = 0; i < n; ++i) {
    double mu = 0, var = 0;
    for (index_t c = 0; c < d; ++c) mu += x[i * d + c];
    mu /= d;
    for (index_t c = 0; c < d; ++c) var += (x[i * d + c] - mu) * (x[i * d + c] - mu);
    var /= d;
    const double rs = 1 / std::sqrt(var + 1e-5);
    want_mean[i] = mu;
    want_rstd[i] = rs;
    for (index_t c = 0; c < d; ++c) want[i * d + c] = (x[i * d + c] - mu) * rs * gamma[c] + beta[c];
  }
  CHECK(rel_error(out, want) < float_tol);
  CHECK(rel_error(mean, want_mean) < float_tol);
  CHECK(rel_error(rstd, want_rstd) < float_tol);

  // Backward: dgamma and dbeta are column sums over the rows (reduced across threads).
  auto dout = random_vec<float>(n * d, rng);
  std::vector<float> dx(n * d, 0.f), dgamma(d, 0.f), dbeta(d, 0.f);
  cpu::layernorm_backward<float>(mat(dx, n, d), dgamma, dbeta, cmat(dout, n, d), cmat(x, n, d), mean, rstd, gamma);
  std::vector<double> rdx(n * d), rdg(d, 0.0), rdb(d, 0.0);
  for (index_t i = 0; i < n; ++i) {
    double a = 0, b = 0;  // mean(dxhat), mean(dxhat * xhat)
    for (index_t c = 0; c < d; ++c) {
      const double xh = (x[i * d + c] - want_mean[i]) * want_rstd[i];
      const double g = double(dout[i * d + c]) * gamma[c];
      a += g / d;
      b += g * xh / d;
      rdg[c] += dout[i * d + c] * xh;
      rdb[c] += dout[i * d + c];
    }
    for (index_t c = 0; c < d; ++c) {
      const double xh = (x[i * d + c] - want_mean[i]) * want_rstd[i];
      rdx[i * d + c] = want_rstd[i] * (double(dout[i * d + c]) * gamma[c] - a - xh * b);
    }
  }
  CHECK(rel_error(dx, rdx) < float_tol);
  CHECK(rel_error(dgamma, rdg) < float_tol);
  CHECK(rel_error(dbeta, rdb) < float_tol);
}

TEST_CASE("gelu and relu: gradients match finite differences (double)", "[ops][activation]") {
  Rng rng(12);
  const std::size_t n = 40;
  auto x = random_vec(n, rng, -3, 3);
  for (auto& v : x)
    if (std::abs(v) < 1e-3) v = 0.5;  // keep relu away from its kink
  const auto proj = random_vec(n, rng);
  std::vector<double> out(n);
  SECTION("gelu") {
    auto loss = [&] {
      cpu::gelu_forward<double>(out, x);
      return dot(proj, out);
    };
    std::vector<double> dx(n, 0.0);
    cpu::gelu_backward<double>(dx, x, proj);
    CHECK(rel_error(dx, numeric_grad(x, loss)) < fd_tol);
  }
  SECTION("relu") {
    auto loss = [&] {
      cpu::relu_forward<double>(out, x);
      return dot(proj, out);
    };
    std::vector<double> dx(n, 0.0);
    cpu::relu_backward<double>(dx, x, proj);
    CHECK(rel_error(dx, numeric_grad(x, loss)) < fd_tol);
  }
}

TEST_CASE("gelu and relu: float forward matches naive loops (parallel size)", "[ops][activation]") {
  Rng rng(13);
  const std::size_t n = 200003;  // odd length: chunk tails
  auto x = random_vec<float>(n, rng, -6, 6);
  std::vector<float> g(n), r(n);
  cpu::gelu_forward<float>(g, x);
  cpu::relu_forward<float>(r, x);
  std::vector<double> wg(n), wr(n);
  for (std::size_t i = 0; i < n; ++i) {
    wg[i] = gelu_ref(x[i]);
    wr[i] = x[i] > 0 ? x[i] : 0.0;
  }
  CHECK(rel_error(g, wg) < float_tol);
  CHECK(rel_error(r, wr) == 0.0);
  CHECK(g[0] == Approx(gelu_ref(x[0])).epsilon(1e-5));
  // GELU's well-known values: gelu(0) = 0, gelu(1) = 0.841192 (tanh form).
  std::vector<float> pts{0.f, 1.f}, vals(2);
  cpu::gelu_forward<float>(vals, pts);
  CHECK(vals[0] == 0.f);
  CHECK(vals[1] == Approx(0.841192).epsilon(1e-5));
}

TEST_CASE("add, axpy, scale: values", "[ops][activation]") {
  std::vector<double> a{1, 2, 3}, b{10, 20, 30}, out(3);
  cpu::add_forward<double>(out, a, b);
  CHECK(out == std::vector<double>{11, 22, 33});
  cpu::axpy<double>(out, 2.0, a);
  CHECK(out == std::vector<double>{13, 26, 39});
  cpu::scale<double>(out, 0.5);
  CHECK(out == std::vector<double>{6.5, 13, 19.5});
  // add_forward's backward is two accumulates: check with axpy(alpha = 1) as a gradient sink.
  std::vector<double> da(3, 1.0);
  cpu::axpy<double>(da, 1.0, out);
  CHECK(da == std::vector<double>{7.5, 14, 20.5});
}

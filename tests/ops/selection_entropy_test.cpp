// selection_entropy_forward (cpu/routing.hpp): MoEUT's within-sequence regulariser (arXiv 2405.16039 eq. (4))
// and ModuleFormer's mutual-information loss and load concentration (arXiv 2306.04640 eqs. (7), (8)) against
// naive loops, their gradients against central differences in double, and the float op against the double one.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "mom/backend/cpu.hpp"
#include "ops/grad_check.hpp"
#include "ops/naive_selection.hpp"

using namespace mom;
using namespace mom::test;

namespace {
double naive_entropy(const std::vector<double>& z, index_t B, index_t T, index_t C, double coef) {
  return coef * naive::sequence_neg_entropy(z, B, T, C);
}
}  // namespace

TEST_CASE("selection_entropy_forward: the loss equals a naive loop and its gradient finite differences (double)",
          "[ops][routing][entropy]") {
  const index_t B = 3, T = 5, C = 7;
  const double coef = 0.3;
  Rng rng(4);
  std::vector<double> z = random_vec(std::size_t(B * T * C), rng, -2, 2), dz(z.size()), loss(1);
  cpu::Backend<double> be;
  be.selection_entropy_forward(std::span<double>(loss), mat(dz, B * T, C), cmat(z, B * T, C), B, T, coef);
  CHECK(std::abs(loss[0] - naive_entropy(z, B, T, C, coef)) < 1e-14);
  CHECK(loss[0] < 0);
  const std::vector<double> fd = numeric_grad(z, [&] { return naive_entropy(z, B, T, C, coef); });
  CHECK(rel_error(dz, fd) < fd_tol);
  // A uniform selection is the minimum: -log C per sequence, zero gradient.
  std::vector<double> flat(z.size(), 0.5);
  be.selection_entropy_forward(std::span<double>(loss), mat(dz, B * T, C), cmat(flat, B * T, C), B, T, coef);
  CHECK(loss[0] == Approx(-coef * std::log(double(C))).epsilon(1e-14));
  for (double g : dz) CHECK(std::abs(g) < 1e-15);
}

namespace {
// ModuleFormer over the batch's n tokens: a·Σ_m p(m) log p(m) + b·(1/n) Σ_x Σ_m g log g, g = softmax(z_x).
double naive_mi(const std::vector<double>& z, index_t n, index_t C, double a, double b) {
  std::vector<double> p(std::size_t(C), 0.0);
  double cond = 0;
  for (index_t x = 0; x < n; ++x) {
    const double* r = &z[std::size_t(x * C)];
    double mx = r[0], s = 0;
    for (index_t e = 1; e < C; ++e) mx = std::max(mx, r[e]);
    for (index_t e = 0; e < C; ++e) s += std::exp(r[e] - mx);
    for (index_t e = 0; e < C; ++e) {
      const double g = std::exp(r[e] - mx) / s;
      p[std::size_t(e)] += g / double(n);
      cond += g * std::log(g);
    }
  }
  double marg = 0;
  for (double pe : p) marg += pe * std::log(pe);
  return a * marg + b * cond / double(n);
}
}  // namespace

TEST_CASE("selection_entropy_forward: ModuleFormer's mutual-information loss -H(m) + H(m|x) and load concentration H(m)",
          "[ops][routing][entropy]") {
  const index_t n = 12, C = 5;
  Rng rng(8);
  std::vector<double> z = random_vec(std::size_t(n * C), rng, -2, 2), dz(z.size()), loss(1);
  cpu::Backend<double> be;
  for (const auto& [a, b] : {std::pair{0.2, -0.2}, std::pair{-0.3, 0.0}, std::pair{0.0, 0.7}}) {
    INFO("marginal coefficient " << a << ", conditional " << b);
    be.selection_entropy_forward(std::span<double>(loss), mat(dz, n, C), cmat(z, n, C), 1, n, a, b);
    CHECK(std::abs(loss[0] - naive_mi(z, n, C, a, b)) < 1e-14);
    const std::vector<double> fd = numeric_grad(z, [&] { return naive_mi(z, n, C, a, b); });
    CHECK(rel_error(dz, fd) < fd_tol);
  }
  // The mutual information is at most log C and at least 0: L_MI = −MI in [−log C, 0]; one-hot rows that
  // spread evenly over the classes reach −log C.
  be.selection_entropy_forward(std::span<double>(loss), mat(dz, n, C), cmat(z, n, C), 1, n, 1.0, -1.0);
  CHECK(loss[0] <= 1e-12);
  CHECK(loss[0] >= -std::log(double(C)));
  std::vector<double> sharp(std::size_t(10 * C), -40.0);
  for (index_t x = 0; x < 10; ++x) sharp[std::size_t(x * C + x % C)] = 40.0;
  be.selection_entropy_forward(std::span<double>(loss), mat(dz, 10, C), cmat(sharp, 10, C), 1, 10, 1.0, -1.0);
  CHECK(loss[0] == Approx(-std::log(double(C))).epsilon(1e-9));
}

TEST_CASE("selection_entropy_forward: float agrees with double, wrong shapes are one-line errors", "[ops][routing][entropy]") {
  // Selections as wide as σ-MoE's (vectorised exp) and as SwitchHead's (fewer columns than a vector), with and
  // without ModuleFormer's conditional term.
  const index_t B = 2, T = 9, C = 33;
  Rng rng(5);
  cpu::Backend<float> bf;
  for (const index_t c : {C, index_t(4)})
    for (const double cond : {0.0, -0.02}) {
      INFO(c << " columns, cond_coef " << cond);
      const std::vector<double> z = random_vec(std::size_t(B * T * c), rng, -3, 3);
      std::vector<float> zf(z.begin(), z.end()), dzf(z.size()), lf(1);
      std::vector<double> dz(z.size()), l(1);
      cpu::Backend<double>{}.selection_entropy_forward(std::span<double>(l), mat(dz, B * T, c), cmat(z, B * T, c), B, T,
                                                       0.01, cond);
      bf.selection_entropy_forward(std::span<float>(lf), mat(dzf, B * T, c), cmat(zf, B * T, c), B, T, 0.01f, float(cond));
      CHECK(std::abs(double(lf[0]) - l[0]) < float_tol * std::abs(l[0]));
      CHECK(rel_error(dzf, dz) < float_tol);
    }
  {  // logits as a column block of a wider matrix (SwitchHead's selections read theirs in place): the same bits
    const index_t wide = C + 5;
    const std::vector<double> zd = random_vec(std::size_t(B * T * wide), rng, -3, 3);
    const std::vector<float> zw(zd.begin(), zd.end());
    std::vector<float> zc(std::size_t(B * T * C)), d_in_place(zc.size()), d_copy(zc.size()), l_in_place(1), l_copy(1);
    for (index_t r = 0; r < B * T; ++r) std::copy_n(zw.data() + r * wide + 2, C, zc.data() + r * C);
    bf.selection_entropy_forward(std::span<float>(l_in_place), mat(d_in_place, B * T, C),
                                 MatrixView<const float>{zw.data() + 2, B * T, C, wide}, B, T, 0.01f);
    bf.selection_entropy_forward(std::span<float>(l_copy), mat(d_copy, B * T, C), cmat(zc, B * T, C), B, T, 0.01f);
    CHECK(l_in_place == l_copy);
    CHECK(d_in_place == d_copy);
  }
  std::vector<float> zf(std::size_t(B * T * C)), dzf(zf.size()), lf(1);
  CHECK_THROWS_WITH(bf.selection_entropy_forward(std::span<float>(lf), mat(dzf, B * T, C), cmat(zf, B * T, C), B, T + 1, 0.01f),
                    Catch::Contains("selection_entropy_forward: logits [18x33]"));
}

TEST_CASE("router_z_loss_forward (ST-MoE): the loss equals a naive loop and its gradient finite differences",
          "[ops][routing][zloss]") {
  const index_t n = 9, C = 6;
  const double coef = 0.05, inv_temp = 2.0;
  Rng rng(12);
  std::vector<double> z = random_vec(std::size_t(n * C), rng, -3, 3), dz(z.size()), loss(1);
  auto naive_z = [&] {  // coef · mean over rows of (log Σ exp(inv_temp·z))², written as it reads
    double s = 0;
    for (index_t r = 0; r < n; ++r) {
      double sum = 0;
      for (index_t e = 0; e < C; ++e) sum += std::exp(inv_temp * z[std::size_t(r * C + e)]);
      s += std::pow(std::log(sum), 2);
    }
    return coef * s / double(n);
  };
  cpu::Backend<double> be;
  be.router_z_loss_forward(std::span<double>(loss), mat(dz, n, C), cmat(z, n, C), inv_temp, coef);
  CHECK(loss[0] == Approx(naive_z()).epsilon(1e-14));
  CHECK(rel_error(dz, numeric_grad(z, naive_z)) < fd_tol);
  // Large logits stay finite (the max is subtracted before exp).
  std::vector<double> big(z.size(), 400.0);
  be.router_z_loss_forward(std::span<double>(loss), mat(dz, n, C), cmat(big, n, C), inv_temp, coef);
  CHECK(loss[0] == Approx(coef * std::pow(800.0 + std::log(double(C)), 2)).epsilon(1e-12));
  std::vector<double> bad(std::size_t(n * (C + 1)));
  CHECK_THROWS_WITH(be.router_z_loss_forward(std::span<double>(loss), mat(bad, n, C + 1), cmat(z, n, C), 1.0, coef),
                    Catch::StartsWith("router_z_loss_forward: logits [9x6], dlogits [9x7]"));
}

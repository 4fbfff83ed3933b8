// GRU cell (PyTorch convention, gate order r, z, n): finite-difference gradients (double) and a
// hand-written reference of torch.nn.GRUCell in float.
#include <catch2/catch.hpp>

#include <cmath>

#include <mom/backend/cpu.hpp>

#include "ops/grad_check.hpp"

using namespace mom;
using namespace mom::test;

namespace {
// torch.nn.GRUCell, written out: rows of w_ih / w_hh / biases are [W_r; W_z; W_n].
std::vector<double> torch_gru_cell(const std::vector<float>& x, const std::vector<float>& h,
                                   const std::vector<float>& w_ih, const std::vector<float>& w_hh,
                                   const std::vector<float>& b_ih, const std::vector<float>& b_hh, index_t n,
                                   index_t I, index_t H) {
  auto sigmoid = [](double a) { return 1 / (1 + std::exp(-a)); };
  std::vector<double> out(n * H);
  for (index_t s = 0; s < n; ++s)
    for (index_t j = 0; j < H; ++j) {
      double gi[3], gh[3];
      for (int g = 0; g < 3; ++g) {
        gi[g] = b_ih[g * H + j];
        gh[g] = b_hh[g * H + j];
        for (index_t c = 0; c < I; ++c) gi[g] += double(w_ih[(g * H + j) * I + c]) * x[s * I + c];
        for (index_t c = 0; c < H; ++c) gh[g] += double(w_hh[(g * H + j) * H + c]) * h[s * H + c];
      }
      const double r = sigmoid(gi[0] + gh[0]);
      const double z = sigmoid(gi[1] + gh[1]);
      const double nn = std::tanh(gi[2] + r * gh[2]);
      out[s * H + j] = (1 - z) * nn + z * h[s * H + j];
    }
  return out;
}
}  // namespace

TEST_CASE("gru_cell: gradients match finite differences (double)", "[ops][gru]") {
  Rng rng(50);
  const index_t n = 3, I = 4, H = 5;
  auto x = random_vec(n * I, rng), h = random_vec(n * H, rng);
  auto w_ih = random_vec(3 * H * I, rng), w_hh = random_vec(3 * H * H, rng);
  auto b_ih = random_vec(3 * H, rng), b_hh = random_vec(3 * H, rng);
  const auto proj = random_vec(n * H, rng);
  std::vector<double> h_out(n * H), gates(n * 6 * H);
  auto loss = [&] {
    cpu::gru_cell_forward<double>(mat(h_out, n, H), mat(gates, n, 6 * H), cmat(x, n, I), cmat(h, n, H),
                                  cmat(w_ih, 3 * H, I), cmat(w_hh, 3 * H, H), b_ih, b_hh);
    return dot(proj, h_out);
  };
  loss();
  std::vector<double> dx(n * I, 0.0), dh(n * H, 0.0), dw_ih(3 * H * I, 0.0), dw_hh(3 * H * H, 0.0), db_ih(3 * H, 0.0),
      db_hh(3 * H, 0.0), scratch(n * 6 * H);
  cpu::gru_cell_backward<double>(mat(dx, n, I), mat(dh, n, H), mat(dw_ih, 3 * H, I), mat(dw_hh, 3 * H, H), db_ih, db_hh,
                                 mat(scratch, n, 6 * H), cmat(proj, n, H), cmat(gates, n, 6 * H), cmat(x, n, I),
                                 cmat(h, n, H), cmat(w_ih, 3 * H, I), cmat(w_hh, 3 * H, H));
  CHECK(rel_error(dx, numeric_grad(x, loss)) < fd_tol);
  CHECK(rel_error(dh, numeric_grad(h, loss)) < fd_tol);
  CHECK(rel_error(dw_ih, numeric_grad(w_ih, loss)) < fd_tol);
  CHECK(rel_error(dw_hh, numeric_grad(w_hh, loss)) < fd_tol);
  CHECK(rel_error(db_ih, numeric_grad(b_ih, loss)) < fd_tol);
  CHECK(rel_error(db_hh, numeric_grad(b_hh, loss)) < fd_tol);
}

TEST_CASE("gru_cell: float forward matches a hand-written torch.nn.GRUCell, gates saved", "[ops][gru]") {
  Rng rng(51);
  const index_t n = 40, I = 24, H = 16;
  auto x = random_vec<float>(n * I, rng), h = random_vec<float>(n * H, rng);
  auto w_ih = random_vec<float>(3 * H * I, rng, -0.3, 0.3), w_hh = random_vec<float>(3 * H * H, rng, -0.3, 0.3);
  auto b_ih = random_vec<float>(3 * H, rng), b_hh = random_vec<float>(3 * H, rng);
  std::vector<float> h_out(n * H), gates(n * 6 * H);
  cpu::gru_cell_forward<float>(mat(h_out, n, H), mat(gates, n, 6 * H), cmat(x, n, I), cmat(h, n, H),
                               cmat(w_ih, 3 * H, I), cmat(w_hh, 3 * H, H), b_ih, b_hh);
  CHECK(rel_error(h_out, torch_gru_cell(x, h, w_ih, w_hh, b_ih, b_hh, n, I, H)) < float_tol);
  // gates row 0, column H (the z block of x·w_ihᵀ + b_ih) and column 3H + 2H (n block of h·w_hhᵀ + b_hh).
  double gi_z = b_ih[H], gh_n = b_hh[2 * H];
  for (index_t c = 0; c < I; ++c) gi_z += double(w_ih[H * I + c]) * x[c];
  for (index_t c = 0; c < H; ++c) gh_n += double(w_hh[2 * H * H + c]) * h[c];
  CHECK(gates[H] == Approx(gi_z).epsilon(1e-5));
  CHECK(gates[3 * H + 2 * H] == Approx(gh_n).epsilon(1e-5));

  SECTION("z = 1 copies h (update gate saturated), z = 0 gives the candidate") {
    std::vector<float> b_sat = b_ih;
    for (index_t j = 0; j < H; ++j) b_sat[H + j] = 100.f;  // z -> 1
    cpu::gru_cell_forward<float>(mat(h_out, n, H), mat(gates, n, 6 * H), cmat(x, n, I), cmat(h, n, H),
                                 cmat(w_ih, 3 * H, I), cmat(w_hh, 3 * H, H), b_sat, b_hh);
    CHECK(rel_error(h_out, h) < 1e-6);
  }
}

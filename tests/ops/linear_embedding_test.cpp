// linear and embedding: finite-difference gradients (double), float forward vs naive loops.
#include <catch2/catch.hpp>

#include <cmath>

#include <mom/backend/cpu.hpp>

#include "ops/grad_check.hpp"

using namespace mom;
using namespace mom::test;

namespace {
std::vector<double> minus(std::vector<double> v, double c) {
  for (auto& x : v) x -= c;
  return v;
}
}  // namespace

TEST_CASE("linear: gradients match finite differences (double)", "[ops][linear]") {
  Rng rng(1);
  const index_t n = 5, in = 7, out = 4;
  auto x = random_vec(n * in, rng), w = random_vec(out * in, rng), b = random_vec(out, rng);
  const auto proj = random_vec(n * out, rng);
  std::vector<double> y(n * out);
  auto loss = [&] {
    cpu::linear_forward<double>(mat(y, n, out), cmat(x, n, in), cmat(w, out, in), b);
    return dot(proj, y);
  };
  // Gradients start at 0.25 to prove the backward accumulates rather than overwrites.
  std::vector<double> dx(n * in, 0.25), dw(out * in, 0.25), db(out, 0.25);
  cpu::linear_backward<double>(mat(dx, n, in), mat(dw, out, in), db, cmat(proj, n, out), cmat(x, n, in),
                               cmat(w, out, in));
  CHECK(rel_error(minus(dx, 0.25), numeric_grad(x, loss)) < fd_tol);
  CHECK(rel_error(minus(dw, 0.25), numeric_grad(w, loss)) < fd_tol);
  CHECK(rel_error(minus(db, 0.25), numeric_grad(b, loss)) < fd_tol);

  SECTION("no bias, dx and db not wanted") {
    std::vector<double> dw2(out * in, 0.0);
    auto loss_nb = [&] {
      cpu::linear_forward<double>(mat(y, n, out), cmat(x, n, in), cmat(w, out, in), {});
      return dot(proj, y);
    };
    cpu::linear_backward<double>({}, mat(dw2, out, in), {}, cmat(proj, n, out), cmat(x, n, in), cmat(w, out, in));
    CHECK(rel_error(dw2, numeric_grad(w, loss_nb)) < fd_tol);
  }
}

TEST_CASE("linear: float forward matches a naive loop, strided output", "[ops][linear]") {
  Rng rng(2);
  const index_t n = 33, in = 70, out = 45, ld = 50;
  auto x = random_vec<float>(n * in, rng), w = random_vec<float>(out * in, rng), b = random_vec<float>(out, rng);
  std::vector<float> wide(n * ld, -7.0f);  // y is columns [0, out) of a wider [n x ld] matrix
  cpu::linear_forward<float>(MatrixView<float>(wide.data(), n, out, ld), cmat(x, n, in), cmat(w, out, in), b);
  std::vector<float> got, want;
  for (index_t i = 0; i < n; ++i)
    for (index_t o = 0; o < out; ++o) {
      double s = b[o];
      for (index_t k = 0; k < in; ++k) s += double(x[i * in + k]) * w[o * in + k];
      want.push_back(float(s));
      got.push_back(wide[i * ld + o]);
    }
  CHECK(rel_error(got, want) < float_tol);
  CHECK(wide[0 * ld + out] == -7.0f);  // the columns past the view are untouched
  CHECK(wide[(n - 1) * ld + ld - 1] == -7.0f);

  SECTION("backward vs naive loops") {
    auto dy = random_vec<float>(n * out, rng);
    std::vector<float> dx(n * in, 0.f), dw(out * in, 0.f), db(out, 0.f);
    cpu::linear_backward<float>(mat(dx, n, in), mat(dw, out, in), db, cmat(dy, n, out), cmat(x, n, in),
                                cmat(w, out, in));
    std::vector<double> rdx(n * in, 0.0), rdw(out * in, 0.0), rdb(out, 0.0);
    for (index_t i = 0; i < n; ++i)
      for (index_t o = 0; o < out; ++o) {
        rdb[o] += dy[i * out + o];
        for (index_t k = 0; k < in; ++k) {
          rdx[i * in + k] += double(dy[i * out + o]) * w[o * in + k];
          rdw[o * in + k] += double(dy[i * out + o]) * x[i * in + k];
        }
      }
    CHECK(rel_error(dx, rdx) < float_tol);
    CHECK(rel_error(dw, rdw) < float_tol);
    CHECK(rel_error(db, rdb) < float_tol);
  }
}

// Store::overwrite on the backend's linear_backward: dx = dy·w whatever dx held (NaN here, never read), the same
// values as += onto zeros; dw still accumulates.
TEST_CASE("linear_backward: Store::overwrite writes dx without reading it, dw still accumulates", "[ops][linear]") {
  Rng rng(47);
  const index_t n = 5, in = 4, out = 3;
  const auto x = random_vec(n * in, rng), w = random_vec(out * in, rng), dy = random_vec(n * out, rng);
  const cpu::Backend<double> be;
  std::vector<double> dx_ref(n * in, 0.0), dw_ref(out * in, 0.25), dx(n * in, std::nan("")), dw(dw_ref);
  be.linear_backward(mat(dx_ref, n, in), mat(dw_ref, out, in), {}, cmat(dy, n, out), cmat(x, n, in), cmat(w, out, in));
  be.linear_backward(mat(dx, n, in), mat(dw, out, in), {}, cmat(dy, n, out), cmat(x, n, in), cmat(w, out, in),
                     Store::overwrite);
  CHECK(dx == dx_ref);
  CHECK(dw == dw_ref);
  CHECK(dw[0] != 0.25);  // accumulated onto its 0.25
}

TEST_CASE("embedding: gradients match finite differences (double)", "[ops][embedding]") {
  Rng rng(3);
  const index_t V = 6, C = 5, d = 4, batch = 2, seq = 4;
  auto wte = random_vec(V * d, rng), wpe = random_vec(C * d, rng);
  const std::vector<token_t> tokens{1, 3, 3, 0, 5, 1, 1, 2};  // repeats: gradients must add up
  const auto proj = random_vec(batch * seq * d, rng);
  std::vector<double> out(batch * seq * d);
  auto loss = [&] {
    cpu::embedding_forward<double>(mat(out, batch * seq, d), tokens, cmat(wte, V, d), cmat(wpe, C, d), seq);
    return dot(proj, out);
  };
  std::vector<double> dwte(V * d, 0.0), dwpe(C * d, 0.0);
  cpu::embedding_backward<double>(mat(dwte, V, d), mat(dwpe, C, d), cmat(proj, batch * seq, d), tokens, seq);
  CHECK(rel_error(dwte, numeric_grad(wte, loss)) < fd_tol);
  CHECK(rel_error(dwpe, numeric_grad(wpe, loss)) < fd_tol);
  // Unused vocabulary row 4 and unused position 4 get exactly zero gradient.
  for (index_t c = 0; c < d; ++c) {
    CHECK(dwte[4 * d + c] == 0.0);
    CHECK(dwpe[4 * d + c] == 0.0);
  }
}

TEST_CASE("embedding: float forward and backward match naive loops (parallel size)", "[ops][embedding]") {
  Rng rng(4);
  const index_t V = 50, C = 64, d = 300, batch = 3, seq = 64, n = batch * seq;
  auto wte = random_vec<float>(V * d, rng), wpe = random_vec<float>(C * d, rng);
  std::vector<token_t> tokens(n);
  for (auto& t : tokens) t = rng.integer(0, int(V) - 1);
  std::vector<float> out(n * d);
  cpu::embedding_forward<float>(mat(out, n, d), tokens, cmat(wte, V, d), cmat(wpe, C, d), seq);
  std::vector<float> want(n * d);
  for (index_t t = 0; t < n; ++t)
    for (index_t c = 0; c < d; ++c) want[t * d + c] = wte[tokens[t] * d + c] + wpe[(t % seq) * d + c];
  CHECK(rel_error(out, want) == 0.0);
  // Rows at positions of their own (a decode step's): row t at pos[t], here counting down.
  std::vector<index_t> pos(n);
  for (index_t t = 0; t < n; ++t) pos[t] = (n - 1 - t) % C;
  cpu::embedding_forward<float>(mat(out, n, d), tokens, cmat(wte, V, d), cmat(wpe, C, d), std::span<const index_t>(pos));
  for (index_t t = 0; t < n; ++t)
    for (index_t c = 0; c < d; ++c) want[t * d + c] = wte[tokens[t] * d + c] + wpe[pos[t] * d + c];
  CHECK(rel_error(out, want) == 0.0);
  // No wpe (a RoPE model): the token rows alone, positions not read.
  cpu::embedding_forward<float>(mat(out, n, d), tokens, cmat(wte, V, d), MatrixView<const float>{},
                                std::span<const index_t>(pos));
  for (index_t t = 0; t < n; ++t)
    for (index_t c = 0; c < d; ++c) want[t * d + c] = wte[tokens[t] * d + c];
  CHECK(rel_error(out, want) == 0.0);

  auto dout = random_vec<float>(n * d, rng);
  std::vector<float> dwte(V * d, 0.f), dwpe(C * d, 0.f);
  cpu::embedding_backward<float>(mat(dwte, V, d), mat(dwpe, C, d), cmat(dout, n, d), tokens, seq);
  std::vector<double> rwte(V * d, 0.0), rwpe(C * d, 0.0);
  for (index_t t = 0; t < n; ++t)
    for (index_t c = 0; c < d; ++c) {
      rwte[tokens[t] * d + c] += dout[t * d + c];
      rwpe[(t % seq) * d + c] += dout[t * d + c];
    }
  CHECK(rel_error(dwte, rwte) < float_tol);
  CHECK(rel_error(dwpe, rwpe) < float_tol);
}

// selection_entropy_forward (cpu/routing.hpp, cuda/kernels/routing.cuh): cuda::Backend<T> against
// cpu::Backend<T> on the same random logits, for MoEUT's within-sequence regulariser (several sequences,
// conditional coefficient 0) and ModuleFormer's mutual-information loss (one "sequence" of all the batch's
// tokens, conditional coefficient −γ). Tolerances (relative): double 1e-12, float 2e-5.
// Without a CUDA device every case prints "no CUDA device: skipped" once and passes.
#include <catch2/catch.hpp>

#include <array>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda/cuda_test_support.hpp"

using namespace mom;
using namespace mom::test;

TEMPLATE_TEST_CASE("selection entropy regularisers match cpu (MoEUT per sequence, ModuleFormer mutual information)",
                   "[cuda][entropy]", float, double) {
  MOM_REQUIRE_GPU();
  using T = TestType;
  const double tol = std::is_same_v<T, double> ? 1e-12 : 2e-5;
  test::Rng rng(31);
  struct Case {
    index_t batch, seq, C;
    double coef, cond;
  };
  // A sequence's rows in chunks of at least 64 on blocks of their own: one chunk (17, 64 rows), several with a
  // ragged last one (300 rows: 5 chunks of 60; 1000 rows: 16 chunks of 63, the last of 55).
  for (const Case c : {Case{3, 17, 43, 0.01, 0.0}, Case{1, 64, 9, 0.05, -0.05}, Case{2, 300, 4, -0.2, 0.0},
                       Case{1, 1000, 16, 0.05, -0.05}}) {
    INFO("batch " << c.batch << " seq " << c.seq << " classes " << c.C << " coefficients " << c.coef << ", " << c.cond);
    const index_t n = c.batch * c.seq;
    auto logits = rand_arr<T>(n * c.C, rng, -3, 3);
    auto dlogits = rand_arr<T>(n * c.C, rng), loss = rand_arr<T>(1, rng);
    host<T>().selection_entropy_forward(loss.hs(), dlogits.hm(n, c.C), logits.hm(n, c.C), c.batch, c.seq, T(c.coef),
                                        T(c.cond));
    gpu<T>().selection_entropy_forward(loss.ds(), dlogits.dm(n, c.C), logits.dm(n, c.C), c.batch, c.seq, T(c.coef),
                                       T(c.cond));
    CHECK(test::rel_error(loss.fetch(), loss.h) <= tol);
    CHECK(test::rel_error(dlogits.fetch(), dlogits.h) <= tol);
  }
}

TEMPLATE_TEST_CASE("router z-loss matches cpu (rows spread over blocks, temperature)", "[cuda][entropy][zloss]", float,
                   double) {
  MOM_REQUIRE_GPU();
  using T = TestType;
  const double tol = std::is_same_v<T, double> ? 1e-12 : 2e-5;
  test::Rng rng(32);
  for (const auto [n, C] : {std::array<index_t, 2>{5, 3}, std::array<index_t, 2>{700, 9}, std::array<index_t, 2>{4096, 17}}) {
    INFO("rows " << n << " classes " << C);
    auto logits = rand_arr<T>(n * C, rng, -4, 4);
    auto dlogits = rand_arr<T>(n * C, rng), loss = rand_arr<T>(1, rng);
    host<T>().router_z_loss_forward(loss.hs(), dlogits.hm(n, C), logits.hm(n, C), T(0.5), T(1e-3));
    gpu<T>().router_z_loss_forward(loss.ds(), dlogits.dm(n, C), logits.dm(n, C), T(0.5), T(1e-3));
    CHECK(test::rel_error(loss.fetch(), loss.h) <= tol);
    CHECK(test::rel_error(dlogits.fetch(), dlogits.h) <= tol);
  }
}

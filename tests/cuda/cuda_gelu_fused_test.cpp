// The FFN's GELU fused into its products (backend_concept.hpp, FusesGelu; cuda::Backend's linear_forward_gelu and
// linear_backward_dgelu on cuBLASLt's GELU_AUX_BIAS and DGELU epilogues, ops.hpp): the fused ops must give what the
// separate ops give on the same backend (linear_forward then gelu_forward; linear_backward into d(pre) then
// gelu_backward), and the CPU's separate ops within the precision's tolerance. Under the emulation the fused path is
// the one that ran: a float forward in FP32 / TF32 launches no kernel (the GELU is in the product), a backward only
// the bias gradient's column sums; where cuBLASLt has no algorithm (mom_emu_lt_refuse) the ops fall back.
#include <catch2/catch.hpp>

#include <span>
#include <string>
#include <vector>

#include "cuda/cuda_test_support.hpp"

using namespace mom;
using namespace mom::test;

namespace {

static_assert(FusesGelu<cuda::Backend<float>, float> && FusesGelu<cuda::Backend<double>, double>);
static_assert(!FusesGelu<cpu::Backend<float>, float>);  // the CPU runs the two ops (the FFN's other branch)

template <class T>
double close(const std::vector<T>& got, const std::vector<T>& want) {
  return test::rel_error(got, want);
}

template <class T>
void check_fused(cuda::Precision precision, bool refuse, double tol_same, double tol_cpu) {
  cuda::Backend<T> be;  // a fresh one: no cuBLASLt plan made yet (mom_emu_lt_refuse acts on the plans' heuristics)
  be.set_precision(precision);
  gpu<T>().sync();
  test::Rng rng(31);
  const index_t n = 37, in = 40, f = 48;  // pre [n × f] = x [n × in] · w_fcᵀ + b; proj: f -> in
  auto x = rand_arr<T>(n * in, rng), w = rand_arr<T>(f * in, rng), b = rand_arr<T>(f, rng);
  auto pre = rand_arr<T>(n * f, rng), act = rand_arr<T>(n * f, rng), pre2 = rand_arr<T>(n * f, rng),
       act2 = rand_arr<T>(n * f, rng);
  using CM = MatrixView<const T>;
  const bool counted = mom_emu_launches && mom_emu_gemm_calls;
  if (refuse) mom_emu_lt_refuse(1);
  be.sync();
  const auto before = counted ? test::EmuCounters::now() : test::EmuCounters{};
  be.linear_forward_gelu(pre.dm(n, f), act.dm(n, f), CM(x.dm(n, in)), CM(w.dm(f, in)), std::span<const T>(b.ds()));
  be.sync();
  const auto forward = counted ? test::EmuCounters::now() - before : test::EmuCounters{};
  be.linear_forward(pre2.dm(n, f), CM(x.dm(n, in)), CM(w.dm(f, in)), std::span<const T>(b.ds()));
  be.gelu_forward(act2.ds(), std::span<const T>(pre2.ds()));
  const auto got_pre = pre.fetch(), got_act = act.fetch(), sep_pre = pre2.fetch(), sep_act = act2.fetch();
  CHECK(close(got_pre, sep_pre) <= tol_same);
  CHECK(close(got_act, sep_act) <= tol_same);
  host<T>().linear_forward(pre.hm(n, f), CM(x.hm(n, in)), CM(w.hm(f, in)), std::span<const T>(b.hs()));
  host<T>().gelu_forward(act.hs(), std::span<const T>(pre.hs()));
  CHECK(close(got_pre, pre.h) <= tol_cpu);
  CHECK(close(got_act, act.h) <= tol_cpu);

  // The proj linear's backward (dy [n × in], w_proj [in × f], its input act) and the GELU's, from the forward's pre.
  auto wp = rand_arr<T>(in * f, rng), dy = rand_arr<T>(n * in, rng);
  auto dpre = rand_arr<T>(n * f, rng), dw = rand_arr<T>(in * f, rng), db = rand_arr<T>(in, rng);
  auto dpre2 = rand_arr<T>(n * f, rng), dact = rand_arr<T>(n * f, rng);
  Arr<T> dw2(dw.h), db2(db.h);  // the same initial gradients
  be.sync();
  const auto before_b = counted ? test::EmuCounters::now() : test::EmuCounters{};
  be.linear_backward_dgelu(dpre.dm(n, f), dw.dm(in, f), db.ds(), CM(dy.dm(n, in)), CM(act.dm(n, f)),
                           CM(wp.dm(in, f)), CM(pre.dm(n, f)));
  be.sync();
  const auto backward = counted ? test::EmuCounters::now() - before_b : test::EmuCounters{};
  if (refuse) mom_emu_lt_refuse(0);
  be.linear_backward(dact.dm(n, f), dw2.dm(in, f), db2.ds(), CM(dy.dm(n, in)), CM(act.dm(n, f)), CM(wp.dm(in, f)),
                     Store::overwrite);
  be.gelu_backward(dpre2.ds(), std::span<const T>(pre.ds()), std::span<const T>(dact.ds()), Store::overwrite);
  const auto got_dpre = dpre.fetch(), got_dw = dw.fetch(), got_db = db.fetch();
  CHECK(close(got_dpre, dpre2.fetch()) <= tol_same);
  CHECK(close(got_dw, dw2.fetch()) <= tol_same);
  CHECK(close(got_db, db2.fetch()) <= tol_same);
  host<T>().linear_backward(dact.hm(n, f), dw.hm(in, f), db.hs(), CM(dy.hm(n, in)), CM(act.hm(n, f)), CM(wp.hm(in, f)),
                            Store::overwrite);
  host<T>().gelu_backward(dpre.hs(), std::span<const T>(pre.hs()), std::span<const T>(dact.hs()), Store::overwrite);
  CHECK(close(got_dpre, dpre.h) <= tol_cpu);
  CHECK(close(got_dw, dw.h) <= tol_cpu);
  CHECK(close(got_db, db.h) <= tol_cpu);

  if (!counted) return;
  INFO("launches: forward " << forward.launches << ", backward " << backward.launches << "; GEMMs: forward "
                            << forward.gemm_calls << ", backward " << backward.gemm_calls);
  CHECK(forward.gemm_calls == 1);
  CHECK(backward.gemm_calls == 2);
  const bool fused = std::is_same_v<T, float> && !refuse;
  const bool bf16 = std::is_same_v<T, float> && precision == cuda::Precision::BF16;
  // Forward: the staging of x and w (bf16), the bias broadcast and the GELU where not fused. Backward: the staging
  // of dy (with db's sums), w and act (bf16) or db's column sums, and the GELU's backward where not fused.
  CHECK(forward.launches == (bf16 ? 2 : 0) + (fused ? 0 : 2));
  CHECK(backward.launches == (bf16 ? 3 : 1) + (fused ? 0 : 1));
}

}  // namespace

TEST_CASE("fused GELU products (cuBLASLt epilogues) equal the separate ops, and fall back without an algorithm",
          "[cuda][gelu]") {
  MOM_REQUIRE_GPU();
  for (const bool refuse : {false, true}) {
    if (refuse && !mom_emu_lt_refuse) continue;
    INFO((refuse ? "cuBLASLt without an algorithm" : "cuBLASLt's GELU epilogues"));
    {
      INFO("FP32");
      check_fused<float>(cuda::Precision::FP32, refuse, 1e-6, tol_kernel<float>);
    }
    {
      INFO("TF32");
      check_fused<float>(cuda::Precision::TF32, refuse, 1e-6, tol_tf32<float>);
    }
    {
      INFO("BF16");
      check_fused<float>(cuda::Precision::BF16, refuse, 1e-6, 2e-2);
    }
    {
      INFO("double");
      check_fused<double>(cuda::Precision::TF32, refuse, 0, tol_kernel<double>);
    }
  }
}

TEST_CASE("fused GELU products refuse an activation and pre-activation of different shapes or with padded rows",
          "[cuda][gelu]") {
  MOM_REQUIRE_GPU();
  auto& be = gpu<float>();
  test::Rng rng(32);
  const index_t n = 5, in = 8, f = 16;
  auto x = rand_arr<float>(n * in, rng), w = rand_arr<float>(f * in, rng), b = rand_arr<float>(f, rng);
  auto pre = rand_arr<float>(n * (f + 8), rng), act = rand_arr<float>(n * (f + 8), rng);
  const auto before_pre = pre.fetch(), before_act = act.fetch();
  using CM = MatrixView<const float>;
  const auto message = Catch::Contains("linear_forward_gelu: the activation and the pre-activation must be dense");
  // pre with padded rows (ld f + 8), then act one row short: rejected before anything runs.
  CHECK_THROWS_WITH(be.linear_forward_gelu(pre.dm(n, f, f + 8), act.dm(n, f), CM(x.dm(n, in)), CM(w.dm(f, in)),
                                           std::span<const float>(b.ds())),
                    message);
  CHECK_THROWS_WITH(be.linear_forward_gelu(pre.dm(n, f), act.dm(n - 1, f), CM(x.dm(n, in)), CM(w.dm(f, in)),
                                           std::span<const float>(b.ds())),
                    message);
  auto dy = rand_arr<float>(n * in, rng), wp = rand_arr<float>(in * f, rng), dw = rand_arr<float>(in * f, rng),
       db = rand_arr<float>(in, rng);
  CHECK_THROWS_WITH(be.linear_backward_dgelu(act.dm(n, f), dw.dm(in, f), db.ds(), CM(dy.dm(n, in)), CM(act.dm(n, f)),
                                             CM(wp.dm(in, f)), CM(pre.dm(n, f, f + 8))),
                    Catch::Contains("linear_backward_dgelu: the activation and the pre-activation must be dense"));
  be.sync();
  CHECK(pre.fetch() == before_pre);  // nothing written
  CHECK(act.fetch() == before_act);
}

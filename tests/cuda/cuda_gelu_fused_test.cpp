// The FFN's GELU fused into its products (backend_concept.hpp, FusesGelu; cuda::Backend's linear_forward_gelu and
// linear_backward_dgelu on cuBLASLt's GELU_AUX_BIAS and DGELU epilogues, ops.hpp): the fused ops must give what the
// separate ops give on the same backend (linear_forward then gelu_forward; linear_backward into d(pre) then
// gelu_backward), and the CPU's separate ops within the precision's tolerance. Under the emulation the fused path is
// the one that ran: a float forward in FP32 / TF32 launches no kernel (the GELU is in the product), a backward only
// the bias gradient's column sums; where cuBLASLt has no algorithm (mom_emu_lt_refuse) the ops fall back. Then the MLP
// with its LayerNorm as one op pair (FusesMlp, mlp_ops.hpp), whose bf16 layout under BF16 keeps ln, act and d(pre) in
// bf16.
#include <catch2/catch.hpp>

#include <cstring>
#include <span>
#include <string>
#include <utility>
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

// ---- the MLP as one op pair (backend_concept.hpp, FusesMlp; cuda::Backend's mlp_forward / mlp_backward, mlp_ops.hpp)

static_assert(FusesMlp<cuda::Backend<float>, float> && FusesMlp<cuda::Backend<double>, double>);
static_assert(!FusesMlp<cpu::Backend<float>, float>);  // the CPU runs the separate ops (the FFN's other branch)

namespace {

struct MlpRun {
  std::vector<float> y, dx, dgamma, dbeta, dw1, db1, dw2, db2;
  test::EmuCounters forward, backward;
};
// One FFN forward and backward (its LayerNorm, then y = gelu(ln·w1ᵀ + b1)·w2ᵀ + b2) on a fresh backend at `precision`,
// through the op pair (pair) or through the fp32 layout's ops (layernorm_forward + linear_forward_gelu +
// linear_forward, linear_backward_dgelu + linear_backward + layernorm_backward), with cuBLASLt refusing from the
// forward on (refuse_forward) or from the backward on (refuse_backward); with ln_unaligned, the LayerNorm's output
// 4 bytes past a 16-byte boundary (its bf16 layout does not apply: the pair writes it in fp32 and stages it).
MlpRun run_mlp(cuda::Precision precision, bool pair, bool refuse_forward = false, bool refuse_backward = false,
               bool ln_unaligned = false) {
  cuda::Backend<float> be;  // no cuBLASLt plan made yet
  be.set_precision(precision);
  test::Rng rng(41);
  const index_t n = 37, d = 40, f = 48;  // y [n × d] = gelu(LN(x)·w1ᵀ + b1)·w2ᵀ + b2, w1 [f × d], w2 [d × f]
  auto x = rand_arr<float>(n * d, rng), w1 = rand_arr<float>(f * d, rng), b1 = rand_arr<float>(f, rng);
  auto w2 = rand_arr<float>(d * f, rng), b2 = rand_arr<float>(d, rng), dy = rand_arr<float>(n * d, rng);
  auto gamma = rand_arr<float>(d, rng, 0.5, 1.5), beta = rand_arr<float>(d, rng);
  auto y = rand_arr<float>(n * d, rng), pre = rand_arr<float>(n * f, rng), act = rand_arr<float>(n * f, rng);
  auto ln_buf = rand_arr<float>(n * d + 4, rng), mean = rand_arr<float>(n, rng), rstd = rand_arr<float>(n, rng);
  auto dact = rand_arr<float>(n * f, rng), dpre = rand_arr<float>(n * f, rng), dx = rand_arr<float>(n * d, rng);
  auto dln = rand_arr<float>(n * d, rng), dgamma = rand_arr<float>(d, rng), dbeta = rand_arr<float>(d, rng);
  auto dw1 = rand_arr<float>(f * d, rng), db1 = rand_arr<float>(f, rng), dw2 = rand_arr<float>(d * f, rng),
       db2 = rand_arr<float>(d, rng);
  using CM = MatrixView<const float>;
  using CS = std::span<const float>;
  const MatrixView<float> ln(ln_buf.d.data() + (ln_unaligned ? 1 : 0), n, d);
  const NormSaved<float> saved(ln, mean.ds(), rstd.ds());
  const bool counted = mom_emu_launches && mom_emu_lt_refuse;
  if (refuse_forward && counted) mom_emu_lt_refuse(1);
  MlpRun r;
  be.sync();
  auto t0 = counted ? test::EmuCounters::now() : test::EmuCounters{};
  if (pair) {
    be.mlp_forward(y.dm(n, d), saved, pre.dm(n, f), act.dm(n, f), CM(x.dm(n, d)), CS(gamma.ds()), CS(beta.ds()),
                   CM(w1.dm(f, d)), CS(b1.ds()), CM(w2.dm(d, f)), CS(b2.ds()));
  } else {
    be.layernorm_forward(ln, mean.ds(), rstd.ds(), CM(x.dm(n, d)), CS(gamma.ds()), CS(beta.ds()));
    be.linear_forward_gelu(pre.dm(n, f), act.dm(n, f), CM(ln), CM(w1.dm(f, d)), CS(b1.ds()));
    be.linear_forward(y.dm(n, d), CM(act.dm(n, f)), CM(w2.dm(d, f)), CS(b2.ds()));
  }
  be.sync();
  if (counted) r.forward = test::EmuCounters::now() - t0;
  if (refuse_backward && counted) mom_emu_lt_refuse(1);
  t0 = counted ? test::EmuCounters::now() : test::EmuCounters{};
  if (pair) {
    be.mlp_backward(dx.dm(n, d), dgamma.ds(), dbeta.ds(), dw1.dm(f, d), db1.ds(), dw2.dm(d, f), db2.ds(), dln.dm(n, d),
                    dact.dm(n, f), dpre.dm(n, f), CM(dy.dm(n, d)), CM(x.dm(n, d)), NormSaved<const float>(saved),
                    CS(gamma.ds()), CM(pre.dm(n, f)), CM(act.dm(n, f)), CM(w1.dm(f, d)), CM(w2.dm(d, f)));
  } else {
    be.linear_backward_dgelu(dpre.dm(n, f), dw2.dm(d, f), db2.ds(), CM(dy.dm(n, d)), CM(act.dm(n, f)),
                             CM(w2.dm(d, f)), CM(pre.dm(n, f)));
    be.linear_backward(dln.dm(n, d), dw1.dm(f, d), db1.ds(), CM(dpre.dm(n, f)), CM(ln), CM(w1.dm(f, d)),
                       Store::overwrite);
    be.layernorm_backward(dx.dm(n, d), dgamma.ds(), dbeta.ds(), CM(dln.dm(n, d)), CM(x.dm(n, d)), CS(mean.ds()),
                          CS(rstd.ds()), CS(gamma.ds()));
  }
  be.sync();
  if (counted) r.backward = test::EmuCounters::now() - t0;
  if (counted) mom_emu_lt_refuse(0);
  r.y = y.fetch(), r.dx = dx.fetch(), r.dgamma = dgamma.fetch(), r.dbeta = dbeta.fetch();
  r.dw1 = dw1.fetch(), r.db1 = db1.fetch(), r.dw2 = dw2.fetch(), r.db2 = db2.fetch();
  // The CPU's separate ops from the same initial values: every result within bf16's tolerance of them.
  auto& h = host<float>();
  const MatrixView<float> hln(ln_buf.h.data(), n, d);
  h.layernorm_forward(hln, mean.hs(), rstd.hs(), CM(x.hm(n, d)), CS(gamma.hs()), CS(beta.hs()));
  h.linear_forward(pre.hm(n, f), CM(hln), CM(w1.hm(f, d)), CS(b1.hs()));
  h.gelu_forward(act.hs(), CS(pre.hs()));
  h.linear_forward(y.hm(n, d), CM(act.hm(n, f)), CM(w2.hm(d, f)), CS(b2.hs()));
  h.linear_backward(dact.hm(n, f), dw2.hm(d, f), db2.hs(), CM(dy.hm(n, d)), CM(act.hm(n, f)), CM(w2.hm(d, f)),
                    Store::overwrite);
  h.gelu_backward(dpre.hs(), CS(pre.hs()), CS(dact.hs()), Store::overwrite);
  h.linear_backward(dln.hm(n, d), dw1.hm(f, d), db1.hs(), CM(dpre.hm(n, f)), CM(hln), CM(w1.hm(f, d)),
                    Store::overwrite);
  h.layernorm_backward(dx.hm(n, d), dgamma.hs(), dbeta.hs(), CM(dln.hm(n, d)), CM(x.hm(n, d)), CS(mean.hs()),
                       CS(rstd.hs()), CS(gamma.hs()));
  const double tol = precision == cuda::Precision::BF16 ? 2e-2 : tol_tf32<float>;
  CHECK(close(r.y, y.h) <= tol);
  CHECK(close(r.dx, dx.h) <= tol);
  CHECK(close(r.dgamma, dgamma.h) <= tol);
  CHECK(close(r.dbeta, dbeta.h) <= tol);
  CHECK(close(r.dw1, dw1.h) <= tol);
  CHECK(close(r.db1, db1.h) <= tol);
  CHECK(close(r.dw2, dw2.h) <= tol);
  CHECK(close(r.db2, db2.h) <= tol);
  return r;
}
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("the FFN op pair keeps ln, act and d(pre) in bf16 under BF16: the staged products' results to bf16's "
          "precision", "[cuda][gelu]") {
  MOM_REQUIRE_GPU();
  // mlp_ops.hpp: the fc bias enters in bf16 (cuBLASLt's rule for a bf16 output), gelu' is taken at pre rounded to bf16
  // and d(pre) is rounded once more, so every result but db2 = Σ dy (the same staging of dy) agrees with the fp32
  // layout's to bf16's precision (and both with the CPU, checked in run_mlp).
  const MlpRun pair = run_mlp(cuda::Precision::BF16, true), ops = run_mlp(cuda::Precision::BF16, false);
  CHECK(close(pair.y, ops.y) <= 1e-2);
  CHECK(close(pair.dgamma, ops.dgamma) <= 1e-2);
  CHECK(close(pair.dbeta, ops.dbeta) <= 1e-2);
  CHECK(close(pair.dw2, ops.dw2) <= 1e-2);
  CHECK(same_bits(pair.db2, ops.db2));
  CHECK(!same_bits(pair.y, ops.y));  // the bf16 bias and act did reach y
  CHECK(close(pair.dx, ops.dx) <= 1e-2);
  CHECK(close(pair.dw1, ops.dw1) <= 1e-2);
  CHECK(close(pair.db1, ops.db1) <= 1e-2);
  if (!mom_emu_launches || !mom_emu_lt_refuse) return;
  // The bf16 layout ran: neither ln nor act is staged. Forward: the LayerNorm (writing bf16), then w1, b1 and w2
  // staged (the fp32 layout: the LayerNorm, then ln, w1, act, w2 staged). Backward: dy (with db2's sums), w2 and w1
  // staged, d(pre)'s column sums, the LayerNorm's two kernels (the fp32 layout: dy, w2, act, d(pre) with db1's sums,
  // w1, ln).
  const index_t n = 37, d = 40, f = 48;
  CHECK(pair.forward.staging_copies == 3);
  CHECK(pair.forward.launches == 4);
  CHECK(pair.forward.staging_bytes == 4 * (f * d + f + d * f));
  CHECK(ops.forward.staging_bytes == 4 * (n * d + f * d + n * f + d * f));
  CHECK(pair.backward.staging_copies == 3);
  CHECK(pair.backward.launches == 6);
  CHECK(ops.backward.staging_copies == 6);
  CHECK(pair.forward.gemm_calls == 2);
  CHECK(pair.backward.gemm_calls == 4);
}

TEST_CASE("the FFN op pair's LayerNorm in bf16 gives the bits its fp32 output's staging gives", "[cuda][gelu]") {
  MOM_REQUIRE_GPU();
  // ln.out 4 bytes past a 16-byte boundary: the pair writes the LayerNorm in fp32 and stages it (forward and dW1),
  // the MLP still in its bf16 layout. The LayerNorm's bf16 output is that staging's rounding of the same fp32 values.
  const MlpRun in_place = run_mlp(cuda::Precision::BF16, true), staged = run_mlp(cuda::Precision::BF16, true, false,
                                                                                  false, true);
  for (const auto& [a, b] : {std::pair{&in_place.y, &staged.y}, {&in_place.dx, &staged.dx},
                             {&in_place.dgamma, &staged.dgamma}, {&in_place.dbeta, &staged.dbeta},
                             {&in_place.dw1, &staged.dw1}, {&in_place.db1, &staged.db1},
                             {&in_place.dw2, &staged.dw2}, {&in_place.db2, &staged.db2}}) {
    if (mom_emu_launches)
      CHECK(same_bits(*a, *b));
    else  // a real cuBLASLt may pick another algorithm for the other operand alignment
      CHECK(close(*a, *b) <= 1e-5);
  }
  if (!mom_emu_launches) return;
  CHECK(staged.forward.staging_copies == 4);  // ln, w1, b1, w2
  CHECK(staged.backward.staging_copies == 4);  // dy, w2, w1, ln
  CHECK(staged.forward.launches == in_place.forward.launches + 1);
}

TEST_CASE("the MLP op pair without cuBLASLt: the fp32 layout from the forward on, dgelu_bf16 from the backward on",
          "[cuda][gelu]") {
  MOM_REQUIRE_GPU();
  if (!mom_emu_lt_refuse) return;  // a real cuBLASLt cannot be made to refuse
  const MlpRun lt = run_mlp(cuda::Precision::BF16, true);
  // No algorithm in the forward: the pair is the fp32 layout's ops (themselves on their fallbacks), the bf16 layout
  // is not recorded, and the backward reads fp32 act and pre (run_mlp checks the CPU's results).
  const MlpRun forward = run_mlp(cuda::Precision::BF16, true, true);
  CHECK(forward.forward.staging_bytes > lt.forward.staging_bytes);  // act staged
  // No algorithm from the backward on: the forward wrote the bf16 layout; the DGELU product is a bf16 GEMM into dact
  // (fp32), then dgelu_bf16 (one launch more), the same values as the epilogue's to the last bf16 place or so.
  const MlpRun backward = run_mlp(cuda::Precision::BF16, true, false, true);
  CHECK(same_bits(backward.y, lt.y));
  CHECK(backward.backward.launches == lt.backward.launches + 1);
  CHECK(backward.backward.gemm_calls == lt.backward.gemm_calls);
  CHECK(close(backward.dx, lt.dx) <= 5e-3);
  CHECK(close(backward.dw1, lt.dw1) <= 5e-3);
  CHECK(close(backward.db1, lt.db1) <= 5e-3);
  CHECK(same_bits(backward.dw2, lt.dw2));
}

TEST_CASE("the MLP op pair under TF32 is the fp32 layout's ops, bit for bit", "[cuda][gelu]") {
  MOM_REQUIRE_GPU();
  const MlpRun pair = run_mlp(cuda::Precision::TF32, true), ops = run_mlp(cuda::Precision::TF32, false);
  for (const auto& [a, b] : {std::pair{&pair.y, &ops.y}, {&pair.dx, &ops.dx}, {&pair.dgamma, &ops.dgamma},
                             {&pair.dbeta, &ops.dbeta}, {&pair.dw1, &ops.dw1}, {&pair.db1, &ops.db1},
                             {&pair.dw2, &ops.dw2}, {&pair.db2, &ops.db2}})
    CHECK(same_bits(*a, *b));
}

TEST_CASE("the MLP op pair refuses activations of different shapes or with padded rows, with nothing written",
          "[cuda][gelu]") {
  MOM_REQUIRE_GPU();
  auto& be = gpu<float>();
  be.set_precision(cuda::Precision::BF16);
  test::Rng rng(42);
  const index_t n = 5, d = 8, f = 16;
  using CM = MatrixView<const float>;
  using CS = std::span<const float>;
  auto x = rand_arr<float>(n * d, rng), w1 = rand_arr<float>(f * d, rng), b1 = rand_arr<float>(f, rng);
  auto w2 = rand_arr<float>(d * f, rng), b2 = rand_arr<float>(d, rng), y = rand_arr<float>(n * d, rng);
  auto pre = rand_arr<float>(n * (f + 8), rng), act = rand_arr<float>(n * (f + 8), rng);
  auto dx = rand_arr<float>(n * d, rng), dw1 = rand_arr<float>(f * d, rng), db1 = rand_arr<float>(f, rng);
  auto dw2 = rand_arr<float>(d * f, rng), db2 = rand_arr<float>(d, rng), dy = rand_arr<float>(n * d, rng);
  auto gamma = rand_arr<float>(d, rng), beta = rand_arr<float>(d, rng), ln = rand_arr<float>(n * d, rng);
  auto mean = rand_arr<float>(n, rng), rstd = rand_arr<float>(n, rng), dln = rand_arr<float>(n * d, rng);
  const NormSaved<float> saved(ln.dm(n, d), mean.ds(), rstd.ds());
  const auto y0 = y.fetch(), pre0 = pre.fetch(), act0 = act.fetch(), dx0 = dx.fetch(), dw10 = dw1.fetch();
  const auto ln0 = ln.fetch();
  // pre with padded rows (ld f + 8): rejected before anything runs.
  CHECK_THROWS_WITH(be.mlp_forward(y.dm(n, d), saved, pre.dm(n, f, f + 8), act.dm(n, f), CM(x.dm(n, d)),
                                   CS(gamma.ds()), CS(beta.ds()), CM(w1.dm(f, d)), CS(b1.ds()), CM(w2.dm(d, f)),
                                   CS(b2.ds())),
                    Catch::Contains("mlp_forward: the activation and the pre-activation must be dense"));
  // act one row short of pre in the backward.
  CHECK_THROWS_WITH(be.mlp_backward(dx.dm(n, d), gamma.ds(), beta.ds(), dw1.dm(f, d), db1.ds(), dw2.dm(d, f), db2.ds(),
                                    dln.dm(n, d), act.dm(n, f), pre.dm(n, f), CM(dy.dm(n, d)), CM(x.dm(n, d)),
                                    NormSaved<const float>(saved), CS(gamma.ds()), CM(pre.dm(n, f)),
                                    CM(act.dm(n - 1, f)), CM(w1.dm(f, d)), CM(w2.dm(d, f))),
                    Catch::Contains("mlp_backward: the activation and the pre-activation must be dense"));
  // The LayerNorm's output one row short: its shape check's message, before anything runs.
  CHECK_THROWS_WITH(be.mlp_forward(y.dm(n, d), NormSaved<float>(ln.dm(n - 1, d), mean.ds(), rstd.ds()), pre.dm(n, f),
                                   act.dm(n, f), CM(x.dm(n, d)), CS(gamma.ds()), CS(beta.ds()), CM(w1.dm(f, d)),
                                   CS(b1.ds()), CM(w2.dm(d, f)), CS(b2.ds())),
                    Catch::Contains("layernorm_forward"));
  be.sync();
  be.set_precision(cuda::Precision::TF32);
  CHECK(y.fetch() == y0);  // nothing written
  CHECK(pre.fetch() == pre0);
  CHECK(act.fetch() == act0);
  CHECK(dx.fetch() == dx0);
  CHECK(dw1.fetch() == dw10);
  CHECK(ln.fetch() == ln0);
}

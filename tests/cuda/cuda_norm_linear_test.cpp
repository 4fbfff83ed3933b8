// A pre-LayerNorm and the linear that reads it as one op pair (backend_concept.hpp, FusesNormLinear; cuda::Backend's
// norm_linear_forward / norm_linear_backward, norm_ops.hpp): the pair must give what layernorm_forward +
// linear_forward and linear_backward + layernorm_backward give on the same backend, bit for bit (under BF16 its
// LayerNorm writes the bf16 bits the staging would make of its fp32 output), and the CPU's ops within the precision's
// tolerance. Under the emulation the bf16 layout is the one that ran: the LayerNorm's output is never staged.
#include <catch2/catch.hpp>

#include <cstring>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "cuda/cuda_test_support.hpp"

using namespace mom;
using namespace mom::test;

static_assert(FusesNormLinear<cuda::Backend<float>, float> && FusesNormLinear<cuda::Backend<double>, double>);
static_assert(!FusesNormLinear<cpu::Backend<float>, float>);  // the CPU runs the separate ops (mha.hpp's other branch)

namespace {

template <class T>
struct NormLinearRun {
  std::vector<T> y, dx, dgamma, dbeta, dw, db;
  test::EmuCounters forward, backward;
};
struct Case {
  bool pair = true;          // the op pair, or the separate ops
  bool ln_unaligned = false;  // ln.out 4 bytes past a 16-byte boundary (the bf16 layout does not apply)
  bool bias = true;
  bool refuse = false;  // cuBLASLt without an algorithm (emulation only)
};
// One forward and backward of y = LN(x)·wᵀ + b (x [n × d], w [o × d]) on a fresh backend at `precision`.
template <class T>
NormLinearRun<T> run(cuda::Precision precision, Case c) {
  cuda::Backend<T> be;  // no cuBLASLt plan made yet
  be.set_precision(precision);
  test::Rng rng(43);
  const index_t n = 37, d = 40, o = 56;
  auto x = rand_arr<T>(n * d, rng), w = rand_arr<T>(o * d, rng), b = rand_arr<T>(o, rng);
  auto gamma = rand_arr<T>(d, rng, 0.5, 1.5), beta = rand_arr<T>(d, rng), dy = rand_arr<T>(n * o, rng);
  auto y = rand_arr<T>(n * o, rng), ln_buf = rand_arr<T>(n * d + 4, rng), mean = rand_arr<T>(n, rng),
       rstd = rand_arr<T>(n, rng);
  auto dx = rand_arr<T>(n * d, rng), dln = rand_arr<T>(n * d, rng), dgamma = rand_arr<T>(d, rng),
       dbeta = rand_arr<T>(d, rng), dw = rand_arr<T>(o * d, rng), db = rand_arr<T>(o, rng);
  using CM = MatrixView<const T>;
  using CS = std::span<const T>;
  const MatrixView<T> ln(ln_buf.d.data() + (c.ln_unaligned ? 1 : 0), n, d);
  const NormSaved<T> saved(ln, mean.ds(), rstd.ds());
  const CS bias = c.bias ? CS(b.ds()) : CS{};
  const bool counted = mom_emu_launches && mom_emu_lt_refuse;
  if (c.refuse && counted) mom_emu_lt_refuse(1);
  NormLinearRun<T> r;
  be.sync();
  auto t0 = counted ? test::EmuCounters::now() : test::EmuCounters{};
  if (c.pair) {
    be.norm_linear_forward(y.dm(n, o), saved, CM(x.dm(n, d)), CS(gamma.ds()), CS(beta.ds()), CM(w.dm(o, d)), bias);
  } else {
    be.layernorm_forward(ln, mean.ds(), rstd.ds(), CM(x.dm(n, d)), CS(gamma.ds()), CS(beta.ds()));
    be.linear_forward(y.dm(n, o), CM(ln), CM(w.dm(o, d)), bias);
  }
  be.sync();
  if (counted) r.forward = test::EmuCounters::now() - t0;
  t0 = counted ? test::EmuCounters::now() : test::EmuCounters{};
  const std::span<T> db_or_none = c.bias ? db.ds() : std::span<T>{};
  if (c.pair) {
    be.norm_linear_backward(dx.dm(n, d), dgamma.ds(), dbeta.ds(), dw.dm(o, d), db_or_none, dln.dm(n, d),
                            CM(dy.dm(n, o)), CM(x.dm(n, d)), NormSaved<const T>(saved), CS(gamma.ds()),
                            CM(w.dm(o, d)));
  } else {
    be.linear_backward(dln.dm(n, d), dw.dm(o, d), db_or_none, CM(dy.dm(n, o)), CM(ln), CM(w.dm(o, d)),
                       Store::overwrite);
    be.layernorm_backward(dx.dm(n, d), dgamma.ds(), dbeta.ds(), CM(dln.dm(n, d)), CM(x.dm(n, d)), CS(mean.ds()),
                          CS(rstd.ds()), CS(gamma.ds()));
  }
  be.sync();
  if (counted) r.backward = test::EmuCounters::now() - t0;
  if (counted) mom_emu_lt_refuse(0);
  r.y = y.fetch(), r.dx = dx.fetch(), r.dgamma = dgamma.fetch(), r.dbeta = dbeta.fetch(), r.dw = dw.fetch();
  r.db = db.fetch();
  // The CPU's ops from the same initial values.
  auto& h = host<T>();
  const MatrixView<T> hln(ln_buf.h.data(), n, d);
  const CS hbias = c.bias ? CS(b.hs()) : CS{};
  h.layernorm_forward(hln, mean.hs(), rstd.hs(), CM(x.hm(n, d)), CS(gamma.hs()), CS(beta.hs()));
  h.linear_forward(y.hm(n, o), CM(hln), CM(w.hm(o, d)), hbias);
  h.linear_backward(dln.hm(n, d), dw.hm(o, d), c.bias ? db.hs() : std::span<T>{}, CM(dy.hm(n, o)), CM(hln),
                    CM(w.hm(o, d)), Store::overwrite);
  h.layernorm_backward(dx.hm(n, d), dgamma.hs(), dbeta.hs(), CM(dln.hm(n, d)), CM(x.hm(n, d)), CS(mean.hs()),
                       CS(rstd.hs()), CS(gamma.hs()));
  const double tol = std::is_same_v<T, double>             ? tol_kernel<double>
                     : precision == cuda::Precision::BF16 ? 2e-2
                                                          : tol_tf32<float>;
  CHECK(test::rel_error(r.y, y.h) <= tol);
  CHECK(test::rel_error(r.dx, dx.h) <= tol);
  CHECK(test::rel_error(r.dgamma, dgamma.h) <= tol);
  CHECK(test::rel_error(r.dbeta, dbeta.h) <= tol);
  CHECK(test::rel_error(r.dw, dw.h) <= tol);
  CHECK(test::rel_error(r.db, db.h) <= tol);
  return r;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}
// The pair and the separate ops agree: bit for bit under the emulation (and on a GPU wherever no bf16 operand moved:
// a real cuBLASLt may pick another algorithm for the LayerNorm's bf16 copy than for the staging buffer, so there to
// 1e-5).
template <class T>
void check_same(const NormLinearRun<T>& a, const NormLinearRun<T>& b, bool exact) {
  for (const auto& [p, q] : {std::pair{&a.y, &b.y}, {&a.dx, &b.dx}, {&a.dgamma, &b.dgamma}, {&a.dbeta, &b.dbeta},
                             {&a.dw, &b.dw}, {&a.db, &b.db}}) {
    if (exact)
      CHECK(same_bits(*p, *q));
    else
      CHECK(test::rel_error(*p, *q) <= 1e-5);
  }
}

}  // namespace

TEST_CASE("the LayerNorm-linear pair under BF16 writes the LayerNorm in bf16: the separate ops' bits, no staging of it",
          "[cuda][norm]") {
  MOM_REQUIRE_GPU();
  const bool emulated = mom_emu_launches != nullptr;
  for (const bool bias : {true, false}) {
    INFO((bias ? "with a bias" : "without a bias"));
    const auto pair = run<float>(cuda::Precision::BF16, {.pair = true, .bias = bias});
    const auto ops = run<float>(cuda::Precision::BF16, {.pair = false, .bias = bias});
    check_same(pair, ops, emulated);
    if (!emulated || !mom_emu_lt_refuse) continue;
    // Forward: the LayerNorm (bf16), w staged (the separate ops: the LayerNorm, ln and w staged). Backward: dy (its
    // column sums into db) and w staged, the LayerNorm's two kernels (the separate ops: dy, w and ln staged).
    const index_t n = 37, d = 40, o = 56;
    CHECK(pair.forward.staging_copies == 1);
    CHECK(pair.forward.staging_bytes == 4 * o * d);
    CHECK(ops.forward.staging_copies == 2);
    CHECK(pair.forward.launches == 2);
    CHECK(pair.forward.gemm_calls == 1);
    CHECK(pair.backward.staging_copies == 2);
    CHECK(pair.backward.staging_bytes == 4 * (n * o + o * d));
    CHECK(ops.backward.staging_copies == 3);
    CHECK(pair.backward.launches == 4);
    CHECK(pair.backward.gemm_calls == 2);
  }
}

TEST_CASE("the LayerNorm-linear pair under BF16 without cuBLASLt, or with an unaligned LayerNorm output",
          "[cuda][norm]") {
  MOM_REQUIRE_GPU();
  const bool emulated = mom_emu_launches != nullptr;
  if (emulated && mom_emu_lt_refuse) {
    // No algorithm for the bias epilogue: the bias broadcast, then a bf16 cuBLAS product from the LayerNorm's bf16
    // output, as linear_forward's own fallback; the same bits.
    const auto pair = run<float>(cuda::Precision::BF16, {.pair = true, .refuse = true});
    const auto ops = run<float>(cuda::Precision::BF16, {.pair = false, .refuse = true});
    check_same(pair, ops, true);
    CHECK(pair.forward.staging_copies == 1);
    CHECK(pair.forward.launches == 3);  // LayerNorm, w's staging, the bias broadcast
  }
  // ln.out off 16 bytes: the LayerNorm in fp32 and both products staging it, as the separate ops.
  const auto pair = run<float>(cuda::Precision::BF16, {.pair = true, .ln_unaligned = true});
  const auto ops = run<float>(cuda::Precision::BF16, {.pair = false, .ln_unaligned = true});
  check_same(pair, ops, true);
  if (emulated) {
    CHECK(pair.forward.staging_copies == 2);
    CHECK(pair.backward.staging_copies == 3);
  }
}

TEST_CASE("the LayerNorm-linear pair under TF32 and in double is the separate ops, bit for bit", "[cuda][norm]") {
  MOM_REQUIRE_GPU();
  check_same(run<float>(cuda::Precision::TF32, {.pair = true}), run<float>(cuda::Precision::TF32, {.pair = false}),
             true);
  check_same(run<double>(cuda::Precision::TF32, {.pair = true}), run<double>(cuda::Precision::TF32, {.pair = false}),
             true);
}

TEST_CASE("the LayerNorm-linear pair refuses mismatched shapes with the separate ops' messages, nothing written",
          "[cuda][norm]") {
  MOM_REQUIRE_GPU();
  auto& be = gpu<float>();
  be.set_precision(cuda::Precision::BF16);
  test::Rng rng(44);
  const index_t n = 5, d = 8, o = 16;
  using CM = MatrixView<const float>;
  using CS = std::span<const float>;
  auto x = rand_arr<float>(n * d, rng), w = rand_arr<float>(o * d, rng), b = rand_arr<float>(o, rng);
  auto gamma = rand_arr<float>(d, rng), beta = rand_arr<float>(d, rng), y = rand_arr<float>(n * o, rng);
  auto ln = rand_arr<float>(n * d, rng), mean = rand_arr<float>(n, rng), rstd = rand_arr<float>(n, rng);
  auto dy = rand_arr<float>(n * o, rng), dx = rand_arr<float>(n * d, rng), dln = rand_arr<float>(n * d, rng);
  auto dw = rand_arr<float>(o * d, rng), db = rand_arr<float>(o, rng);
  const auto y0 = y.fetch(), ln0 = ln.fetch(), mean0 = mean.fetch(), dx0 = dx.fetch(), dw0 = dw.fetch();
  // The LayerNorm's output a row short of x; then w one column short of ln (the linear's message).
  CHECK_THROWS_WITH(be.norm_linear_forward(y.dm(n, o), NormSaved<float>(ln.dm(n - 1, d), mean.ds(), rstd.ds()),
                                           CM(x.dm(n, d)), CS(gamma.ds()), CS(beta.ds()), CM(w.dm(o, d)), CS(b.ds())),
                    Catch::Contains("layernorm_forward: out"));
  CHECK_THROWS_WITH(be.norm_linear_forward(y.dm(n, o), NormSaved<float>(ln.dm(n, d), mean.ds(), rstd.ds()),
                                           CM(x.dm(n, d)), CS(gamma.ds()), CS(beta.ds()), CM(w.dm(o, d - 1)),
                                           CS(b.ds())),
                    Catch::Contains("linear_forward"));
  // dy a row short of ln in the backward.
  CHECK_THROWS_WITH(be.norm_linear_backward(dx.dm(n, d), gamma.ds(), beta.ds(), dw.dm(o, d), db.ds(), dln.dm(n, d),
                                            CM(dy.dm(n - 1, o)), CM(x.dm(n, d)),
                                            NormSaved<const float>(CM(ln.dm(n, d)), CS(mean.ds()), CS(rstd.ds())),
                                            CS(gamma.ds()), CM(w.dm(o, d))),
                    Catch::Contains("linear_backward"));
  be.sync();
  be.set_precision(cuda::Precision::TF32);
  CHECK(y.fetch() == y0);  // nothing written
  CHECK(ln.fetch() == ln0);
  CHECK(mean.fetch() == mean0);
  CHECK(dx.fetch() == dx0);
  CHECK(dw.fetch() == dw0);
}

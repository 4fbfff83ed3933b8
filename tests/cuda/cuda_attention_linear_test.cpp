// The causal attention and the output linear that reads it as one op pair (backend_concept.hpp,
// FusesAttentionLinear; cuda::Backend's attention_linear_forward / attention_linear_backward, attention_ops.hpp): the
// pair must give what attention_forward + linear_forward and linear_backward + attention_backward give on the same
// backend (under BF16 bit for bit where the rounded output is what the separate ops' staging makes of it: y, lse,
// datt, dw, db; dqkv to bf16's precision, its D taken from the rounded output), and the CPU's ops within the
// precision's tolerance. Under the emulation the bf16 layout is the one that ran: the attention's output is never
// staged.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "cuda/cuda_test_support.hpp"

using namespace mom;
using namespace mom::test;

static_assert(FusesAttentionLinear<cuda::Backend<float>, float> &&
              FusesAttentionLinear<cuda::Backend<double>, double>);
static_assert(!FusesAttentionLinear<cpu::Backend<float>, float>);  // the CPU runs the separate ops (mha.hpp)

namespace {

template <class T>
struct AttentionLinearRun {
  std::vector<T> y, lse, dqkv, datt, dw, db;
  test::EmuCounters forward, backward;
};
struct Case {
  bool pair = true;            // the op pair, or the separate ops
  index_t heads = 2;           // d = 128: head dim 64 (the mma kernels), or 4 heads of 32 (the SIMT kernels)
  bool att_unaligned = false;  // att 4 bytes past a 16-byte boundary (the bf16 layout does not apply)
  bool bias = true;
};
// One forward and backward of y = attention(qkv)·wᵀ + b (qkv [n × 3d], w [o × d], n = batch · seq) on a fresh backend
// at `precision`; dqkv written over its initial values (the pair's contract; the separate ops' zeroed first, as
// modules/mha.hpp zeroes it for them).
template <class T>
AttentionLinearRun<T> run(cuda::Precision precision, Case c) {
  cuda::Backend<T> be;  // no cuBLASLt plan made yet
  be.set_precision(precision);
  test::Rng rng(47);
  const index_t batch = 2, seq = 70, d = 128, o = 48, n = batch * seq, heads = c.heads;
  auto qkv = rand_arr<T>(n * 3 * d, rng), w = rand_arr<T>(o * d, rng), b = rand_arr<T>(o, rng);
  auto dy = rand_arr<T>(n * o, rng), y = rand_arr<T>(n * o, rng), att_buf = rand_arr<T>(n * d + 4, rng);
  auto lse = rand_arr<T>(batch * heads * seq, rng), dqkv = rand_arr<T>(n * 3 * d, rng), datt = rand_arr<T>(n * d, rng);
  auto dw = rand_arr<T>(o * d, rng), db = rand_arr<T>(o, rng);
  using CM = MatrixView<const T>;
  using CS = std::span<const T>;
  const MatrixView<T> att(att_buf.d.data() + (c.att_unaligned ? 1 : 0), n, d);
  const CS bias = c.bias ? CS(b.ds()) : CS{};
  const std::span<T> db_or_none = c.bias ? db.ds() : std::span<T>{};
  const bool counted = mom_emu_launches != nullptr;
  AttentionLinearRun<T> r;
  be.sync();
  auto t0 = counted ? test::EmuCounters::now() : test::EmuCounters{};
  if (c.pair) {
    be.attention_linear_forward(y.dm(n, o), att, lse.ds(), CM(qkv.dm(n, 3 * d)), CM(w.dm(o, d)), bias, batch, seq,
                                heads);
  } else {
    be.attention_forward(att, lse.ds(), CM(qkv.dm(n, 3 * d)), batch, seq, heads);
    be.linear_forward(y.dm(n, o), CM(att), CM(w.dm(o, d)), bias);
  }
  be.sync();
  if (counted) r.forward = test::EmuCounters::now() - t0;
  t0 = counted ? test::EmuCounters::now() : test::EmuCounters{};
  if (c.pair) {
    be.attention_linear_backward(dqkv.dm(n, 3 * d), dw.dm(o, d), db_or_none, datt.dm(n, d), CM(dy.dm(n, o)), CM(att),
                                 CS(lse.ds()), CM(qkv.dm(n, 3 * d)), CM(w.dm(o, d)), batch, seq, heads);
  } else {
    be.linear_backward(datt.dm(n, d), dw.dm(o, d), db_or_none, CM(dy.dm(n, o)), CM(att), CM(w.dm(o, d)),
                       Store::overwrite);
    be.zero(dqkv.dm(n, 3 * d));
    be.attention_backward(dqkv.dm(n, 3 * d), CM(datt.dm(n, d)), CM(att), CS(lse.ds()), CM(qkv.dm(n, 3 * d)), batch,
                          seq, heads);
  }
  be.sync();
  if (counted) r.backward = test::EmuCounters::now() - t0;
  r.y = y.fetch(), r.lse = lse.fetch(), r.dqkv = dqkv.fetch(), r.datt = datt.fetch(), r.dw = dw.fetch();
  r.db = db.fetch();
  // The CPU's ops from the same initial values.
  auto& h = host<T>();
  const MatrixView<T> hatt(att_buf.h.data(), n, d);
  h.attention_forward(hatt, lse.hs(), CM(qkv.hm(n, 3 * d)), batch, seq, heads);
  h.linear_forward(y.hm(n, o), CM(hatt), CM(w.hm(o, d)), c.bias ? CS(b.hs()) : CS{});
  h.linear_backward(datt.hm(n, d), dw.hm(o, d), c.bias ? db.hs() : std::span<T>{}, CM(dy.hm(n, o)), CM(hatt),
                    CM(w.hm(o, d)), Store::overwrite);
  std::fill(dqkv.h.begin(), dqkv.h.end(), T(0));
  h.attention_backward(dqkv.hm(n, 3 * d), CM(datt.hm(n, d)), CM(hatt), CS(lse.hs()), CM(qkv.hm(n, 3 * d)), batch, seq,
                       heads);
  const double tol = std::is_same_v<T, double>             ? tol_kernel<double>
                     : precision == cuda::Precision::BF16 ? 2e-2
                                                          : tol_tf32<float>;
  CHECK(test::rel_error(r.y, y.h) <= tol);
  CHECK(test::rel_error(r.lse, lse.h) <= tol);
  CHECK(test::rel_error(r.dqkv, dqkv.h) <= tol);
  CHECK(test::rel_error(r.datt, datt.h) <= tol);
  CHECK(test::rel_error(r.dw, dw.h) <= tol);
  CHECK(test::rel_error(r.db, db.h) <= tol);
  return r;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}
// a and b bit for bit where `exact`, else within tol.
template <class T>
void check_close(const std::vector<T>& a, const std::vector<T>& b, bool exact, double tol) {
  if (exact)
    CHECK(same_bits(a, b));
  else
    CHECK(test::rel_error(a, b) <= tol);
}
// The pair and the separate ops agree: bit for bit under the emulation (on a GPU a real cuBLASLt may pick another
// algorithm for the in-place bf16 operand than for the staging buffer: there to 1e-5); dqkv too where `dqkv_exact`.
template <class T>
void check_same(const AttentionLinearRun<T>& a, const AttentionLinearRun<T>& b, bool exact, bool dqkv_exact) {
  for (const auto& [p, q] :
       {std::pair{&a.y, &b.y}, {&a.lse, &b.lse}, {&a.datt, &b.datt}, {&a.dw, &b.dw}, {&a.db, &b.db}})
    check_close(*p, *q, exact, 1e-5);
  if (dqkv_exact && exact)
    CHECK(same_bits(a.dqkv, b.dqkv));
  else  // D from the rounded output (and on a GPU the atomics' order): bf16's precision
    CHECK(test::rel_error(a.dqkv, b.dqkv) <= (dqkv_exact ? 1e-5 : 1e-2));
}

}  // namespace

TEST_CASE("the attention-linear pair under BF16 writes the attention in bf16: the separate ops' bits, no staging of it",
          "[cuda][attention]") {
  MOM_REQUIRE_GPU();
  const bool emulated = mom_emu_launches != nullptr;
  for (const bool bias : {true, false}) {
    INFO((bias ? "with a bias" : "without a bias"));
    const auto pair = run<float>(cuda::Precision::BF16, {.pair = true, .bias = bias});
    const auto ops = run<float>(cuda::Precision::BF16, {.pair = false, .bias = bias});
    check_same(pair, ops, emulated, false);
    CHECK(!same_bits(pair.dqkv, ops.dqkv));  // the backward read the bf16 output (D from it), not an fp32 one
    if (!emulated) continue;
    // Forward: the attention (bf16), w staged (the separate ops: att and w staged). Backward: dy (its column sums
    // into db) and w staged, the attention's kernel (the separate ops: dy, w and att staged).
    const index_t n = 140, d = 128, o = 48;
    CHECK(pair.forward.staging_copies == 1);
    CHECK(pair.forward.staging_bytes == 4 * o * d);
    CHECK(ops.forward.staging_copies == 2);
    CHECK(pair.forward.gemm_calls == 1);
    CHECK(pair.forward.launches == ops.forward.launches - 1);
    CHECK(pair.backward.staging_copies == 2);
    CHECK(pair.backward.staging_bytes == 4 * (n * o + o * d));
    CHECK(ops.backward.staging_copies == 3);
    CHECK(pair.backward.gemm_calls == 2);
    CHECK(pair.backward.launches == ops.backward.launches - 1);
  }
}

TEST_CASE("the attention-linear pair where the bf16 layout does not apply is the separate ops, bit for bit",
          "[cuda][attention]") {
  MOM_REQUIRE_GPU();
  const bool emulated = mom_emu_launches != nullptr;
  // att off 16 bytes, or head dim 32 (no mma kernel): the attention in fp32 and both products staging it.
  for (const Case c : {Case{.att_unaligned = true}, Case{.heads = 4}}) {
    INFO((c.att_unaligned ? "att unaligned" : "head dim 32"));
    Case ops_case = c;
    ops_case.pair = false;
    const auto pair = run<float>(cuda::Precision::BF16, c);
    const auto ops = run<float>(cuda::Precision::BF16, ops_case);
    check_same(pair, ops, emulated, true);
    if (emulated) {
      CHECK(pair.forward.staging_copies == 2);
      CHECK(pair.backward.staging_copies == 3);
    }
  }
}

TEST_CASE("the attention-linear pair under TF32 and in double is the separate ops, bit for bit", "[cuda][attention]") {
  MOM_REQUIRE_GPU();
  const bool emulated = mom_emu_launches != nullptr;
  check_same(run<float>(cuda::Precision::TF32, {.pair = true}), run<float>(cuda::Precision::TF32, {.pair = false}),
             true, emulated);
  check_same(run<double>(cuda::Precision::TF32, {.pair = true}), run<double>(cuda::Precision::TF32, {.pair = false}),
             true, emulated);
}

TEST_CASE("the attention-linear pair refuses mismatched shapes with the separate ops' messages, nothing written",
          "[cuda][attention]") {
  MOM_REQUIRE_GPU();
  auto& be = gpu<float>();
  be.set_precision(cuda::Precision::BF16);
  test::Rng rng(48);
  const index_t batch = 1, seq = 4, d = 16, o = 8, n = batch * seq, heads = 2;
  using CM = MatrixView<const float>;
  using CS = std::span<const float>;
  auto qkv = rand_arr<float>(n * 3 * d, rng), w = rand_arr<float>(o * d, rng), b = rand_arr<float>(o, rng);
  auto y = rand_arr<float>(n * o, rng), att = rand_arr<float>(n * d, rng), lse = rand_arr<float>(heads * n, rng);
  auto dy = rand_arr<float>(n * o, rng), dqkv = rand_arr<float>(n * 3 * d, rng), datt = rand_arr<float>(n * d, rng);
  auto dw = rand_arr<float>(o * d, rng), db = rand_arr<float>(o, rng);
  const auto y0 = y.fetch(), att0 = att.fetch(), lse0 = lse.fetch(), dqkv0 = dqkv.fetch(), dw0 = dw.fetch();
  // The attention's output a row short of qkv (the attention's message); then w one column short of att (the
  // linear's).
  CHECK_THROWS_WITH(be.attention_linear_forward(y.dm(n, o), att.dm(n - 1, d), lse.ds(), CM(qkv.dm(n, 3 * d)),
                                                CM(w.dm(o, d)), CS(b.ds()), batch, seq, heads),
                    Catch::Contains("attention_forward"));
  CHECK_THROWS_WITH(be.attention_linear_forward(y.dm(n, o), att.dm(n, d), lse.ds(), CM(qkv.dm(n, 3 * d)),
                                                CM(w.dm(o, d - 1)), CS(b.ds()), batch, seq, heads),
                    Catch::Contains("linear_forward"));
  CHECK_THROWS_WITH(be.attention_linear_backward(dqkv.dm(n, 3 * d), dw.dm(o, d), db.ds(), datt.dm(n, d),
                                                 CM(dy.dm(n, o)), CM(att.dm(n, d)), CS(lse.ds()),
                                                 CM(qkv.dm(n - 1, 3 * d)), CM(w.dm(o, d)), batch, seq, heads),
                    Catch::Contains("attention_backward"));
  be.sync();
  CHECK(y.fetch() == y0);
  CHECK(att.fetch() == att0);
  CHECK(lse.fetch() == lse0);
  CHECK(dqkv.fetch() == dqkv0);
  CHECK(dw.fetch() == dw0);
}

namespace {

// GPT-2's attention backward as modules/mha.hpp runs it: the LayerNorm-linear pair (qkv = LN(x)·w_qkvᵀ + b_qkv) and
// the attention-linear pair forward, then both backwards with dqkv handed over in `layout`.
struct HandOverRun {
  std::vector<float> dx, dgamma, dbeta, dw_qkv, db_qkv, dw_proj, db_proj;
  test::EmuCounters backward;
};
HandOverRun run_hand_over(GradLayout layout, index_t heads) {
  cuda::Backend<float> be;
  be.set_precision(cuda::Precision::BF16);
  test::Rng rng(49);
  const index_t batch = 2, seq = 70, d = 128, o = 48, n = batch * seq;
  using CM = MatrixView<const float>;
  using CS = std::span<const float>;
  auto x = rand_arr<float>(n * d, rng), gamma = rand_arr<float>(d, rng), beta = rand_arr<float>(d, rng);
  auto w_qkv = rand_arr<float>(3 * d * d, rng, -0.2, 0.2), b_qkv = rand_arr<float>(3 * d, rng);
  auto w_proj = rand_arr<float>(o * d, rng), b_proj = rand_arr<float>(o, rng), dy = rand_arr<float>(n * o, rng);
  auto ln_out = rand_arr<float>(n * d, rng), mean = rand_arr<float>(n, rng), rstd = rand_arr<float>(n, rng);
  auto qkv = rand_arr<float>(n * 3 * d, rng), att = rand_arr<float>(n * d, rng);
  auto lse = rand_arr<float>(batch * heads * seq, rng), y = rand_arr<float>(n * o, rng);
  auto dqkv = rand_arr<float>(n * 3 * d, rng), datt = rand_arr<float>(n * d, rng), dln = rand_arr<float>(n * d, rng);
  auto dx = rand_arr<float>(n * d, rng), dgamma = rand_arr<float>(d, rng), dbeta = rand_arr<float>(d, rng);
  auto dw_qkv = rand_arr<float>(3 * d * d, rng), db_qkv = rand_arr<float>(3 * d, rng);
  auto dw_proj = rand_arr<float>(o * d, rng), db_proj = rand_arr<float>(o, rng);
  const NormSaved<float> ln(ln_out.dm(n, d), mean.ds(), rstd.ds());
  be.norm_linear_forward(qkv.dm(n, 3 * d), ln, CM(x.dm(n, d)), CS(gamma.ds()), CS(beta.ds()), CM(w_qkv.dm(3 * d, d)),
                         CS(b_qkv.ds()));
  be.attention_linear_forward(y.dm(n, o), att.dm(n, d), lse.ds(), CM(qkv.dm(n, 3 * d)), CM(w_proj.dm(o, d)),
                              CS(b_proj.ds()), batch, seq, heads);
  be.sync();
  const bool counted = mom_emu_launches != nullptr;
  const auto t0 = counted ? test::EmuCounters::now() : test::EmuCounters{};
  be.attention_linear_backward(dqkv.dm(n, 3 * d), dw_proj.dm(o, d), db_proj.ds(), datt.dm(n, d), CM(dy.dm(n, o)),
                               CM(att.dm(n, d)), CS(lse.ds()), CM(qkv.dm(n, 3 * d)), CM(w_proj.dm(o, d)), batch, seq,
                               heads, layout);
  be.norm_linear_backward(dx.dm(n, d), dgamma.ds(), dbeta.ds(), dw_qkv.dm(3 * d, d), db_qkv.ds(), dln.dm(n, d),
                          CM(dqkv.dm(n, 3 * d)), CM(x.dm(n, d)), NormSaved<const float>(ln), CS(gamma.ds()),
                          CM(w_qkv.dm(3 * d, d)), layout);
  be.sync();
  HandOverRun r;
  if (counted) r.backward = test::EmuCounters::now() - t0;
  r.dx = dx.fetch(), r.dgamma = dgamma.fetch(), r.dbeta = dbeta.fetch(), r.dw_qkv = dw_qkv.fetch();
  r.db_qkv = db_qkv.fetch(), r.dw_proj = dw_proj.fetch(), r.db_proj = db_proj.fetch();
  return r;
}

}  // namespace

TEST_CASE("the attention pair hands dqkv to the LayerNorm-linear pair in bf16: the fp32 hand-over's products",
          "[cuda][attention]") {
  MOM_REQUIRE_GPU();
  const bool emulated = mom_emu_launches != nullptr;
  // Head dim 64: the bf16 hand-over. dK, dV and dQ reach the qkv linear's products as the bits its staging of the fp32
  // dqkv makes (on a GPU dQ's atomic additions run in no fixed order: there within bf16's precision); db_qkv is summed
  // from them.
  const auto bf16 = run_hand_over(GradLayout::backend, 2), fp32 = run_hand_over(GradLayout::fp32, 2);
  for (const auto& [a, b] : {std::pair{&bf16.dx, &fp32.dx}, {&bf16.dgamma, &fp32.dgamma}, {&bf16.dbeta, &fp32.dbeta},
                             {&bf16.dw_qkv, &fp32.dw_qkv}})
    check_close(*a, *b, emulated, 1e-2);
  CHECK(same_bits(bf16.dw_proj, fp32.dw_proj));
  CHECK(same_bits(bf16.db_proj, fp32.db_proj));
  CHECK(test::rel_error(bf16.db_qkv, fp32.db_qkv) <= 1e-2);
  CHECK(!same_bits(bf16.db_qkv, fp32.db_qkv));  // summed from the bf16 values, not the fp32 ones
  if (emulated) {
    // dqkv is neither zeroed nor staged whole: dQ's fp32 rows are zeroed and converted (one copy, 1/3 of dqkv's bytes),
    // the qkv linear reads all of it in place.
    const index_t n = 140, d = 128;
    CHECK(bf16.backward.staging_copies == fp32.backward.staging_copies);
    CHECK(fp32.backward.staging_bytes - bf16.backward.staging_bytes == 4 * n * 2 * d);
    CHECK(fp32.backward.memset_bytes - bf16.backward.memset_bytes == 4 * n * 2 * d);
    CHECK(bf16.backward.gemm_calls == fp32.backward.gemm_calls);
  }
  // Head dim 32 (no mma kernel): the backend's layout is fp32, the same ops (bit for bit under the emulation).
  const auto b32 = run_hand_over(GradLayout::backend, 4), f32 = run_hand_over(GradLayout::fp32, 4);
  for (const auto& [a, b] : {std::pair{&b32.dx, &f32.dx}, {&b32.dw_qkv, &f32.dw_qkv}, {&b32.db_qkv, &f32.db_qkv},
                             {&b32.dgamma, &f32.dgamma}})
    check_close(*a, *b, emulated, 1e-5);
  if (emulated) CHECK(b32.backward.staging_bytes == f32.backward.staging_bytes);
}

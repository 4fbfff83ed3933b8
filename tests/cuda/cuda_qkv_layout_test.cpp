// The LayerNorm-linear pair hands its output to the attention pair in bf16 (backend_concept.hpp, OutLayout;
// cuda::Backend's norm_linear_forward, norm_ops.hpp, and attention_linear_forward / _backward, attention_ops.hpp): under
// BF16, where the attention's bf16-qkv kernels apply (head dim 64), the qkv product writes qkv as bf16 only, with its
// bias in bf16 (cuBLASLt's bf16 epilogue), and the kernels stage Q, K and V from those bits. With a bias whose values
// are bf16 numbers the results are the fp32 qkv's bit for bit under the emulation (the kernels round the fp32 qkv to the
// same bits when they stage it); with any bias, within bf16's precision. Elsewhere the layout request changes nothing.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <span>
#include <utility>
#include <vector>

#include "cuda/cuda_test_support.hpp"

using namespace mom;
using namespace mom::test;

namespace {

// x rounded to the nearest bf16 number (ties to even), as a float.
float bf16_number(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  u += 0x7fffu + ((u >> 16) & 1u);
  u &= 0xffff0000u;
  std::memcpy(&x, &u, sizeof u);
  return x;
}

struct QkvRun {
  std::vector<float> y, lse, dx, dgamma, dbeta, dw_qkv, db_qkv, dw_proj, db_proj;
  std::vector<float> qkv;  // the qkv buffer after the forward, as its bits lie
  test::EmuCounters forward;
};
struct QkvCase {
  OutLayout layout{};
  index_t heads = 2;           // d = 128: head dim 64 (the mma kernels), or 4 heads of 32
  bool bf16_bias = true;       // b_qkv's values rounded to bf16 numbers first
  bool att_unaligned = false;  // att 4 bytes past a 16-byte boundary (the attention's bf16 layout does not fit)
  bool lt_refuse = false;      // cuBLASLt finds no algorithm (the qkv product's fp32 fallback)
  index_t batch = 2, seq = 70;  // 70: two key tiles; 200: four (the forward's two-deep copies reuse a buffer)
};
// GPT-2's attention as modules/mha.hpp runs it on a fresh backend under BF16: the LayerNorm-linear pair with qkv in
// `c.layout`, the attention-linear pair, then both backwards with dqkv handed over in the backend's layout.
QkvRun run_qkv(const QkvCase& c) {
  cuda::Backend<float> be;
  be.set_precision(cuda::Precision::BF16);
  test::Rng rng(53);
  const index_t batch = c.batch, seq = c.seq, d = 128, o = 48, n = batch * seq, heads = c.heads;
  using CM = MatrixView<const float>;
  using CS = std::span<const float>;
  auto x = rand_arr<float>(n * d, rng), gamma = rand_arr<float>(d, rng), beta = rand_arr<float>(d, rng);
  auto w_qkv = rand_arr<float>(3 * d * d, rng, -0.2, 0.2);
  std::vector<float> bq = random_vec<float>(std::size_t(3 * d), rng, -1, 1);
  if (c.bf16_bias)
    for (float& v : bq) v = bf16_number(v);
  Arr<float> b_qkv(bq);
  auto w_proj = rand_arr<float>(o * d, rng), b_proj = rand_arr<float>(o, rng), dy = rand_arr<float>(n * o, rng);
  auto ln_out = rand_arr<float>(n * d, rng), mean = rand_arr<float>(n, rng), rstd = rand_arr<float>(n, rng);
  auto qkv = rand_arr<float>(n * 3 * d, rng), att_buf = rand_arr<float>(n * d + 4, rng);
  auto lse = rand_arr<float>(batch * heads * seq, rng), y = rand_arr<float>(n * o, rng);
  auto dqkv = rand_arr<float>(n * 3 * d, rng), datt = rand_arr<float>(n * d, rng), dln = rand_arr<float>(n * d, rng);
  auto dx = rand_arr<float>(n * d, rng), dgamma = rand_arr<float>(d, rng), dbeta = rand_arr<float>(d, rng);
  auto dw_qkv = rand_arr<float>(3 * d * d, rng), db_qkv = rand_arr<float>(3 * d, rng);
  auto dw_proj = rand_arr<float>(o * d, rng), db_proj = rand_arr<float>(o, rng);
  const MatrixView<float> att(att_buf.d.data() + (c.att_unaligned ? 1 : 0), n, d);
  const NormSaved<float> ln(ln_out.dm(n, d), mean.ds(), rstd.ds());
  const bool counted = mom_emu_launches != nullptr;
  if (c.lt_refuse) mom_emu_lt_refuse(1);
  be.sync();
  const auto t0 = counted ? test::EmuCounters::now() : test::EmuCounters{};
  be.norm_linear_forward(qkv.dm(n, 3 * d), ln, CM(x.dm(n, d)), CS(gamma.ds()), CS(beta.ds()), CM(w_qkv.dm(3 * d, d)),
                         CS(b_qkv.ds()), c.layout);
  be.attention_linear_forward(y.dm(n, o), att, lse.ds(), CM(qkv.dm(n, 3 * d)), CM(w_proj.dm(o, d)), CS(b_proj.ds()),
                              batch, seq, heads);
  be.sync();
  QkvRun r;
  if (counted) r.forward = test::EmuCounters::now() - t0;
  r.qkv = qkv.fetch();
  be.attention_linear_backward(dqkv.dm(n, 3 * d), dw_proj.dm(o, d), db_proj.ds(), datt.dm(n, d), CM(dy.dm(n, o)),
                               CM(att), CS(lse.ds()), CM(qkv.dm(n, 3 * d)), CM(w_proj.dm(o, d)), batch, seq, heads,
                               GradLayout::backend);
  be.norm_linear_backward(dx.dm(n, d), dgamma.ds(), dbeta.ds(), dw_qkv.dm(3 * d, d), db_qkv.ds(), dln.dm(n, d),
                          CM(dqkv.dm(n, 3 * d)), CM(x.dm(n, d)), NormSaved<const float>(ln), CS(gamma.ds()),
                          CM(w_qkv.dm(3 * d, d)), GradLayout::backend);
  be.sync();
  if (c.lt_refuse) mom_emu_lt_refuse(0);
  r.y = y.fetch(), r.lse = lse.fetch(), r.dx = dx.fetch(), r.dgamma = dgamma.fetch(), r.dbeta = dbeta.fetch();
  r.dw_qkv = dw_qkv.fetch(), r.db_qkv = db_qkv.fetch(), r.dw_proj = dw_proj.fetch(), r.db_proj = db_proj.fetch();
  return r;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
// Every result of two runs: bit for bit where `exact`, else within tol.
void check_results(const QkvRun& a, const QkvRun& b, bool exact, double tol) {
  for (const auto& [p, q] : {std::pair{&a.y, &b.y}, {&a.lse, &b.lse}, {&a.dx, &b.dx}, {&a.dgamma, &b.dgamma},
                             {&a.dbeta, &b.dbeta}, {&a.dw_qkv, &b.dw_qkv}, {&a.db_qkv, &b.db_qkv},
                             {&a.dw_proj, &b.dw_proj}, {&a.db_proj, &b.db_proj}}) {
    if (exact)
      CHECK(same_bits(*p, *q));
    else
      CHECK(test::rel_error(*p, *q) <= tol);
  }
}
// The bf16 bits in the first half of a qkv buffer of n rows of 3d, against the fp32 qkv they round.
void check_bf16_rows(const std::vector<float>& qkv_bf16, const std::vector<float>& qkv_fp32, bool exact) {
  const auto* bits = reinterpret_cast<const std::uint16_t*>(qkv_bf16.data());
  std::vector<float> rounded(qkv_fp32.size()), read(qkv_fp32.size());
  for (std::size_t i = 0; i < qkv_fp32.size(); ++i) {
    rounded[i] = bf16_number(qkv_fp32[i]);
    const std::uint32_t u = std::uint32_t(bits[i]) << 16;
    std::memcpy(&read[i], &u, sizeof u);
  }
  if (exact)
    CHECK(same_bits(read, rounded));
  else
    CHECK(test::rel_error(read, rounded) <= 1e-2);
}

}  // namespace

TEST_CASE("the qkv product hands qkv to the attention pair in bf16: the fp32 qkv's bits with a bf16 bias",
          "[cuda][attention]") {
  MOM_REQUIRE_GPU();
  const bool emulated = mom_emu_launches != nullptr;
  const OutLayout attention{.attention_heads = 2};
  // Head dim 64. The qkv buffer's first half holds the bf16 rows of the fp32 qkv (on a GPU cuBLASLt may sum in another
  // order for a bf16 D: there within bf16's precision), and every result is the fp32 qkv's.
  const auto bf16 = run_qkv({.layout = attention}), fp32 = run_qkv({});
  check_bf16_rows(bf16.qkv, fp32.qkv, emulated);
  check_results(bf16, fp32, emulated, 1e-2);
  if (emulated) {
    // The forward: the same products and launches but the bias's staging (a conversion of 3d values), and no fp32 qkv
    // written: nothing else differs.
    const index_t d = 128;
    CHECK(bf16.forward.gemm_calls == fp32.forward.gemm_calls);
    CHECK(bf16.forward.staging_copies == fp32.forward.staging_copies + 1);
    CHECK(bf16.forward.staging_bytes == fp32.forward.staging_bytes + 4 * 3 * d);
    CHECK(bf16.forward.launches == fp32.forward.launches + 1);
  }
  // Four key tiles (a query tile's copies go through each buffer twice).
  const auto bf16_long = run_qkv({.layout = attention, .batch = 1, .seq = 200}),
             fp32_long = run_qkv({.batch = 1, .seq = 200});
  check_bf16_rows(bf16_long.qkv, fp32_long.qkv, emulated);
  check_results(bf16_long, fp32_long, emulated, 1e-2);
  // Any bias: it enters in bf16 (as PyTorch's autocast casts it), the results within bf16's precision.
  const auto bf16_any = run_qkv({.layout = attention, .bf16_bias = false}),
             fp32_any = run_qkv({.bf16_bias = false});
  check_results(bf16_any, fp32_any, false, 2e-2);
  CHECK(!same_bits(bf16_any.y, fp32_any.y));
  // The attention's output in fp32 (its bf16 layout does not fit an unaligned att): the same kernels read the bf16
  // qkv, the fp32 qkv's results again.
  const auto bf16_att32 = run_qkv({.layout = attention, .att_unaligned = true}),
             fp32_att32 = run_qkv({.att_unaligned = true});
  check_bf16_rows(bf16_att32.qkv, fp32_att32.qkv, emulated);
  check_results(bf16_att32, fp32_att32, emulated, 1e-2);
}

TEST_CASE("the qkv layout request changes nothing where the attention's bf16 kernels do not apply", "[cuda][attention]") {
  MOM_REQUIRE_GPU();
  const bool emulated = mom_emu_launches != nullptr;
  // Head dim 32 (4 heads): the SIMT and wmma kernels read fp32 qkv; the request leaves it fp32.
  const auto asked = run_qkv({.layout = {.attention_heads = 4}, .heads = 4}), plain = run_qkv({.heads = 4});
  CHECK(same_bits(asked.qkv, plain.qkv));
  check_results(asked, plain, emulated, 1e-5);
  // No cuBLASLt algorithm for the bf16 epilogue (emulated only): the qkv product falls back to fp32, bit for bit.
  if (emulated) {
    const auto refused = run_qkv({.layout = {.attention_heads = 2}, .lt_refuse = true}),
               plain_refused = run_qkv({.lt_refuse = true});
    CHECK(same_bits(refused.qkv, plain_refused.qkv));
    check_results(refused, plain_refused, true, 0);
  }
}

TEST_CASE("a qkv the pair wrote in bf16 read as another matrix is refused with one line", "[cuda][attention]") {
  MOM_REQUIRE_GPU();
  cuda::Backend<float> be;
  be.set_precision(cuda::Precision::BF16);
  test::Rng rng(59);
  const index_t batch = 1, seq = 64, d = 128, n = batch * seq;
  using CM = MatrixView<const float>;
  using CS = std::span<const float>;
  auto x = rand_arr<float>(n * d, rng), gamma = rand_arr<float>(d, rng), beta = rand_arr<float>(d, rng);
  auto w_qkv = rand_arr<float>(3 * d * d, rng), b_qkv = rand_arr<float>(3 * d, rng);
  auto w_proj = rand_arr<float>(d * d, rng), b_proj = rand_arr<float>(d, rng);
  auto ln_out = rand_arr<float>(n * d, rng), mean = rand_arr<float>(n, rng), rstd = rand_arr<float>(n, rng);
  auto qkv = rand_arr<float>(n * 3 * d + 8, rng), att = rand_arr<float>(n * d, rng), y = rand_arr<float>(n * d, rng);
  auto lse = rand_arr<float>(batch * 2 * seq, rng);
  be.norm_linear_forward(qkv.dm(n, 3 * d), NormSaved<float>(ln_out.dm(n, d), mean.ds(), rstd.ds()), CM(x.dm(n, d)),
                         CS(gamma.ds()), CS(beta.ds()), CM(w_qkv.dm(3 * d, d)), CS(b_qkv.ds()),
                         OutLayout{.attention_heads = 2});
  be.sync();
  const auto y0 = y.fetch();
  // The same buffer with rows 3d + 8 apart (fewer rows): not the matrix the product wrote.
  CHECK_THROWS_WITH(be.attention_linear_forward(y.dm(n - 1, d), att.dm(n - 1, d),
                                                std::span<float>(lse.ds().data(), std::size_t(2 * (seq - 1))),
                                                CM(qkv.dm(n - 1, 3 * d, 3 * d + 8)), CM(w_proj.dm(d, d)),
                                                CS(b_proj.ds()), batch, seq - 1, 2),
                    Catch::Contains("qkv") && Catch::Contains("dense matrix it wrote"));
  be.sync();
  CHECK(y.fetch() == y0);
}

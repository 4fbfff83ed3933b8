// Cross-backend op suite (in the spirit of ggml's test-backend-ops): every op of cuda::Backend<T>
// runs on the same random inputs as cpu::Backend<T>, and outputs and gradients must agree.
// Backward ops accumulate, so every gradient starts from random values, not zeros.
//
// Tolerances (max |gpu - cpu| / max |cpu| over the array):
//   double: 1e-10 everywhere.
//   float, own kernels: 1e-5 (elementwise, reductions), 1e-4 (attention: exp of long dot products).
//   float through cuBLAS with TF32 (the default): 1e-2 (inputs rounded to 10 mantissa bits);
//   the same ops with set_tf32(false): 1e-5.
//   bf16 GEMMs (Precision::BF16): 1e-5 against a reference with bf16-rounded operands.
// Without a CUDA device every case prints "no CUDA device: skipped" once and passes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "cuda/cuda_test_support.hpp"

using namespace mom;
using namespace mom::test;

namespace {



// The device copy must match the CPU copy within tol (relative to the CPU's largest magnitude).
template <class T, class U>
void expect_close(Arr<T, U>& a, double tol, const std::string& what) {
  const auto got = a.fetch();
  const double err = test::rel_error(got, a.h);
  INFO(what << ": relative error " << err << " (tolerance " << tol << ")");
  CHECK(err <= tol);
}

template <class T>
void expect_equal_tokens(Arr<T, token_t>& a, const std::string& what) {
  INFO(what);
  CHECK(a.fetch() == a.h);
}

}  // namespace

TEMPLATE_TEST_CASE("gemm matches cpu (all transposes and strided C with alpha and beta)", "[cuda]", float, double) {
  MOM_REQUIRE_GPU();
  using T = TestType;
  test::Rng rng(1);
  const index_t m = 37, n = 29, k = 45, ldc = n + 3;
  for (const bool tf32 : {true, false}) {
    gpu<T>().set_tf32(tf32);
    for (const bool ta : {false, true})
      for (const bool tb : {false, true}) {
        INFO("ta " << ta << " tb " << tb << " tf32 " << tf32);
        auto A = rand_arr<T>(m * k, rng), B = rand_arr<T>(k * n, rng), C = rand_arr<T>(m * ldc, rng);
        const index_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
        host<T>().gemm(C.hm(m, n, ldc), A.hm(ar, ac), ta ? cpu::Trans::T : cpu::Trans::N, B.hm(br, bc),
                       tb ? cpu::Trans::T : cpu::Trans::N, T(0.7), T(0.3));
        gpu<T>().gemm(C.dm(m, n, ldc), A.dm(ar, ac), ta ? cuda::Trans::T : cuda::Trans::N, B.dm(br, bc),
                      tb ? cuda::Trans::T : cuda::Trans::N, T(0.7), T(0.3));
        expect_close(C, tf32 ? tol_tf32<T> : tol_kernel<T>, "gemm C");
      }
  }
  gpu<T>().set_tf32(true);
}

// bf16 of x, round to nearest even, computed independently of the kernel's bit manipulation: keep the
// 8 significant bits of frexp's mantissa with nearbyint (ties to even in the default rounding mode).
double bf16_reference(float x) {
  int e = 0;
  const double f = std::frexp(double(x), &e);  // x = f · 2^e, 0.5 <= |f| < 1
  return std::ldexp(std::nearbyint(std::ldexp(f, 8)), e - 8);
}

TEST_CASE("bf16 gemm: operands rounded to bf16 (nearest even), fp32 accumulation, staging sized once", "[cuda]") {
  MOM_REQUIRE_GPU();
  test::Rng rng(11);
  const index_t m = 37, n = 29, k = 45, ldc = n + 3, lda = k + 5;
  auto& be = gpu<float>();
  be.set_precision(cuda::Precision::BF16);
  for (const bool ta : {false, true})
    for (const bool tb : {false, true}) {
      INFO("ta " << ta << " tb " << tb);
      const index_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
      auto A = rand_arr<float>(ar * lda, rng), B = rand_arr<float>(br * bc, rng), C = rand_arr<float>(m * ldc, rng);
      const std::vector<float> c0 = C.h;
      // References in double: with bf16-rounded operands (what must come out) and with the fp32 operands.
      std::vector<double> want(std::size_t(m * n)), exact(std::size_t(m * n));
      for (index_t i = 0; i < m; ++i)
        for (index_t j = 0; j < n; ++j) {
          double s16 = 0, s32 = 0;
          for (index_t l = 0; l < k; ++l) {
            const float a = ta ? A.h[std::size_t(l * lda + i)] : A.h[std::size_t(i * lda + l)];
            const float b = tb ? B.h[std::size_t(j * bc + l)] : B.h[std::size_t(l * bc + j)];
            s16 += bf16_reference(a) * bf16_reference(b);
            s32 += double(a) * double(b);
          }
          const double c = c0[std::size_t(i * ldc + j)];
          want[std::size_t(i * n + j)] = 0.7 * s16 + 0.3 * c;
          exact[std::size_t(i * n + j)] = 0.7 * s32 + 0.3 * c;
        }
      be.gemm(C.dm(m, n, ldc), MatrixView<const float>(A.dm(ar, ac, lda)), ta ? cuda::Trans::T : cuda::Trans::N,
              MatrixView<const float>(B.dm(br, bc)), tb ? cuda::Trans::T : cuda::Trans::N, 0.7f, 0.3f);
      const std::vector<float> got = C.fetch();
      double scale = 0, err16 = 0, err32 = 0;
      for (index_t i = 0; i < m; ++i)
        for (index_t j = 0; j < n; ++j) {
          const double g = got[std::size_t(i * ldc + j)];
          scale = std::max(scale, std::abs(want[std::size_t(i * n + j)]));
          err16 = std::max(err16, std::abs(g - want[std::size_t(i * n + j)]));
          err32 = std::max(err32, std::abs(g - exact[std::size_t(i * n + j)]));
        }
      INFO("error vs bf16-operand reference " << err16 / scale << ", vs fp32-operand reference " << err32 / scale);
      CHECK(err16 / scale <= 1e-5);  // fp32 accumulation of the rounded operands
      CHECK(err32 / scale > 1e-4);   // ... and the operands really were rounded to bf16
      CHECK(err32 / scale < 2e-2);
      // Strided C: the padding columns are untouched.
      for (index_t i = 0; i < m; ++i)
        for (index_t j = n; j < ldc; ++j) CHECK(got[std::size_t(i * ldc + j)] == c0[std::size_t(i * ldc + j)]);
    }
  // The staging buffer grew for the largest operands above; the same GEMMs again never allocate.
  const index_t grows = be.context().bf16_stage_grows;
  CHECK(be.context().bf16_stage_size >= m * k + k * n);
  auto A = rand_arr<float>(m * k, rng), B = rand_arr<float>(k * n, rng), C = rand_arr<float>(m * n, rng);
  for (int rep = 0; rep < 3; ++rep)
    be.gemm(C.dm(m, n), MatrixView<const float>(A.dm(m, k)), cuda::Trans::N, MatrixView<const float>(B.dm(k, n)),
            cuda::Trans::N);
  be.sync();
  CHECK(be.context().bf16_stage_grows == grows);
  be.set_precision(cuda::Precision::TF32);
}

TEST_CASE("linear forward with a bias: cuBLASLt's bias epilogue, and the broadcast path where it has no algorithm",
          "[cuda]") {
  MOM_REQUIRE_GPU();
  // Float products take cuBLASLt's CUBLASLT_EPILOGUE_BIAS (lt.hpp); where cuBLASLt finds no algorithm the bias is
  // broadcast and added by the GEMM's beta = 1, as double does. The emulated cuBLASLt can be made to find none
  // (mom_emu_lt_refuse); a real one is checked on the epilogue path only. A fresh backend each time: no plan yet.
  test::Rng rng(12);
  const index_t n = 37, in = 45, out = 29, ldy = out + 3;
  auto x = rand_arr<float>(n * in, rng), w = rand_arr<float>(out * in, rng), b = rand_arr<float>(out, rng);
  gpu<float>().sync();
  struct Case {
    cuda::Precision precision;
    double tol;
    const char* name;
  };
  for (const Case k : {Case{cuda::Precision::FP32, tol_kernel<float>, "FP32"}, Case{cuda::Precision::TF32, tol_tf32<float>, "TF32"},
                       Case{cuda::Precision::BF16, 2e-2, "BF16"}})
    for (const bool refuse : {false, true}) {
      if (refuse && !mom_emu_lt_refuse) continue;
      INFO(k.name << (refuse ? ", cuBLASLt without an algorithm" : ", cuBLASLt's bias epilogue"));
      auto y = rand_arr<float>(n * ldy, rng);
      gpu<float>().sync();
      if (refuse) mom_emu_lt_refuse(1);
      const long before = mom_emu_launches ? mom_emu_launches() : 0;
      {
        cuda::Backend<float> be;
        be.set_precision(k.precision);
        be.linear_forward(y.dm(n, out, ldy), MatrixView<const float>(x.dm(n, in)), MatrixView<const float>(w.dm(out, in)),
                          std::span<const float>(b.ds()));
        be.sync();
      }
      const long launched = mom_emu_launches ? mom_emu_launches() - before : -1;
      if (refuse) mom_emu_lt_refuse(0);
      host<float>().linear_forward(y.hm(n, out, ldy), MatrixView<const float>(x.hm(n, in)),
                                   MatrixView<const float>(w.hm(out, in)), std::span<const float>(b.hs()));
      expect_close(y, k.tol, "y");  // the padding columns: the CPU leaves them too
      // Kernel launches: the bf16 staging of x and w, and the broadcast only where cuBLASLt has no algorithm.
      if (mom_emu_launches) CHECK(launched == (k.precision == cuda::Precision::BF16 ? 2 : 0) + (refuse ? 1 : 0));
    }
}

TEST_CASE("bf16 linear backward: the bias gradient summed while dy is staged, one launch fewer", "[cuda]") {
  MOM_REQUIRE_GPU();
  // Under BF16 linear_backward stages dy once for dx and dw and adds its column sums to db in that pass
  // (to_bf16_sums_kernel) instead of reading dy again (add_column_sums). db is an fp32 sum of fp32 dy on both
  // backends (kernel tolerance); dx and dw are bf16 products. Shapes: 16-byte rows (the vector path) and odd widths
  // and strides (the scalar path), more rows than the emulation's row-chunk grid covers at once (its stride loop),
  // more columns than one block's 512.
  test::Rng rng(13);
  struct Shape {
    index_t n, in, out, ld_dy;
  };
  for (const Shape sh : {Shape{300, 40, 24, 24}, Shape{67, 29, 37, 41}, Shape{130, 16, 600, 600}}) {
    const auto [n, in, out, ld_dy] = sh;
    INFO("n " << n << ", in " << in << ", out " << out << ", dy's row stride " << ld_dy);
    auto x = rand_arr<float>(n * in, rng), w = rand_arr<float>(out * in, rng), dy = rand_arr<float>(n * ld_dy, rng);
    auto dx = rand_arr<float>(n * in, rng), dw = rand_arr<float>(out * in, rng), db = rand_arr<float>(out, rng);
    auto& be = gpu<float>();
    be.set_precision(cuda::Precision::BF16);
    be.sync();
    const long before = mom_emu_launches ? mom_emu_launches() : 0;
    be.linear_backward(dx.dm(n, in), dw.dm(out, in), db.ds(), MatrixView<const float>(dy.dm(n, out, ld_dy)),
                       MatrixView<const float>(x.dm(n, in)), MatrixView<const float>(w.dm(out, in)));
    be.sync();
    const long launched = mom_emu_launches ? mom_emu_launches() - before : -1;
    be.set_precision(cuda::Precision::TF32);
    host<float>().linear_backward(dx.hm(n, in), dw.hm(out, in), db.hs(), MatrixView<const float>(dy.hm(n, out, ld_dy)),
                                  MatrixView<const float>(x.hm(n, in)), MatrixView<const float>(w.hm(out, in)));
    expect_close(db, tol_kernel<float> * 10, "db");
    expect_close(dx, 2e-2, "dx");
    expect_close(dw, 2e-2, "dw");
    // The staging of dy (with its sums), w and x: no column-sum kernel of its own.
    if (mom_emu_launches) CHECK(launched == 3);
  }
}

TEST_CASE("bf16 LM head over the padded vocabulary: linear_forward / linear_backward's results, zeros in the padding",
          "[cuda]") {
  MOM_REQUIRE_GPU();
  test::Rng rng(12);
  // A vocabulary of 61 rows laid out 64 wide (ops.hpp, padded_vocab): the head's forward and dx products run over
  // 64 columns with zero rows staged below w; the columns [0, 61) must equal the unpadded products' (the extra terms
  // are exact zeros: equal bits under the emulation, to the last place or so on a GPU, whose kernels for the two
  // shapes may differ), and the forward writes zeros into the padding.
  const index_t n = 19, d = 24, V = 61, ld = 64;
  auto& be = gpu<float>();
  be.set_precision(cuda::Precision::BF16);
  auto x = rand_arr<float>(n * d, rng), w = rand_arr<float>(V * d, rng);
  auto padded = rand_arr<float>(n * ld, rng, 5, 9), plain = rand_arr<float>(n * V, rng);  // padding poisoned
  be.lm_head_forward(padded.dm(n, V, ld), x.dm(n, d), w.dm(V, d));
  be.linear_forward(plain.dm(n, V), x.dm(n, d), w.dm(V, d), std::span<const float>{});
  const auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    double err = 0, scale = 1e-30;
    for (std::size_t i = 0; i < a.size(); ++i) {
      err = std::max(err, std::abs(double(a[i]) - double(b[i])));  // NaN makes the check below fail
      scale = std::max(scale, std::abs(double(b[i])));
      if (std::isnan(a[i])) return false;
    }
    return err <= 1e-6 * scale;
  };
  const auto got = padded.fetch(), want = plain.fetch();
  std::vector<float> head(std::size_t(n * V));
  for (index_t i = 0; i < n; ++i) {
    for (index_t j = 0; j < V; ++j) head[std::size_t(i * V + j)] = got[std::size_t(i * ld + j)];
    for (index_t j = V; j < ld; ++j) CHECK(got[std::size_t(i * ld + j)] == 0.0f);
  }
  CHECK(same(head, want));
  // Backward from a gradient whose padding columns hold garbage (they must be read as zeros).
  auto dy_padded = rand_arr<float>(n * ld, rng), dy_plain = Arr<float>(std::vector<float>(std::size_t(n * V)));
  for (index_t i = 0; i < n; ++i)
    for (index_t j = 0; j < ld; ++j)
      if (j < V) dy_plain.h[std::size_t(i * V + j)] = dy_padded.h[std::size_t(i * ld + j)];
      else dy_padded.h[std::size_t(i * ld + j)] = std::numeric_limits<float>::quiet_NaN();
  be.from_host(dy_padded.ds(), std::span<const float>(dy_padded.h));
  be.from_host(dy_plain.ds(), std::span<const float>(dy_plain.h));
  auto dx1 = rand_arr<float>(n * d, rng), dw1 = rand_arr<float>(V * d, rng);
  auto dx2 = Arr<float>(dx1.h), dw2 = Arr<float>(dw1.h);
  be.lm_head_backward(dx1.dm(n, d), dw1.dm(V, d), dy_padded.dm(n, V, ld), x.dm(n, d), w.dm(V, d));
  be.linear_backward(dx2.dm(n, d), dw2.dm(V, d), std::span<float>{}, dy_plain.dm(n, V), x.dm(n, d), w.dm(V, d));
  CHECK(same(dx1.fetch(), dx2.fetch()));
  CHECK(same(dw1.fetch(), dw2.fetch()));
  be.set_precision(cuda::Precision::TF32);
}

TEST_CASE("LM head backward from the loss in one op: cross_entropy_backward then lm_head_backward, bit for bit",
          "[cuda]") {
  MOM_REQUIRE_GPU();
  test::Rng rng(13);
  // lm_head_loss_backward (ops.hpp) against the two ops it replaces, over a vocabulary laid out padded (61 in rows 64
  // wide: the products run 64 wide) and unpadded (64), with an ignored row. Under BF16 it writes dlogits straight
  // into the staging as bf16: the same bits as cross_entropy_backward's fp32 gradient staged by lm_head_backward (the
  // same rounding of the same values, then the same products), and the logits are only read: their padding is
  // poisoned with NaN, which must not reach the gradients. Under TF32 it is the two ops (the logits overwritten).
  const index_t n = 19, d = 24;
  auto& be = gpu<float>();
  std::vector<token_t> t(static_cast<std::size_t>(n));
  for (auto& v : t) v = static_cast<token_t>(rng.integer(0, 60));
  t[4] = -1;
  auto targets = tok_arr<float>(t);
  for (const auto precision : {cuda::Precision::BF16, cuda::Precision::TF32})
    for (const auto [V, ld] : std::initializer_list<std::pair<index_t, index_t>>{{61, 64}, {64, 64}}) {
      INFO((precision == cuda::Precision::BF16 ? "bf16" : "tf32") << ", V " << V << " in rows " << ld << " wide");
      be.set_precision(precision);
      auto x = rand_arr<float>(n * d, rng), w = rand_arr<float>(V * d, rng), lse = rand_arr<float>(n, rng);
      auto loss = rand_arr<float>(1, rng), logits = rand_arr<float>(n * ld, rng, -4, 4);
      for (index_t i = 0; i < n; ++i)
        for (index_t j = V; j < ld; ++j) logits.h[std::size_t(i * ld + j)] = std::numeric_limits<float>::quiet_NaN();
      be.from_host(logits.ds(), std::span<const float>(logits.h));
      be.cross_entropy_forward(loss.ds(), lse.ds(), logits.dm(n, V, ld), targets.ds());
      auto logits2 = Arr<float>(logits.fetch());
      auto dx1 = rand_arr<float>(n * d, rng), dw1 = rand_arr<float>(V * d, rng);
      auto dx2 = Arr<float>(dx1.h), dw2 = Arr<float>(dw1.h);
      const long staged_before = mom_emu_staging_copies ? mom_emu_staging_copies() : 0;
      be.lm_head_loss_backward(dx1.dm(n, d), dw1.dm(V, d), logits.dm(n, V, ld), lse.ds(), targets.ds(), 0.75f,
                               x.dm(n, d), w.dm(V, d));
      be.sync();
      const long staged = mom_emu_staging_copies ? mom_emu_staging_copies() - staged_before : -1;
      be.cross_entropy_backward(logits2.dm(n, V, ld), logits2.dm(n, V, ld), lse.ds(), targets.ds(), 0.75f);
      be.lm_head_backward(dx2.dm(n, d), dw2.dm(V, d), logits2.dm(n, V, ld), x.dm(n, d), w.dm(V, d));
      const auto a = dx1.fetch(), b = dx2.fetch(), c = dw1.fetch(), e = dw2.fetch();
      const auto bits = [](const std::vector<float>& u, const std::vector<float>& v) {
        return std::memcmp(u.data(), v.data(), u.size() * sizeof(float)) == 0;
      };
      CHECK(bits(a, b));
      CHECK(bits(c, e));
      for (const float v : a) REQUIRE(std::isfinite(v));
      const auto after = logits.fetch(), grad = logits2.fetch();
      if (precision == cuda::Precision::BF16) {
        CHECK(bits(after, logits2.initial));  // only read
        if (mom_emu_staging_copies) CHECK(staged == 2);  // w and x; dlogits written staged
      } else {
        for (index_t i = 0; i < n; ++i)  // the gradient over the logits, as cross_entropy_backward leaves it
          for (index_t j = 0; j < V; ++j) CHECK(after[std::size_t(i * ld + j)] == grad[std::size_t(i * ld + j)]);
      }
    }
  be.set_precision(cuda::Precision::TF32);
}

TEMPLATE_TEST_CASE("attention forward/backward match cpu (head dims 8 to 128 and ragged tiles)", "[cuda]", float,
                   double) {
  MOM_REQUIRE_GPU();
  using T = TestType;
  test::Rng rng(7);
  struct Shape3 {
    index_t batch, seq, heads, hd;
  };
  // Float runs twice: Precision::FP32 (the SIMT kernels everywhere, tol_attention) and the default
  // TF32, under which head dims 64 and 128 take the tensor-core kernels (kernels/attention_tc.cuh): they
  // round Q, K, V, dO and P to TF32 (2^-11 relative), which moves out and lse by up to ~4e-4 of
  // their scale, so those shapes get a TF32-sized tolerance here; the exact rounding model is
  // checked by cuda_tc_attention_test.cpp.
  const std::vector<cuda::Precision> precisions =
      std::is_same_v<T, float> ? std::vector{cuda::Precision::FP32, cuda::Precision::TF32}
                               : std::vector{cuda::Precision::TF32};
  for (const cuda::Precision precision : precisions)
  for (const Shape3 s : {Shape3{2, 37, 2, 16}, Shape3{1, 70, 2, 64}, Shape3{2, 19, 1, 80}, Shape3{1, 33, 1, 128}, Shape3{1, 1, 3, 8}}) {
    const index_t d = s.heads * s.hd, n = s.batch * s.seq;
    const bool tc = std::is_same_v<T, float> && precision != cuda::Precision::FP32 && (s.hd == 64 || s.hd == 128);
    const double tol = tc ? 2e-3 : tol_attention<T>;
    gpu<T>().set_precision(precision);
    INFO("batch " << s.batch << " seq " << s.seq << " heads " << s.heads << " hd " << s.hd << " tensor cores " << tc);
    auto qkv = rand_arr<T>(n * 3 * d, rng, -1.5, 1.5), out = rand_arr<T>(n * d, rng);
    auto lse = rand_arr<T>(s.batch * s.heads * s.seq, rng), dout = rand_arr<T>(n * d, rng);
    auto dqkv = rand_arr<T>(n * 3 * d, rng);
    host<T>().attention_forward(out.hm(n, d), lse.hs(), qkv.hm(n, 3 * d), s.batch, s.seq, s.heads);
    gpu<T>().attention_forward(out.dm(n, d), lse.ds(), qkv.dm(n, 3 * d), s.batch, s.seq, s.heads);
    expect_close(out, tol, "out");
    expect_close(lse, tol, "lse");
    host<T>().attention_backward(dqkv.hm(n, 3 * d), dout.hm(n, d), out.hm(n, d), std::span<const T>(lse.hs()),
                                 qkv.hm(n, 3 * d), s.batch, s.seq, s.heads);
    gpu<T>().attention_backward(dqkv.dm(n, 3 * d), dout.dm(n, d), out.dm(n, d), std::span<const T>(lse.ds()),
                                qkv.dm(n, 3 * d), s.batch, s.seq, s.heads);
    expect_close(dqkv, tc ? tol : tol * 10, "dqkv");
  }
  gpu<T>().set_precision(cuda::Precision::TF32);
}

TEST_CASE("attention backward passes a finite-difference check in double on the GPU", "[cuda]") {
  MOM_REQUIRE_GPU();
  using T = double;
  auto& be = gpu<T>();
  test::Rng rng(8);
  const index_t batch = 1, seq = 9, heads = 2, hd = 4, d = heads * hd, n = batch * seq;
  std::vector<T> qkv = test::random_vec<T>(static_cast<std::size_t>(n * 3 * d), rng);
  const std::vector<T> w = test::random_vec<T>(static_cast<std::size_t>(n * d), rng);  // loss = Σ w ∘ out
  auto dq = be.alloc<T>(n * 3 * d), dout = be.alloc<T>(n * d), dlse = be.alloc<T>(batch * heads * seq);
  auto dqkv = be.alloc<T>(n * 3 * d);
  be.from_host(dout.span(), std::span<const T>(w));
  const auto loss = [&]() {
    be.from_host(dq.span(), std::span<const T>(qkv));
    auto out = be.alloc<T>(n * d);
    be.attention_forward(out.view(n, d), dlse.span(), dq.view(n, 3 * d), batch, seq, heads);
    std::vector<T> o(static_cast<std::size_t>(n * d));
    be.to_host(std::span<T>(o), std::span<const T>(out.span()));
    double s = 0;
    for (std::size_t i = 0; i < o.size(); ++i) s += w[i] * o[i];
    return s;
  };
  loss();
  auto out = be.alloc<T>(n * d);
  be.attention_forward(out.view(n, d), dlse.span(), dq.view(n, 3 * d), batch, seq, heads);
  be.attention_backward(dqkv.view(n, 3 * d), dout.view(n, d), out.view(n, d), std::span<const T>(dlse.span()),
                        dq.view(n, 3 * d), batch, seq, heads);
  std::vector<T> analytic(qkv.size());
  be.to_host(std::span<T>(analytic), std::span<const T>(dqkv.span()));
  const auto numeric = test::numeric_grad(qkv, loss);
  CHECK(test::rel_error(analytic, numeric) < test::fd_tol);
}

TEMPLATE_TEST_CASE("grad_norm and AdamW (fused clipping from the device norm) match cpu", "[cuda]", float,
                   double) {
  MOM_REQUIRE_GPU();
  using T = TestType;
  test::Rng rng(12);
  const index_t n = 300007;
  auto p = rand_arr<T>(n, rng), g = rand_arr<T>(n, rng), m = rand_arr<T>(n, rng, 0, 0.1), v = rand_arr<T>(n, rng, 0, 0.1);
  auto norm = rand_arr<T>(1, rng);
  host<T>().grad_norm(std::span<const T>(g.hs()), norm.h.data());
  gpu<T>().grad_norm(std::span<const T>(g.ds()), norm.d.data());
  expect_close(norm, tol_kernel<T>, "grad_norm");
  const cpu::AdamWConfig cfg{.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  for (const T max_norm : {T(0), T(1), T(1e6)}) {  // off, clipping, not clipping
    INFO("max_norm " << max_norm);
    for (std::int64_t step = 1; step <= 3; ++step) {
      host<T>().adamw_step(p.hs(), std::span<const T>(g.hs()), m.hs(), v.hs(), cfg, step, norm.h.data(), max_norm);
      gpu<T>().adamw_step(p.ds(), std::span<const T>(g.ds()), m.ds(), v.ds(), cfg, step, norm.d.data(), max_norm);
    }
    expect_close(p, tol_kernel<T>, "params");
    expect_close(m, tol_kernel<T>, "m");
    expect_close(v, tol_kernel<T>, "v");
  }
  // A non-finite norm (a diverged step) skips the update on the device, as on the CPU.
  for (const T bad : {std::numeric_limits<T>::quiet_NaN(), std::numeric_limits<T>::infinity()}) {
    norm.h[0] = bad;
    gpu<T>().from_host(norm.d.span(), std::span<const T>(norm.h));
    const std::vector<T> before = p.fetch();
    gpu<T>().adamw_step(p.ds(), std::span<const T>(g.ds()), m.ds(), v.ds(), cfg, 4, norm.d.data(), T(1));
    CHECK(p.fetch() == before);
  }
  // A finite norm whose square overflows T, unclipped, is skipped as well (cpu::adamw_skips).
  norm.h[0] = T(2) * std::sqrt(std::numeric_limits<T>::max());
  gpu<T>().from_host(norm.d.span(), std::span<const T>(norm.h));
  {
    const std::vector<T> before = p.fetch();
    gpu<T>().adamw_step(p.ds(), std::span<const T>(g.ds()), m.ds(), v.ds(), cfg, 4, norm.d.data(), T(0));
    CHECK(p.fetch() == before);
    CHECK(cpu::adamw_skips(norm.h[0], T(0)));
  }
  // An empty buffer has norm 0 (the second pass still writes it).
  gpu<T>().grad_norm(std::span<const T>(), norm.d.data());
  CHECK(gpu<T>().read(norm.d.data()) == T(0));
}

TEST_CASE("group_by_module: stable sort by module id and group offsets", "[cuda]") {
  MOM_REQUIRE_GPU();
  auto& be = gpu<float>();
  test::Rng rng(13);
  for (const index_t n_modules : {index_t(1), index_t(5), index_t(64)}) {
    const index_t n = 1000;
    INFO("modules " << n_modules);
    std::vector<token_t> modules(static_cast<std::size_t>(n));
    for (auto& m : modules) m = static_cast<token_t>(rng.integer(0, int(n_modules) - 1));
    std::vector<token_t> ids(modules.size());
    std::iota(ids.begin(), ids.end(), 0);
    std::stable_sort(ids.begin(), ids.end(), [&](token_t a, token_t b) { return modules[a] < modules[b]; });
    std::vector<token_t> offsets(static_cast<std::size_t>(n_modules + 1), 0);
    for (const token_t m : modules) ++offsets[static_cast<std::size_t>(m) + 1];
    std::partial_sum(offsets.begin(), offsets.end(), offsets.begin());

    auto dmod = be.alloc<token_t>(n), dids = be.alloc<token_t>(n), dsorted = be.alloc<token_t>(n);
    auto doff = be.alloc<token_t>(n_modules + 1);
    be.from_host(dmod.span(), std::span<const token_t>(modules));
    be.reserve_dispatch(n, n_modules);
    be.group_by_module(dids.span(), dsorted.span(), doff.span(), std::span<const token_t>(dmod.span()), n_modules);
    std::vector<token_t> got_ids(ids.size()), got_sorted(ids.size()), got_off(offsets.size());
    be.to_host(std::span<token_t>(got_ids), std::span<const token_t>(dids.span()));
    be.to_host(std::span<token_t>(got_sorted), std::span<const token_t>(dsorted.span()));
    be.to_host(std::span<token_t>(got_off), std::span<const token_t>(doff.span()));
    CHECK(got_ids == ids);
    CHECK(got_off == offsets);
    for (std::size_t j = 0; j < ids.size(); ++j) CHECK(got_sorted[j] == modules[static_cast<std::size_t>(ids[j])]);
  }
}

TEST_CASE("ops raise the cpu ops' shape errors and index errors at the next sync", "[cuda]") {
  MOM_REQUIRE_GPU();
  auto& be = gpu<float>();
  auto a = be.alloc<float>(64), b = be.alloc<float>(64);
  auto expect_same_error = [](auto&& on_cpu, auto&& on_gpu) {
    std::string cpu_msg, gpu_msg;
    try { on_cpu(); } catch (const Error& e) { cpu_msg = e.what(); }
    try { on_gpu(); } catch (const Error& e) { gpu_msg = e.what(); }
    CHECK(!cpu_msg.empty());
    CHECK(gpu_msg == cpu_msg);
  };
  std::vector<float> ha(64), hb(64);
  expect_same_error([&] { host<float>().linear_forward({hb.data(), 4, 5}, {ha.data(), 4, 3}, {ha.data(), 5, 4}, {}); },
                    [&] { be.linear_forward({b.data(), 4, 5}, {a.data(), 4, 3}, {a.data(), 5, 4}, {}); });
  expect_same_error(
      [&] { host<float>().gemm({hb.data(), 3, 3}, {ha.data(), 3, 4}, cpu::Trans::N, {ha.data(), 3, 3}, cpu::Trans::N); },
      [&] { be.gemm({b.data(), 3, 3}, {a.data(), 3, 4}, cuda::Trans::N, {a.data(), 3, 3}, cuda::Trans::N); });
  expect_same_error(
      [&] { host<float>().attention_forward({hb.data(), 4, 6}, {hb.data(), 4}, {ha.data(), 4, 18}, 1, 4, 4); },
      [&] { be.attention_forward({b.data(), 4, 6}, {b.data(), 4}, {a.data(), 4, 18}, 1, 4, 4); });
  // Index errors surface at the next synchronisation, naming the op and the bad index.
  std::vector<token_t> bad{0, 7, 99};
  auto idx = be.alloc<token_t>(3);
  be.from_host(idx.span(), std::span<const token_t>(bad));
  be.gather_rows({b.data(), 3, 4}, {a.data(), 8, 4}, std::span<const token_t>(idx.span()));
  try {
    be.sync();
    FAIL("gather_rows with index 99 into 8 rows did not raise");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("gather_rows") && Catch::Contains("99") && Catch::Contains("position 2"));
  }
  be.sync();  // the error was consumed
}

// ---- routed assembly ops (cpu/routing.hpp) ------------------------------------------------------

TEMPLATE_TEST_CASE("group_by_choice and the balance loss match cpu", "[cuda][routing]", float, double) {
  MOM_REQUIRE_GPU();
  using T = TestType;
  test::Rng rng(22);
  const index_t n = 301, k = 2, E = 5;
  std::vector<token_t> p(static_cast<std::size_t>(n * k));
  for (auto& x : p) x = static_cast<token_t>(rng.integer(0, int(E) - 1));
  auto picks = tok_arr<T>(p);
  auto row_token = tok_arr<T>(std::vector<token_t>(p.size(), -7)), row_slot = tok_arr<T>(std::vector<token_t>(p.size(), -7));
  auto offsets = tok_arr<T>(std::vector<token_t>(static_cast<std::size_t>(E + 1), -7));
  host<T>().group_by_choice(row_token.hs(), row_slot.hs(), offsets.hs(), MatrixView<const token_t>(picks.hm(n, k)), E);
  gpu<T>().group_by_choice(row_token.ds(), row_slot.ds(), offsets.ds(), MatrixView<const token_t>(picks.dm(n, k)), E);
  expect_equal_tokens(row_token, "row_token");
  expect_equal_tokens(row_slot, "row_slot");
  expect_equal_tokens(offsets, "offsets");

  auto probs = rand_arr<T>(n * E, rng, 0, 1), loss = rand_arr<T>(1, rng), dcol = rand_arr<T>(E, rng);
  host<T>().balance_loss_forward(loss.hs(), dcol.hs(), probs.hm(n, E), offsets.hs(), k, T(0.01));
  gpu<T>().balance_loss_forward(loss.ds(), dcol.ds(), probs.dm(n, E), offsets.ds(), k, T(0.01));
  expect_close(loss, tol_kernel<T>, "balance loss");
  expect_close(dcol, tol_kernel<T>, "dprobs_col");
}

TEMPLATE_TEST_CASE("affinity routing (DeepSeekMoE) matches cpu: biased top-K with groups, backward, loads, bias update, sequence-wise loss",
                   "[cuda][routing][affinity]", float, double) {
  MOM_REQUIRE_GPU();
  using T = TestType;
  test::Rng rng(31);
  const index_t n = 257, E = 12, shared = 2, K = 5;  // 3 routed picks within the best 2 of 4 groups
  auto scores = rand_arr<T>(n * E, rng, 0.02, 0.98), bias = rand_arr<T>(E, rng, -0.2, 0.2);
  auto w = const_arr<T>(n * K, T(-7)), probs = const_arr<T>(n * E, T(-7));
  auto picks = tok_arr<T>(std::vector<token_t>(std::size_t(n * K), -7));
  host<T>().affinity_topk_forward(w.hm(n, K), picks.hm(n, K), probs.hm(n, E), scores.hm(n, E), bias.hs(), shared, 4, 2,
                                  true, T(2.5));
  gpu<T>().affinity_topk_forward(w.dm(n, K), picks.dm(n, K), probs.dm(n, E), scores.dm(n, E), bias.ds(), shared, 4, 2,
                                 true, T(2.5));
  expect_equal_tokens(picks, "picks");
  expect_close(w, tol_kernel<T>, "weights");
  expect_close(probs, tol_kernel<T>, "probs");
  auto dw = rand_arr<T>(n * K, rng), dcol = rand_arr<T>(E, rng), ds = rand_arr<T>(n * E, rng);
  host<T>().affinity_topk_backward(ds.hm(n, E), dw.hm(n, K), scores.hm(n, E), MatrixView<const token_t>(picks.hm(n, K)),
                                   shared, true, T(2.5), dcol.hs());
  gpu<T>().affinity_topk_backward(ds.dm(n, E), dw.dm(n, K), scores.dm(n, E), MatrixView<const token_t>(picks.dm(n, K)),
                                  shared, true, T(2.5), dcol.ds());
  expect_close(ds, tol_kernel<T>, "dscores");
  auto offsets = tok_arr<T>({0, 5, 9, 9, 20}), load = rand_arr<T>(4, rng, 0, 3);
  host<T>().expert_load_add(load.hs(), offsets.hs());
  gpu<T>().expert_load_add(load.ds(), offsets.ds());
  expect_close(load, tol_kernel<T>, "loads");
  auto b = rand_arr<T>(4, rng);
  host<T>().bias_balance_update(b.hs(), load.hs(), T(1e-3));
  gpu<T>().bias_balance_update(b.ds(), load.ds(), T(1e-3));
  expect_close(b, tol_kernel<T>, "bias");
  // V3's sequence-wise balance loss over the first 256 rows as 8 sequences of 32 (its value, gradient, f).
  const index_t rows = 256, seq = 32, Er = E;
  auto sl = const_arr<T>(1, T(-7)), dseq = const_arr<T>(rows * Er, T(-7)), freq = const_arr<T>(rows / seq * Er, T(-7));
  host<T>().sequence_balance_forward(sl.hs(), dseq.hm(rows, Er), freq.hm(rows / seq, Er), scores.hm(rows, E),
                                     MatrixView<const token_t>(picks.hm(rows, K)), shared, seq, T(0.3));
  gpu<T>().sequence_balance_forward(sl.ds(), dseq.dm(rows, Er), freq.dm(rows / seq, Er), scores.dm(rows, E),
                                    MatrixView<const token_t>(picks.dm(rows, K)), shared, seq, T(0.3));
  expect_close(sl, tol_kernel<T>, "sequence balance loss");
  expect_close(dseq, tol_kernel<T>, "sequence balance gradient");
  expect_close(freq, tol_kernel<T>, "sequence balance f");
}

TEMPLATE_TEST_CASE("expert-choice selection matches cpu (each expert's top-c rows, ties, the backward mask)",
                   "[cuda][routing][expert-choice]", float, double) {
  MOM_REQUIRE_GPU();
  using T = TestType;
  test::Rng rng(41);
  const index_t n = 203, E = 6;
  auto probs = rand_arr<T>(n * E, rng, 0, 1);
  probs.h[std::size_t(7 * E + 1)] = probs.h[std::size_t(90 * E + 1)];  // a tie in expert 1's column
  gpu<T>().from_host(probs.ds(), std::span<const T>(probs.h));
  for (const index_t c : {index_t(0), index_t(67), n}) {
    auto w = const_arr<T>(n * E, T(-7));
    auto picks = tok_arr<T>(std::vector<token_t>(std::size_t(n * E), -7));
    host<T>().expert_choice_forward(w.hm(n, E), picks.hm(n, E), probs.hm(n, E), c);
    gpu<T>().expert_choice_forward(w.dm(n, E), picks.dm(n, E), probs.dm(n, E), c);
    expect_equal_tokens(picks, "picks");
    expect_close(w, tol_kernel<T>, "weights");
    auto dw = rand_arr<T>(n * E, rng), dp = rand_arr<T>(n * E, rng);
    host<T>().expert_choice_backward(dp.hm(n, E), dw.hm(n, E), MatrixView<const token_t>(picks.hm(n, E)));
    gpu<T>().expert_choice_backward(dp.dm(n, E), dw.dm(n, E), MatrixView<const token_t>(picks.dm(n, E)));
    expect_close(dp, tol_kernel<T>, "dprobs");
  }
}

TEMPLATE_TEST_CASE("packed attention forward and backward match cpu (subsets and keys without queries)",
                   "[cuda][routing]", float, double) {
  MOM_REQUIRE_GPU();
  using T = TestType;
  test::Rng rng(23);
  const index_t batch = 3, seq = 29, heads = 2, tokens = batch * seq;
  for (const index_t hd : {index_t(16), index_t(40)})
    for (const bool all_keys : {true, false}) {
      const index_t d = heads * hd;
      INFO("hd " << hd << " all keys " << all_keys);
      // Queries: a random ascending subset of the tokens; keys: all tokens, or another subset
      // (then some queries see no key: lse -inf and a zero output row).
      std::vector<token_t> qt, kt;
      for (index_t t = 0; t < tokens; ++t) {
        if (rng.integer(0, 2) != 0) qt.push_back(static_cast<token_t>(t));
        if (!all_keys && rng.integer(0, 1) == 0) kt.push_back(static_cast<token_t>(t));
      }
      const index_t nq = ssize(std::span<token_t>(qt)), nk = all_keys ? tokens : ssize(std::span<token_t>(kt));
      auto q_tok = tok_arr<T>(qt), k_tok = tok_arr<T>(kt);
      // q, k, v and their gradients as column blocks of wider matrices (strided views).
      auto q = rand_arr<T>(nq * 2 * d, rng, -1.5, 1.5), kv = rand_arr<T>(nk * 2 * d, rng, -1.5, 1.5);
      auto out = rand_arr<T>(nq * d, rng), lse = rand_arr<T>(nq * heads, rng), dout = rand_arr<T>(nq * d, rng);
      auto dq = rand_arr<T>(nq * 2 * d, rng), dkv = rand_arr<T>(nk * 2 * d, rng);
      const auto hq = MatrixView<const T>(q.hm(nq, d, 2 * d)), dqv = MatrixView<const T>(q.dm(nq, d, 2 * d));
      const auto hk = MatrixView<const T>(kv.hm(nk, d, 2 * d)), dk = MatrixView<const T>(kv.dm(nk, d, 2 * d));
      const auto hv = MatrixView<const T>(MatrixView<T>{kv.h.data() + d, nk, d, 2 * d});
      const auto dvv = MatrixView<const T>(MatrixView<T>{kv.d.data() + d, nk, d, 2 * d});
      const std::span<const token_t> hkt = all_keys ? std::span<const token_t>() : std::span<const token_t>(k_tok.hs());
      const std::span<const token_t> dkt = all_keys ? std::span<const token_t>() : std::span<const token_t>(k_tok.ds());
      host<T>().attention_packed_forward(out.hm(nq, d), lse.hs(), hq, hk, hv, q_tok.hs(), hkt, seq, heads);
      gpu<T>().attention_packed_forward(out.dm(nq, d), lse.ds(), dqv, dk, dvv, q_tok.ds(), dkt, seq, heads);
      expect_close(out, tol_attention<T>, "out");
      {  // lse: the same -inf entries, the finite ones close
        auto got = lse.fetch();
        auto want = lse.h;
        std::size_t mismatched_inf = 0, no_key = 0;
        for (std::size_t i = 0; i < got.size(); ++i) {
          mismatched_inf += std::isinf(got[i]) != std::isinf(want[i]);
          no_key += std::isinf(want[i]);
          if (std::isinf(got[i]) || std::isinf(want[i])) got[i] = want[i] = T(0);
        }
        CHECK(mismatched_inf == 0);
        if (!all_keys) CHECK(no_key > 0);  // the case is exercised
        const double err = test::rel_error(got, want);
        INFO("lse relative error " << err);
        CHECK(err <= tol_attention<T>);
      }
      host<T>().attention_packed_backward(dq.hm(nq, d, 2 * d), dkv.hm(nk, d, 2 * d),
                                          MatrixView<T>{dkv.h.data() + d, nk, d, 2 * d}, dout.hm(nq, d),
                                          out.hm(nq, d), std::span<const T>(lse.hs()), hq, hk, hv, q_tok.hs(), hkt, seq,
                                          heads);
      gpu<T>().attention_packed_backward(dq.dm(nq, d, 2 * d), dkv.dm(nk, d, 2 * d),
                                         MatrixView<T>{dkv.d.data() + d, nk, d, 2 * d}, dout.dm(nq, d), out.dm(nq, d),
                                         std::span<const T>(lse.ds()), dqv, dk, dvv, q_tok.ds(), dkt, seq, heads);
      expect_close(dq, tol_attention<T> * 10, "dq");
      expect_close(dkv, tol_attention<T> * 10, "dk and dv");
    }
}

// The fused pairs' residual (backend_concept.hpp: attention_linear_forward's and mlp_forward's trailing `residual`;
// modules/module.hpp, AddsResidualOn): y = the pair's output + residual, added in the output product's epilogue
// (cuBLASLt's C with beta = 1), with no add kernel. It must equal the pair without it plus the add the dense stack ran
// before (assembly/sequential.hpp, eq. (4)): bit for bit under the emulation, which adds C after the bias as the
// separate add does (on a GPU cuBLASLt's epilogue may round in another order: there to 1e-6), on every path: BF16 with
// the bf16 layouts, BF16 and TF32 without cuBLASLt (the add after the product), TF32, double. A residual of another
// shape is refused with nothing written.
#include <catch2/catch.hpp>

#include <cstring>
#include <span>
#include <vector>

#include "cuda/cuda_test_support.hpp"

using namespace mom;
using namespace mom::test;

namespace {

template <class T>
struct ResidualRun {
  std::vector<T> attention, mlp;  // y of each pair
  long attention_launches = 0, mlp_launches = 0;
};

// Both pairs' forward on a fresh backend, with the residual or without it and the add after (the dense stack's way
// before). GPT-2's shapes, small: d 128 (2 heads of 64: the bf16 attention layout), d_ff 256.
template <class T>
ResidualRun<T> run(cuda::Precision precision, bool residual, bool refuse_lt = false) {
  cuda::Backend<T> be;
  be.set_precision(precision);
  test::Rng rng(61);
  const index_t batch = 2, seq = 40, d = 128, f = 256, heads = 2, n = batch * seq;
  using CM = MatrixView<const T>;
  using CS = std::span<const T>;
  auto x = rand_arr<T>(n * d, rng), qkv = rand_arr<T>(n * 3 * d, rng), w = rand_arr<T>(d * d, rng, -0.1, 0.1);
  auto b = rand_arr<T>(d, rng), att = rand_arr<T>(n * d, rng), lse = rand_arr<T>(batch * heads * seq, rng);
  auto gamma = rand_arr<T>(d, rng), beta = rand_arr<T>(d, rng), w1 = rand_arr<T>(f * d, rng, -0.1, 0.1);
  auto b1 = rand_arr<T>(f, rng), w2 = rand_arr<T>(d * f, rng, -0.1, 0.1), b2 = rand_arr<T>(d, rng);
  auto ln = rand_arr<T>(n * d, rng), mean = rand_arr<T>(n, rng), rstd = rand_arr<T>(n, rng);
  auto pre = rand_arr<T>(n * f, rng), act = rand_arr<T>(n * f, rng);
  auto y_att = rand_arr<T>(n * d, rng), y_mlp = rand_arr<T>(n * d, rng);
  const CM res = residual ? CM(x.dm(n, d)) : CM{};
  const bool counted = mom_emu_launches != nullptr;
  if (refuse_lt && mom_emu_lt_refuse) mom_emu_lt_refuse(1);
  ResidualRun<T> r;
  be.sync();
  long l0 = counted ? mom_emu_launches() : 0;
  be.attention_linear_forward(y_att.dm(n, d), att.dm(n, d), lse.ds(), CM(qkv.dm(n, 3 * d)), CM(w.dm(d, d)),
                              CS(b.ds()), batch, seq, heads, res);
  if (!residual) be.add_forward(y_att.ds(), CS(x.ds()), CS(y_att.ds()));  // u = x + f(x), eq. (4)
  be.sync();
  if (counted) r.attention_launches = mom_emu_launches() - l0;
  l0 = counted ? mom_emu_launches() : 0;
  be.mlp_forward(y_mlp.dm(n, d), NormSaved<T>(ln.dm(n, d), mean.ds(), rstd.ds()), pre.dm(n, f), act.dm(n, f),
                 CM(x.dm(n, d)), CS(gamma.ds()), CS(beta.ds()), CM(w1.dm(f, d)), CS(b1.ds()), CM(w2.dm(d, f)),
                 CS(b2.ds()), res);
  if (!residual) be.add_forward(y_mlp.ds(), CS(x.ds()), CS(y_mlp.ds()));
  be.sync();
  if (counted) r.mlp_launches = mom_emu_launches() - l0;
  if (mom_emu_lt_refuse) mom_emu_lt_refuse(0);
  r.attention = y_att.fetch();
  r.mlp = y_mlp.fetch();
  return r;
}

template <class T>
void check_same(const ResidualRun<T>& fused, const ResidualRun<T>& added) {
  const bool emulated = mom_emu_launches != nullptr;
  for (const auto& [a, b] : {std::pair{&fused.attention, &added.attention}, {&fused.mlp, &added.mlp}}) {
    if (emulated)
      CHECK(std::memcmp(a->data(), b->data(), a->size() * sizeof(T)) == 0);
    else
      CHECK(test::rel_error(*a, *b) <= 1e-6);
  }
}

}  // namespace

TEST_CASE("the fused pairs add the residual in their output product: the add's bits, one launch fewer",
          "[cuda][residual]") {
  MOM_REQUIRE_GPU();
  for (const auto precision : {cuda::Precision::BF16, cuda::Precision::TF32}) {
    INFO((precision == cuda::Precision::BF16 ? "bf16" : "tf32"));
    const auto fused = run<float>(precision, true), added = run<float>(precision, false);
    check_same(fused, added);
    if (mom_emu_launches) {  // the add kernel is gone; nothing else is launched
      CHECK(fused.attention_launches == added.attention_launches - 1);
      CHECK(fused.mlp_launches == added.mlp_launches - 1);
    }
  }
  check_same(run<double>(cuda::Precision::TF32, true), run<double>(cuda::Precision::TF32, false));  // the add after
}

TEST_CASE("the fused pairs' residual without cuBLASLt: the add after the product, the same bits", "[cuda][residual]") {
  MOM_REQUIRE_GPU();
  if (!mom_emu_lt_refuse) {
    WARN("refusing cuBLASLt's algorithms is the emulation's (test_cuda_emu): skipped");
    return;
  }
  for (const auto precision : {cuda::Precision::BF16, cuda::Precision::TF32}) {
    INFO((precision == cuda::Precision::BF16 ? "bf16" : "tf32"));
    const auto fused = run<float>(precision, true, true), added = run<float>(precision, false, true);
    check_same(fused, added);
    CHECK(fused.attention_launches == added.attention_launches);  // the pair runs the add itself
    CHECK(fused.mlp_launches == added.mlp_launches);
  }
}

TEST_CASE("linear_forward_residual is linear_forward and the add: the add's bits, with or without cuBLASLt",
          "[cuda][residual]") {
  MOM_REQUIRE_GPU();
  static_assert(FusesLinearResidual<cuda::Backend<float>, float> && !FusesLinearResidual<cpu::Backend<float>, float>);
  const index_t n = 24, in = 64, out = 40;
  using CM = MatrixView<const float>;
  using CS = std::span<const float>;
  for (const bool refuse : {false, true}) {
    if (refuse && !mom_emu_lt_refuse) continue;
    for (const auto precision : {cuda::Precision::BF16, cuda::Precision::TF32}) {
      INFO((precision == cuda::Precision::BF16 ? "bf16" : "tf32") << (refuse ? ", cuBLASLt refusing" : ""));
      cuda::Backend<float> be;
      be.set_precision(precision);
      test::Rng rng(63);
      auto x = rand_arr<float>(n * in, rng), w = rand_arr<float>(out * in, rng), b = rand_arr<float>(out, rng);
      auto r = rand_arr<float>(n * out, rng), y = rand_arr<float>(n * out, rng), y2 = rand_arr<float>(n * out, rng);
      if (refuse) mom_emu_lt_refuse(1);
      const long l0 = mom_emu_launches ? mom_emu_launches() : 0;
      be.linear_forward_residual(y.dm(n, out), CM(x.dm(n, in)), CM(w.dm(out, in)), CS(b.ds()), CM(r.dm(n, out)));
      be.sync();
      const long fused = mom_emu_launches ? mom_emu_launches() - l0 : 0;
      be.linear_forward(y2.dm(n, out), CM(x.dm(n, in)), CM(w.dm(out, in)), CS(b.ds()));
      be.add_forward(y2.ds(), CS(r.ds()), CS(y2.ds()));
      be.sync();
      if (mom_emu_lt_refuse) mom_emu_lt_refuse(0);
      const auto a = y.fetch(), e = y2.fetch();
      if (mom_emu_launches)
        CHECK(std::memcmp(a.data(), e.data(), a.size() * sizeof(float)) == 0);
      else
        CHECK(test::rel_error(a, e) <= 1e-6);
      // One cuBLASLt call, no add kernel: under BF16 after x's and w's staging (2 launches), under TF32 nothing else.
      if (mom_emu_launches && !refuse) CHECK(fused == (precision == cuda::Precision::BF16 ? 2 : 0));
    }
  }
}

TEST_CASE("the fused pairs refuse a residual of another shape, with nothing written", "[cuda][residual]") {
  MOM_REQUIRE_GPU();
  auto& be = gpu<float>();
  be.set_precision(cuda::Precision::BF16);
  test::Rng rng(62);
  const index_t batch = 1, seq = 8, d = 16, f = 32, heads = 2, n = batch * seq;
  using CM = MatrixView<const float>;
  using CS = std::span<const float>;
  auto x = rand_arr<float>(n * d, rng), qkv = rand_arr<float>(n * 3 * d, rng), w = rand_arr<float>(d * d, rng);
  auto b = rand_arr<float>(d, rng), att = rand_arr<float>(n * d, rng), lse = rand_arr<float>(heads * n, rng);
  auto gamma = rand_arr<float>(d, rng), beta = rand_arr<float>(d, rng), w1 = rand_arr<float>(f * d, rng);
  auto b1 = rand_arr<float>(f, rng), w2 = rand_arr<float>(d * f, rng), b2 = rand_arr<float>(d, rng);
  auto ln = rand_arr<float>(n * d, rng), mean = rand_arr<float>(n, rng), rstd = rand_arr<float>(n, rng);
  auto pre = rand_arr<float>(n * f, rng), act = rand_arr<float>(n * f, rng), y = rand_arr<float>(n * d, rng);
  const auto y0 = y.fetch(), att0 = att.fetch(), act0 = act.fetch();
  CHECK_THROWS_WITH(be.attention_linear_forward(y.dm(n, d), att.dm(n, d), lse.ds(), CM(qkv.dm(n, 3 * d)),
                                                CM(w.dm(d, d)), CS(b.ds()), batch, seq, heads, CM(x.dm(n - 1, d))),
                    Catch::Contains("attention_linear_forward: the residual"));
  CHECK_THROWS_WITH(be.mlp_forward(y.dm(n, d), NormSaved<float>(ln.dm(n, d), mean.ds(), rstd.ds()), pre.dm(n, f),
                                   act.dm(n, f), CM(x.dm(n, d)), CS(gamma.ds()), CS(beta.ds()), CM(w1.dm(f, d)),
                                   CS(b1.ds()), CM(w2.dm(d, f)), CS(b2.ds()), CM(x.dm(n, d / 2, d))),
                    Catch::Contains("mlp_forward: the residual"));
  be.sync();
  CHECK(y.fetch() == y0);
  CHECK(att.fetch() == att0);
  CHECK(act.fetch() == act0);
}

// Whole models on both backends: the same architecture type, the same seed, the same batch give
// the same loss and gradients on cpu::Backend and cuda::Backend, and a few AdamW steps with fused
// clipping keep the parameters together.
//
// Tolerances: double 1e-9 (loss, relative) and 1e-8 (gradients, relative to the largest);
// float without TF32 1e-4 / 1e-3; float with TF32 (the default) 2e-3 / 3e-2; float with bf16 GEMMs
// (Precision::BF16: operands rounded to 8 significant bits, fp32 master weights) 2e-3 / 3e-2 (the CPU
// emulation measured 1e-5 / 4e-3).
// MoM models are compared in double and in float without TF32 only: with TF32 a router logit can
// move by ~1e-3 and flip a near-tied top-K pick, after which the two runs legitimately differ.
// Every family of architectures is here: dense, MoM, MoE, MoD, layer-skip, MoDE, parameter sharing, MoEUT, ModuleFormer,
// DeepSeekMoE, expert-choice MoE, Mixture-of-Recursions;
// MoD's causal-sampling options are not.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "cuda/cuda_test_support.hpp"
#include "cuda/small_models.hpp"
#include "mom/backend/cuda.hpp"
#include "mom/models/mom_models.hpp"
#include "mom/models/moe_models.hpp"
#include "mom/models/moeut_models.hpp"
#include "mom/models/moduleformer_models.hpp"
#include "mom/mom.hpp"
#include "ops/grad_check.hpp"

using namespace mom;
using namespace mom::test::small_models;
using test::gpu_available;

namespace {

template <class Model, class T>
void compare_model(cuda::Precision precision, double loss_tol, double grad_tol) {
  INFO(__PRETTY_FUNCTION__);  // which model and scalar failed
  const index_t batch = 2, seq = 24;
  auto on_cpu = Model::template make<cpu::Backend<T>>(7);
  auto on_gpu = Model::template make<cuda::Backend<T>>(7);
  on_gpu.backend().set_precision(precision);
  on_cpu.reserve(batch, seq);
  on_gpu.reserve(batch, seq);

  std::mt19937_64 gen(3);
  std::uniform_int_distribution<int> tok(0, int(Model::dims.vocab) - 1);
  std::vector<token_t> tokens(static_cast<std::size_t>(batch * seq)), targets(tokens.size());
  for (auto& t : tokens) t = tok(gen);
  for (auto& t : targets) t = tok(gen);
  targets[5] = -1;  // an ignored position

  auto grads_of = [](auto& m) {
    std::vector<T> g(m.grads().size());
    m.backend().to_host(std::span<T>(g), std::span<const T>(m.grads()));
    return g;
  };
  auto params_of = [](auto& m) {
    std::vector<T> p(m.params().size());
    m.backend().to_host(std::span<T>(p), std::span<const T>(m.params()));
    return p;
  };

  const T lc = on_cpu.forward(tokens, targets, batch, seq);
  const T lg = on_gpu.forward(tokens, targets, batch, seq);
  INFO("loss cpu " << lc << " gpu " << lg);
  CHECK(std::abs(double(lc) - double(lg)) <= loss_tol * std::abs(double(lc)));
  on_cpu.backward();
  on_gpu.backward();
  const double gerr = test::rel_error(grads_of(on_gpu), grads_of(on_cpu));
  INFO("gradient relative error " << gerr);
  CHECK(gerr <= grad_tol);

  // Three optimizer steps, clipping through the device-resident norm.
  auto& bc = on_cpu.backend();
  auto& bg = on_gpu.backend();
  const index_t P = Model::params;
  auto mc = bc.template alloc<T>(P), vc = bc.template alloc<T>(P), nc = bc.template alloc<T>(1);
  auto mg = bg.template alloc<T>(P), vg = bg.template alloc<T>(P), ng = bg.template alloc<T>(1);
  const cpu::AdamWConfig cfg{.lr = 1e-3, .weight_decay = 0.1};
  for (std::int64_t step = 1; step <= 3; ++step) {
    if (step > 1) {
      on_cpu.zero_grad();
      on_gpu.zero_grad();
      on_cpu.forward(tokens, targets, batch, seq);
      on_gpu.forward(tokens, targets, batch, seq);
      on_cpu.backward();
      on_gpu.backward();
    }
    bc.grad_norm(std::span<const T>(on_cpu.grads()), nc.data());
    bg.grad_norm(std::span<const T>(on_gpu.grads()), ng.data());
    bc.adamw_step(on_cpu.params(), std::span<const T>(on_cpu.grads()), mc.span(), vc.span(), cfg, step, nc.data(), T(0.5));
    bg.adamw_step(on_gpu.params(), std::span<const T>(on_gpu.grads()), mg.span(), vg.span(), cfg, step, ng.data(), T(0.5));
  }
  // AdamW normalises the step, so parameters drift apart by at most ~lr per step where gradients
  // are tiny and noisy; compare against the parameter scale.
  const double perr = test::rel_error(params_of(on_gpu), params_of(on_cpu));
  INFO("parameter relative error after 3 AdamW steps " << perr);
  CHECK(perr <= (std::is_same_v<T, double> ? 1e-8 : 5e-2));
}

}  // namespace

TEST_CASE("dense model: same loss and gradients as cpu (double)", "[cuda][models]") {
  if (!gpu_available()) {
    WARN("no CUDA device: skipped");
    return;
  }
  compare_model<DenseSmall, double>(cuda::Precision::FP32, 1e-9, 1e-8);
  compare_model<ChunkedHd64, double>(cuda::Precision::FP32, 1e-9, 1e-8);
}

TEST_CASE("MoM models: same loss and gradients as cpu (double)", "[cuda][models][mom]") {
  if (!gpu_available()) {
    WARN("no CUDA device: skipped");
    return;
  }
  compare_model<MoMP, double>(cuda::Precision::FP32, 1e-9, 1e-8);
  compare_model<MoMRoutedKV, double>(cuda::Precision::FP32, 1e-9, 1e-8);
}

TEST_CASE("MoM models: same loss and gradients as cpu (float with fp32 GEMMs)", "[cuda][models][mom]") {
  if (!gpu_available()) {
    WARN("no CUDA device: skipped");
    return;
  }
  // Width-256 routers (small_models.hpp): with the default width of 64 at this d_model, the routed-KV model's first
  // backward on an H100 differed from the CPU's by 4.6e-2 (losses 5.66384 / 5.66412; 2026-11-27, twice): read as a
  // top-K routing decision near a tie taken the other way after float rounding, not an arithmetic difference (the
  // double comparison above agrees to 1e-9 on the GPU; the emulation, which sums in the CPU's order, agrees here).
  compare_model<MoMPWide, float>(cuda::Precision::FP32, 1e-4, 2e-3);
  compare_model<MoMRoutedKVWide, float>(cuda::Precision::FP32, 1e-4, 2e-3);
}

TEST_CASE("dense model: same loss and gradients as cpu (float with fp32 GEMMs)", "[cuda][models]") {
  if (!gpu_available()) {
    WARN("no CUDA device: skipped");
    return;
  }
  compare_model<DenseSmall, float>(cuda::Precision::FP32, 1e-4, 1e-3);
  compare_model<ChunkedHd64, float>(cuda::Precision::FP32, 1e-4, 1e-3);
}

TEST_CASE("dense model: same loss and gradients as cpu (float with TF32 GEMMs)", "[cuda][models]") {
  if (!gpu_available()) {
    WARN("no CUDA device: skipped");
    return;
  }
  compare_model<DenseSmall, float>(cuda::Precision::TF32, 2e-3, 3e-2);
  compare_model<ChunkedHd64, float>(cuda::Precision::TF32, 2e-3, 3e-2);
}

TEST_CASE("dense model: same loss and gradients as cpu (float with bf16 GEMMs, fp32 master weights)", "[cuda][models]") {
  if (!gpu_available()) {
    WARN("no CUDA device: skipped");
    return;
  }
  compare_model<DenseSmall, float>(cuda::Precision::BF16, 2e-3, 3e-2);
  compare_model<ChunkedHd64, float>(cuda::Precision::BF16, 2e-3, 3e-2);
}

TEST_CASE("MoE, MoD, layer-skip, MoDE, DeepSeekMoE, expert-choice MoE, MoR: same loss and gradients as cpu (double)", "[cuda][models][special]") {
  if (!gpu_available()) {
    WARN("no CUDA device: skipped");
    return;
  }
  compare_model<MoESmall, double>(cuda::Precision::FP32, 1e-9, 1e-8);
  compare_model<MoEShareSmall, double>(cuda::Precision::FP32, 1e-9, 1e-8);
  compare_model<MoDEIntSmall, double>(cuda::Precision::FP32, 1e-9, 1e-8);
  compare_model<MoDSmall, double>(cuda::Precision::FP32, 1e-9, 1e-8);
  compare_model<SkipSmall, double>(cuda::Precision::FP32, 1e-9, 1e-8);
  compare_model<ExitSmall, double>(cuda::Precision::FP32, 1e-9, 1e-8);
  compare_model<MoDEStagedSmall, double>(cuda::Precision::FP32, 1e-9, 1e-8);
  compare_model<DSSmall, double>(cuda::Precision::FP32, 1e-9, 1e-8);
  compare_model<ECSmall, double>(cuda::Precision::FP32, 1e-9, 1e-8);
  compare_model<MoRSmall, double>(cuda::Precision::FP32, 1e-9, 1e-8);
  compare_model<MoRMiddleSmall, double>(cuda::Precision::FP32, 1e-9, 1e-8);
  compare_model<MoRTokenSmall, double>(cuda::Precision::FP32, 1e-9, 1e-8);
  compare_model<MoRShareSmall, double>(cuda::Precision::FP32, 1e-9, 1e-8);
}

TEST_CASE("parameter sharing: same loss and gradients as cpu (double, Cycle<2>, All, Map)", "[cuda][models][share]") {
  if (!gpu_available()) {
    WARN("no CUDA device: skipped");
    return;
  }
  compare_model<ShareCycle, double>(cuda::Precision::FP32, 1e-9, 1e-8);
  compare_model<ShareAll, double>(cuda::Precision::FP32, 1e-9, 1e-8);
  compare_model<ShareMap, double>(cuda::Precision::FP32, 1e-9, 1e-8);
}

TEST_CASE("MoEUT (SwitchHead + σ-MoE, layer grouping, RoPE): same loss and gradients as cpu (double)",
          "[cuda][models][moeut]") {
  if (!gpu_available()) {
    WARN("no CUDA device: skipped");
    return;
  }
  compare_model<MoEUTSmall, double>(cuda::Precision::FP32, 1e-9, 1e-8);
  compare_model<MoEUTPreSmall, double>(cuda::Precision::FP32, 1e-9, 1e-8);
}

TEST_CASE("ModuleFormer (MoA + SMoE, MLP routers, MI loss): same loss and gradients as cpu (double)",
          "[cuda][models][moduleformer]") {
  if (!gpu_available()) {
    WARN("no CUDA device: skipped");
    return;
  }
  compare_model<MFSmall, double>(cuda::Precision::FP32, 1e-9, 1e-8);
  compare_model<MFInsertedSmall, double>(cuda::Precision::FP32, 1e-9, 1e-8);
}


namespace {
// After a warm-up step (CUB temp storage and bf16 staging sized on first use), a whole training step
// (forward_async, backward, grad_norm, AdamW) neither waits for the device nor allocates; the loss
// read afterwards waits.
template <class Model>
void check_step_never_waits(cuda::Precision precision) {
  INFO(describe<Model>());
  using T = float;
  cuda::Backend<T> be;
  be.set_precision(precision);
  ModelInstance<Model, cuda::Backend<T>> m(3, be);
  const index_t batch = 2, seq = 24;
  m.reserve(batch, seq);
  std::mt19937_64 gen(5);
  std::uniform_int_distribution<int> tok(0, int(Model::dims.vocab) - 1);
  std::vector<token_t> tokens(static_cast<std::size_t>(batch * seq)), targets(tokens.size());
  for (auto& t : tokens) t = tok(gen);
  for (auto& t : targets) t = tok(gen);
  auto mom = be.alloc(Model::params), vel = be.alloc(Model::params), norm = be.alloc(1);
  auto step = [&](std::int64_t s) {
    m.zero_grad();
    m.forward_async(tokens, targets, batch, seq);
    m.backward();
    m.update_buffers();  // DeepSeekMoE's selection bias (a no-op for the other families)
    be.grad_norm(std::span<const T>(m.grads()), norm.data());
    be.adamw_step(m.params(), std::span<const T>(m.grads()), mom.span(), vel.span(), cpu::AdamWConfig{.lr = 1e-3}, s,
                  norm.data(), T(1));
  };
  step(1);
  be.sync();
  const long waits = mom_emu_host_waits(), allocs = mom_emu_allocations();
  step(2);
  CHECK(mom_emu_host_waits() == waits);
  CHECK(mom_emu_allocations() == allocs);
  CHECK(std::isfinite(double(m.loss())));
  CHECK(mom_emu_host_waits() > waits);
}
}  // namespace

TEST_CASE("a training step on the CUDA backend neither waits for the device nor allocates (every routed family)",
          "[cuda][models][sync]") {
  MOM_REQUIRE_GPU();
  MOM_REQUIRE_EMU_COUNTERS();
  check_step_never_waits<DenseSmall>(cuda::Precision::TF32);
  check_step_never_waits<DenseSmall>(cuda::Precision::BF16);
  check_step_never_waits<MoMP>(cuda::Precision::TF32);
  check_step_never_waits<MoMP>(cuda::Precision::BF16);
  check_step_never_waits<MoMRoutedKV>(cuda::Precision::TF32);
  check_step_never_waits<MoESmall>(cuda::Precision::TF32);
  check_step_never_waits<MoDEIntSmall>(cuda::Precision::TF32);
  check_step_never_waits<MoDEStagedSmall>(cuda::Precision::TF32);
  check_step_never_waits<MoDSmall>(cuda::Precision::TF32);
  check_step_never_waits<SkipSmall>(cuda::Precision::TF32);
  check_step_never_waits<ExitSmall>(cuda::Precision::TF32);
  check_step_never_waits<ShareCycle>(cuda::Precision::TF32);
  check_step_never_waits<MFSmall>(cuda::Precision::TF32);
  check_step_never_waits<DSSmall>(cuda::Precision::TF32);
  check_step_never_waits<ECSmall>(cuda::Precision::TF32);
}

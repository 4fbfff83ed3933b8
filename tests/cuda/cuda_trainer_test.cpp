// The bundled Trainer on the CUDA backend (mom-train --device cuda): the same Trainer, data and seed on
// cpu::Backend and cuda::Backend give the same losses, validation loss and parameters after a few steps, for
// dense, MoM_P, MoE, MoD, MoEUT, ModuleFormer and MoR; a checkpoint written on one backend resumes on the
// other and continues as the uninterrupted run does; inside a step the host waits once (the read of {gradient
// norm, loss} that ends it) and allocates nothing.
//
// Tolerances: double with fp32-exact GEMMs (Precision::FP32) 1e-9 relative on losses and parameters (the
// backends differ only in the order of their reductions); float with FP32 GEMMs 1e-4 on losses and 1e-3 on
// parameters (AdamW normalises each step, so a parameter whose gradient is tiny moves by up to ~lr either way
// with the last bits of its gradient); float with bf16 matrix products 2e-2 on losses (8 significant bits).
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "cuda/cuda_test_support.hpp"
#include "cuda/small_models.hpp"
#include "cuda/trainer_support.hpp"
#include "mom/backend/cuda.hpp"
#include "mom/train/train.hpp"
#include "ops/grad_check.hpp"
#include "train/helpers.hpp"

using namespace mom;
using namespace mom::test::small_models;

namespace {

using test::config;
using test::Data;

template <class T>
struct Outcome {
  std::vector<double> losses;
  double val = 0;
  std::vector<T> params;
};

template <class Instance>
std::vector<typename Instance::scalar> params_of(Instance& m) {
  std::vector<typename Instance::scalar> p(m.params().size());
  m.backend().to_host(std::span(p), std::span<const typename Instance::scalar>(m.params()));
  return p;
}

// The Trainer from `seed` (or from the checkpoint in `resume_from`) up to cfg.steps; with `stop_after`, that many
// steps of the same schedule and a checkpoint (a run stopped there, as Ctrl-C stops it).
template <class Model, class Be>
Outcome<typename Be::scalar> train_on(Be be, const Data& data, train::TrainConfig cfg,
                                      const std::filesystem::path& resume_from = {}, index_t stop_after = 0) {
  train::TokenFile train_file(data.prep.train), val_file(data.prep.val);
  ModelInstance<Model, Be> m(11, be);
  train::Trainer trainer(m, train_file, &val_file, cfg);
  if (!resume_from.empty()) trainer.resume(resume_from);
  if (stop_after > 0) {
    for (index_t s = 0; s < stop_after; ++s) trainer.train_step();
    trainer.save();
    return {};
  }
  const auto r = trainer.run();
  return {r.losses, r.final_val_loss.value_or(NAN), params_of(m)};
}

template <class T>
void check_close(const Outcome<T>& gpu, const Outcome<T>& cpu, double loss_tol, double param_tol) {
  REQUIRE(gpu.losses.size() == cpu.losses.size());
  for (std::size_t i = 0; i < cpu.losses.size(); ++i) {
    INFO("step " << i + 1 << ": loss cpu " << cpu.losses[i] << " cuda " << gpu.losses[i]);
    CHECK(std::abs(gpu.losses[i] - cpu.losses[i]) <= loss_tol * std::abs(cpu.losses[i]));
  }
  INFO("validation loss cpu " << cpu.val << " cuda " << gpu.val);
  CHECK(std::abs(gpu.val - cpu.val) <= loss_tol * std::abs(cpu.val));
  const double perr = test::rel_error(gpu.params, cpu.params);
  INFO("parameters' relative error " << perr);
  CHECK(perr <= param_tol);
}

template <class Model, class T>
void compare_training(cuda::Precision precision, double loss_tol, double param_tol) {
  INFO(describe<Model>());
  const Data data;
  const auto cfg = config({}, 3);
  cuda::Backend<T> be;
  be.set_precision(precision);
  const auto gpu = train_on<Model>(be, data, cfg);
  const auto cpu = train_on<Model>(cpu::Backend<T>{}, data, cfg);
  check_close(gpu, cpu, loss_tol, param_tol);
}

}  // namespace

TEST_CASE("Trainer on CUDA = Trainer on the CPU: dense, MoM_P, MoE, MoD, MoEUT, ModuleFormer, MoR (double)",
          "[cuda][trainer]") {
  MOM_REQUIRE_GPU();
  compare_training<DenseSmall, double>(cuda::Precision::FP32, 1e-9, 1e-9);
  compare_training<MoMP, double>(cuda::Precision::FP32, 1e-9, 1e-9);
  compare_training<MoESmall, double>(cuda::Precision::FP32, 1e-9, 1e-9);
  compare_training<MoDSmall, double>(cuda::Precision::FP32, 1e-9, 1e-9);
  compare_training<MoEUTSmall, double>(cuda::Precision::FP32, 1e-9, 1e-9);
  compare_training<MFSmall, double>(cuda::Precision::FP32, 1e-9, 1e-9);
  compare_training<MoRSmall, double>(cuda::Precision::FP32, 1e-9, 1e-9);
}

TEST_CASE("Trainer on CUDA = Trainer on the CPU in float: fp32 and bf16 matrix products", "[cuda][trainer]") {
  MOM_REQUIRE_GPU();
  compare_training<DenseSmall, float>(cuda::Precision::FP32, 1e-4, 1e-3);
  compare_training<MoMPWide, float>(cuda::Precision::FP32, 1e-4, 1e-3);  // small_models.hpp: why wide
  compare_training<MoESmall, float>(cuda::Precision::FP32, 1e-4, 1e-3);
  compare_training<DenseSmall, float>(cuda::Precision::BF16, 2e-2, 5e-2);
}

TEST_CASE("a checkpoint written on one backend resumes on the other as the uninterrupted run continues",
          "[cuda][trainer][checkpoint]") {
  MOM_REQUIRE_GPU();
  using Model = MoMPWide;  // float: small_models.hpp says why the wide router
  const Data data;
  const mom_test::TempDir out("cuda_resume");
  auto full_cfg = config({}, 4);
  const auto full = train_on<Model>(cpu::Backend<float>{}, data, full_cfg);

  auto half_cfg = config(out / "from_cuda", 4);
  half_cfg.device = "cuda:0";
  cuda::Backend<float> be;
  be.set_precision(cuda::Precision::FP32);
  train_on<Model>(be, data, half_cfg, {}, 2);  // stopped after step 2, with its checkpoint
  const auto rest_cfg = config(out / "from_cuda", 4);
  {  // the change of device is reported, and applied
    train::TokenFile train_file(data.prep.train), val_file(data.prep.val);
    ModelInstance<Model, cpu::Backend<float>> m(99, {});
    train::Trainer t(m, train_file, &val_file, rest_cfg);
    CHECK(t.resume(out / "from_cuda") == std::vector<std::string>{"device \"cuda:0\" -> \"cpu\""});
    CHECK(t.step() == 2);
  }
  const auto on_cpu = train_on<Model>(cpu::Backend<float>{}, data, rest_cfg, out / "from_cuda");

  train_on<Model>(cpu::Backend<float>{}, data, config(out / "from_cpu", 4), {}, 2);
  auto cuda_rest = config(out / "from_cpu", 4);
  cuda_rest.device = "cuda:0";
  const auto on_cuda = train_on<Model>(be, data, cuda_rest, out / "from_cpu");

  for (const auto* resumed : {&on_cpu, &on_cuda}) {
    REQUIRE(resumed->losses.size() == 2);
    for (std::size_t i = 0; i < 2; ++i) {
      INFO("step " << i + 3 << ": uninterrupted " << full.losses[i + 2] << ", resumed " << resumed->losses[i]);
      CHECK(std::abs(resumed->losses[i] - full.losses[i + 2]) <= 1e-4 * full.losses[i + 2]);
    }
    CHECK(std::abs(resumed->val - full.val) <= 1e-4 * full.val);
    CHECK(test::rel_error(resumed->params, full.params) <= 1e-3);
  }
}

namespace {
// After two warm-up steps (CUB temp storage and bf16 staging sized on first use), a Trainer step waits for the
// device once — the read of {gradient norm, loss} at its end — and allocates nothing; the next step's first
// micro-batch is drawn into pinned memory before that read.
template <class Model>
void check_trainer_step(cuda::Precision precision) {
  INFO(describe<Model>());
  const Data data;
  train::TokenFile train_file(data.prep.train);
  cuda::Backend<float> be;
  be.set_precision(precision);
  ModelInstance<Model, cuda::Backend<float>> m(3, be);
  train::Trainer trainer(m, train_file, nullptr, config({}, 10));
  trainer.train_step();
  trainer.train_step();
  double loss = NAN;
  const auto c = test::measure_step(be, [&] { loss = trainer.train_step(); });
  CHECK(c.step.host_waits == c.one_read_waits);
  CHECK(c.step.allocations == 0);
  CHECK(std::isfinite(loss));
}
}  // namespace

TEST_CASE("a Trainer step on CUDA waits for the device once, at its end, and never allocates", "[cuda][trainer][sync]") {
  MOM_REQUIRE_GPU();
  MOM_REQUIRE_EMU_COUNTERS();
  check_trainer_step<DenseSmall>(cuda::Precision::TF32);
  check_trainer_step<DenseSmall>(cuda::Precision::BF16);
  check_trainer_step<MoMP>(cuda::Precision::TF32);
  check_trainer_step<MoESmall>(cuda::Precision::TF32);
  check_trainer_step<MoDSmall>(cuda::Precision::TF32);
  check_trainer_step<MoEUTSmall>(cuda::Precision::TF32);
  check_trainer_step<MFSmall>(cuda::Precision::TF32);
  check_trainer_step<MoRSmall>(cuda::Precision::TF32);
}

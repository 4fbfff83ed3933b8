// bench_gpu_train_step: training tokens/s and MFU on a GPU (issue 7, item 4) for the dense GPT-2 small
// shape (124M, seq 1024) in TF32 and in bf16 (Precision::BF16, fp32 master weights), and MoM_P on the
// same shape ([1-1-4-1-4-1], MoMSmallLM<MoM_P<>>), on cuda::Backend<float>.
//
//   bench_gpu_train_step [--batch B] [--seq S] [--reps R] [--warmup W] [--only dense|mom[-tf32|-bf16]] [--peak TFLOPS]
//
// (--warmup 1 --reps 1 --only dense-bf16 is the step Nsight Compute reads in scripts/gpu_check.sh.)
//
// A step = zero_grad + forward_async + backward (in a weight window, as train::Trainer runs them: backend_concept.hpp,
// KeepsWeightCopies) + grad_norm + AdamW (clip 1.0), all on the device: nothing
// inside a step waits for the GPU (the loss stays on the device; the routed models keep their group
// sizes there), and the host waits for the stream only after each timed step. MFU = 3 × the cost model's forward FLOPs per token (= 6N + attention, PaLM's
// definition; the attention recomputation of our backward is not counted) × tokens/s ÷ the GPU's
// dense bf16 tensor-core peak (H100 / H200 SXM: 989.4 TFLOP/s; pass --peak for another GPU). The TF32
// rows are also given against the TF32 peak (half of it).
//
// Without a GPU it prints one line and exits 0 (built with the benchmarks, MOM_BUILD_BENCH; the test command does
// not build them). Numbers from an H100: bench/RESULTS.md.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <mom/backend/cuda.hpp>
#include <mom/models/gpt2.hpp>
#include <mom/models/mom_models.hpp>
#include <mom/mom.hpp>

using namespace mom;

namespace {

using Clock = std::chrono::steady_clock;

struct Row {
  std::string name;
  double step_s = 0, tokens_per_s = 0, mfu = 0, mfu_tf32 = 0;
};

template <class Model>
Row run(const char* name, cuda::Precision precision, index_t batch, index_t seq, int warmup, int reps, double peak) {
  cuda::Backend<float> be;
  be.set_precision(precision);
  ModelInstance<Model, cuda::Backend<float>> m(1, be);
  m.reserve(batch, seq);
  const index_t n = batch * seq;
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<token_t> dist(0, token_t(Model::dims.vocab - 1));
  std::vector<token_t> tokens(std::size_t(n + 1));
  for (auto& t : tokens) t = dist(rng);
  const std::span<const token_t> x(tokens.data(), std::size_t(n)), y(tokens.data() + 1, std::size_t(n));
  auto opt_m = be.alloc(Model::params), opt_v = be.alloc(Model::params), norm = be.alloc(1);
  const cpu::AdamWConfig cfg{.lr = 1e-4f, .weight_decay = 0.1f};
  std::int64_t step = 0;
  auto train_step = [&] {
    m.zero_grad();
    {  // as train::Trainer's step: the weights unchanged until AdamW (bf16 copies once a step under BF16)
      const WeightCopyWindow<cuda::Backend<float>, float> copies(be, std::span<const float>(m.params()));
      m.forward_async(x, y, batch, seq);
      m.backward();
    }
    be.grad_norm(std::span<const float>(m.grads()), norm.data());
    be.adamw_step(m.params(), std::span<const float>(m.grads()), opt_m.span(), opt_v.span(), cfg, ++step, norm.data(),
                  1.0f);
  };
  for (int i = 0; i < warmup; ++i) train_step();  // warm-up: cuBLAS heuristics, CUB temp and bf16 staging sized
  be.sync();
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    train_step();
    be.sync();
    times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  Row r;
  r.name = name;
  r.step_s = times[times.size() / 2];
  r.tokens_per_s = double(n) / r.step_s;
  const double model_flops = 3.0 * double(Model::flops_per_token(seq)) * r.tokens_per_s;
  r.mfu = model_flops / (peak * 1e12);
  r.mfu_tf32 = model_flops / (peak * 0.5e12);
  std::printf("  %-34s step %8.1f ms (median of %d; min %.1f, max %.1f)  %9.0f tokens/s  MFU %5.1f%% of bf16 peak"
              "  (%5.1f%% of TF32 peak)\n",
              name, r.step_s * 1e3, reps, times.front() * 1e3, times.back() * 1e3, r.tokens_per_s, 100 * r.mfu,
              100 * r.mfu_tf32);
  std::fflush(stdout);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  index_t batch = 8, seq = 1024;
  int reps = 10, warmup = 3;
  double peak = 0;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--batch" && i + 1 < argc) batch = std::atoll(argv[++i]);
    else if (a == "--seq" && i + 1 < argc) seq = std::atoll(argv[++i]);
    else if (a == "--reps" && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
    else if (a == "--warmup" && i + 1 < argc) warmup = std::max(1, std::atoi(argv[++i]));
    else if (a == "--only" && i + 1 < argc) only = argv[++i];
    else if (a == "--peak" && i + 1 < argc) peak = std::atof(argv[++i]);
    else {
      std::fprintf(stderr, "usage: %s [--batch B] [--seq S] [--reps R] [--warmup W] [--only dense|mom[-tf32|-bf16]] [--peak TFLOPS]\n", argv[0]);
      return 2;
    }
  }
  if (cuda::device_count() == 0) {
    std::printf("bench_gpu_train_step: no CUDA device: nothing to measure\n");
    return 0;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return 1;
  const std::string gpu = prop.name;
  if (peak <= 0) {
    if (gpu.find("H100") != std::string::npos || gpu.find("H200") != std::string::npos) peak = 989.4;
    else {
      std::fprintf(stderr, "bench_gpu_train_step: unknown peak for '%s': pass --peak <dense bf16 TFLOP/s>\n", gpu.c_str());
      return 2;
    }
  }
  std::printf("bench_gpu_train_step: %s (%d SMs, %.0f GiB), dense bf16 peak %.1f TFLOP/s; batch %lld x seq %lld = "
              "%lld tokens/step\n",
              gpu.c_str(), prop.multiProcessorCount, double(prop.totalGlobalMem) / (1 << 30), peak, (long long)batch,
              (long long)seq, (long long)(batch * seq));
  std::printf("  GPT-2 small: %lld params, %.1f MFLOP/token forward at seq %lld (cost model)\n",
              (long long)GPT2Small::params, double(GPT2Small::flops_per_token(seq)) * 1e-6, (long long)seq);
  std::vector<Row> rows;
  // --only dense / mom / dense-bf16 / mom-tf32 ...: a prefix of "<model>-<precision>".
  const auto want = [&](const char* key) { return only.empty() || std::string(key).starts_with(only); };
  if (want("dense-tf32"))
    rows.push_back(run<GPT2Small>("dense GPT-2 small, TF32", cuda::Precision::TF32, batch, seq, warmup, reps, peak));
  if (want("dense-bf16"))
    rows.push_back(run<GPT2Small>("dense GPT-2 small, bf16", cuda::Precision::BF16, batch, seq, warmup, reps, peak));
  if (want("mom-tf32"))
    rows.push_back(run<MoMSmallLM<MoM_P<>>>("MoM_P [1-1-4-1-4-1], TF32", cuda::Precision::TF32, batch, seq, warmup,
                                            reps, peak));
  if (want("mom-bf16"))
    rows.push_back(run<MoMSmallLM<MoM_P<>>>("MoM_P [1-1-4-1-4-1], bf16", cuda::Precision::BF16, batch, seq, warmup,
                                            reps, peak));
  if (rows.size() == 4)
    std::printf("MoM_P step / dense step: TF32 %.2f, bf16 %.2f (target <= 1.9)\n", rows[2].step_s / rows[0].step_s,
                rows[3].step_s / rows[1].step_s);
  return 0;
}

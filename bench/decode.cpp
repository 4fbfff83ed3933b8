// bench_decode: incremental decoding with the KV cache (infer/decoder.hpp) against the recompute loop
// it replaces (a full forward over the window for every new token), float, cpu::Backend<float> (the same rows on
// a GPU: bench_gpu_decode, bench/gpu_decode.cpp).
//
//   bench_decode [--only dense8,moe8,momp,skip8,gpt2-small] [--tokens N]
//
// Per model and context C (256 and 1024 for dense8, MoM_P and GPT-2 small):
//   prefill   tokens/s of Decoder::prefill for one prompt of C/2 tokens, and for 8 prompts of C/2 (batch 8): in
//             passes of 128 prompt tokens (the default), and in passes of `batch` rows (as many rows as a decode
//             step: the position-by-position prefill it replaced)
//   decode    ms per step and tokens/s at batch 1 and batch 8, steps taken from position C/2 on
//   recompute ms per new token of model.forward over a window of C/2 .. C/2+k tokens (batch 1)
//   cache     bytes of the decoder (keys/values of every attention use + the step workspace)
//   weights   bytes of the parameters: one decode step at batch 1 reads them once, so
//             ms per step / (weights / bandwidth) says how close decoding is to memory-bound; the
//             bandwidth is measured here (a read of a 1 GiB buffer, best of 5).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <mom/mom.hpp>

#include "decode_rows.hpp"

using namespace mom;
using bench::clock_type, bench::seconds_since;

namespace {

// GB/s of a plain read of a buffer far larger than the caches (all threads), best of 5. Each thread sums into
// 64 independent lanes (whole vectors, no dependency between consecutive loads): a single running sum, as
// this bench had until 2026-11-24, is bound by the add latency and read 8.6-15.8 GB/s here, below what the
// decoder itself streams.
double read_bandwidth() {
  const std::size_t n = std::size_t(1) << 28;  // 1 GiB of floats
  constexpr std::size_t lanes = 64;
  std::vector<float> buf(n, 1.0f);
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = clock_type::now();
    double sum = 0;
#pragma omp parallel reduction(+ : sum)
    {
      float part[lanes] = {};
#pragma omp for schedule(static)
      for (std::size_t i = 0; i < n; i += lanes)
        for (std::size_t l = 0; l < lanes; ++l) part[l] += buf[i + l];
      for (const float v : part) sum += double(v);
    }
    const double s = seconds_since(t0);
    if (sum != double(n)) std::printf("(bandwidth check sum %g)\n", sum);
    best = std::max(best, double(n * sizeof(float)) / s * 1e-9);
  }
  return best;
}

template <class Model>
void bench_model(const char* name, index_t context, index_t new_tokens, double gbps) {
  auto model = Model::template make<cpu::Backend<float>>(1);
  bench::decode_rows(model, name, context, new_tokens, gbps, [] {});
}

}  // namespace

int main(int argc, char** argv) {
  cpu::limit_openmp_spinning(argv);
  std::string only = "dense8,moe8,momp,skip8,gpt2-small";
  index_t tokens = 64;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--only")) only = argv[i + 1];
    else if (!std::strcmp(argv[i], "--tokens")) tokens = std::atoll(argv[i + 1]);
  }
  const double gbps = read_bandwidth();
  std::printf("bench_decode: float, %d OpenMP threads, GEMM kernel %s; measured read bandwidth %.1f GB/s\n\n",
              omp_get_max_threads(), cpu::gemm_kernel(), gbps);
  bench::decode_table_header();
  constexpr Dims d8{.d_model = 256, .heads = 8, .d_ff = 1024, .vocab = 256, .context = 256};
  constexpr Dims d8k{.d_model = 256, .heads = 8, .d_ff = 1024, .vocab = 256, .context = 1024};
  if (only.find("dense8") != std::string::npos) {
    bench_model<LM<d8, Dense<8>>>("dense 8 layers (d 256)", 256, tokens, gbps);
    bench_model<LM<d8k, Dense<8>>>("dense 8 layers (d 256)", 1024, tokens, gbps);
  }
  // MoM_P in the paper's [1-1-4-1-1] strategy (mom-train's mom8-p); weight-read column: every module
  // (a step reads the K = 2 picked modules' Q / output / FFN weights and every attention module's K/V).
  if (only.find("momp") != std::string::npos) {
    bench_model<LM<d8, Strategy_11411<MoM_P<>>>>("MoM_P [1-1-4-1-1] (d 256)", 256, tokens, gbps);
    bench_model<LM<d8k, Strategy_11411<MoM_P<>>>>("MoM_P [1-1-4-1-1] (d 256)", 1024, tokens, gbps);
  }
  if (only.find("skip8") != std::string::npos)  // layer-skip gates at initialisation run about 73% of tokens
    bench_model<LM<d8, LayerSkipping<8>>>("layer-skip 8 layers (d 256)", 256, tokens, gbps);
  if (only.find("moe8") != std::string::npos)  // weight-read column: all experts (a step reads top-2 of 8)
    bench_model<LM<d8, MoEStack<8, 8, 2>>>("MoE 8 layers x 8 experts, top-2 (d 256)", 256, tokens, gbps);
  if (only.find("gpt2-small") != std::string::npos) {
    bench_model<GPT2Small>("GPT-2 small shape", 256, tokens, gbps);
    bench_model<GPT2Small>("GPT-2 small shape", 1024, tokens, gbps);
  }
}

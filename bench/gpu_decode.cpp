// bench_gpu_decode: bench_decode's rows (bench/decode_rows.hpp) on the CUDA backend, float with TF32 GEMMs
// (the backend's default): KV-cache decoding (infer::Decoder on cuda::Backend<float>) against the recompute
// loop, prefill and decode tokens/s at batch 1 and 8, the decoder's memory, and the batch-1 step against the
// time to read the weights once at the GPU's memory bandwidth measured here (a device-to-device copy of
// 1 GiB, bytes read + written, best of 5).
//
//   bench_gpu_decode [--only dense8,momp,gpt2-small] [--tokens N]
//
// Without a GPU it prints one line and exits 0 (built with the benchmarks, MOM_BUILD_BENCH; the test command does
// not build them).
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <string>

#include <mom/backend/cuda.hpp>
#include <mom/mom.hpp>

#include "decode_rows.hpp"

using namespace mom;

namespace {

double device_bandwidth(cuda::Backend<float>& be) {
  const index_t n = index_t(1) << 28;  // 1 GiB of floats, copied into another
  auto a = be.alloc(n), b = be.alloc(n);
  double best = 0;
  for (int rep = 0; rep < 6; ++rep) {
    be.sync();
    const auto t0 = bench::clock_type::now();
    be.copy(b.span(), std::span<const float>(a.span()));
    be.sync();
    const double s = bench::seconds_since(t0);
    if (rep > 0) best = std::max(best, 2.0 * double(n) * sizeof(float) / s * 1e-9);
  }
  return best;
}

template <class Model>
void bench_model(cuda::Backend<float>& be, const char* name, index_t context, index_t tokens, double gbps) {
  ModelInstance<Model, cuda::Backend<float>> model(1, be);
  bench::decode_rows(model, name, context, tokens, gbps, [&] { be.sync(); });
}

}  // namespace

int main(int argc, char** argv) {
  std::string only = "dense8,momp,gpt2-small";
  index_t tokens = 64;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--only")) only = argv[i + 1];
    else if (!std::strcmp(argv[i], "--tokens")) tokens = std::atoll(argv[i + 1]);
  }
  if (cuda::device_count() == 0) {
    std::printf("bench_gpu_decode: no CUDA device: nothing to measure\n");
    return 0;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return 1;
  cuda::Backend<float> be;
  const double gbps = device_bandwidth(be);
  std::printf("bench_gpu_decode: %s (%d SMs), float, TF32 GEMMs; measured copy bandwidth %.0f GB/s (read + write)\n\n",
              prop.name, prop.multiProcessorCount, gbps);
  bench::decode_table_header();
  constexpr Dims d8{.d_model = 256, .heads = 8, .d_ff = 1024, .vocab = 256, .context = 256};
  if (only.find("dense8") != std::string::npos) bench_model<LM<d8, Dense<8>>>(be, "dense 8 layers (d 256)", 256, tokens, gbps);
  if (only.find("momp") != std::string::npos)
    bench_model<LM<d8, Strategy_11411<MoM_P<>>>>(be, "MoM_P [1-1-4-1-1] (d 256)", 256, tokens, gbps);
  if (only.find("gpt2-small") != std::string::npos) {
    bench_model<GPT2Small>(be, "GPT-2 small shape", 256, tokens, gbps);
    bench_model<GPT2Small>(be, "GPT-2 small shape", 1024, tokens, gbps);
  }
  return 0;
}

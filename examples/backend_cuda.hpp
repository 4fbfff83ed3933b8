// mom-train on the CUDA backend (--device cuda[:N], --precision fp32|tf32|bf16): how it is opened and described.
// Included by the generated arch_<family>_cuda.cpp units before train_model.hpp (architectures.hpp, "The
// registry"); compiled by the host compiler, linked with mom::cuda (or, for the tests, with the CPU emulation of
// the kernels and the runtime: mom-train-emu).
#pragma once
#include <mom/backend/cuda.hpp>
#include <mom/train/distributed.hpp>
#ifdef MOM_HAVE_NCCL
#include <mom/train/nccl.hpp>
#endif

#include <memory>

#include <string>

#include "architectures.hpp"

namespace mom::examples {

// The GPU of --device cuda:N, or under an MPI launcher with plain --device cuda, the one of this process's
// local rank (ranks on one host take GPUs 0, 1, ...; more ranks than GPUs share them round-robin).
inline int cuda_device_index(const Device& d, int count) {
  const int local = train::launcher_local_rank();
  const int index = d.index >= 0 ? d.index : (local >= 0 ? local % count : 0);
  MOM_CHECK(index < count, "--device ", d.name(), ": this machine has ", count, count == 1 ? " CUDA device" : " CUDA devices",
            " (cuda:0", count > 1 ? "..cuda:" + std::to_string(count - 1) : std::string(), ")");
  return index;
}

inline cuda::Backend<float> open_backend(BackendTag<cuda::Backend<float>>, const Device& d, const train::Communicator*) {
  MOM_CHECK(d.kind == DeviceKind::cuda, "internal: the CUDA backend opened for --device ", d.name());
  const int count = cuda::device_count();
  MOM_CHECK(count > 0, "--device ", d.name(), ": no CUDA device (no GPU, or no NVIDIA driver, on this machine); "
            "use --device cpu");
  cuda::Backend<float> be(cuda_device_index(d, count));
  be.set_precision(d.precision == "bf16"   ? cuda::Precision::BF16
                   : d.precision == "fp32" ? cuda::Precision::FP32
                                           : cuda::Precision::TF32);
  return be;
}

inline std::string device_name(BackendTag<cuda::Backend<float>>, const cuda::Backend<float>& be) {
  return "cuda:" + std::to_string(be.device());
}

inline std::string backend_summary(BackendTag<cuda::Backend<float>>, const cuda::Backend<float>& be) {
  cudaDeviceProp prop{};
  MOM_CUDA_CHECK(cudaGetDeviceProperties(&prop, be.device()), "--device");
  const cuda::Precision p = be.precision();
  const char* precision = p == cuda::Precision::BF16  ? "bf16 matrix products, fp32 master weights and optimizer"
                          : p == cuda::Precision::FP32 ? "fp32"
                                                       : "tf32 matrix products, fp32 elsewhere";
  char memory[32];
  std::snprintf(memory, sizeof memory, "%.1f GiB", double(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0));
  return device_name(BackendTag<cuda::Backend<float>>{}, be) + " (" + prop.name + ", " + memory + "), " + precision;
}

inline double backend_memory_bytes(BackendTag<cuda::Backend<float>>, const cuda::Backend<float>& be) {
  std::size_t free = 0, total = 0;
  MOM_CUDA_CHECK(cudaSetDevice(be.device()), "--device");
  MOM_CUDA_CHECK(cudaMemGetInfo(&free, &total), "--device");
  return double(free);
}

// Several ranks on GPUs: gradients summed in device memory over NCCL where the build has it (train/nccl.hpp),
// else null (the host communicator then reduces copies staged through host memory).
inline std::unique_ptr<train::Communicator> device_communicator(BackendTag<cuda::Backend<float>>,
                                                                const cuda::Backend<float>& be, train::Communicator* host) {
#ifdef MOM_HAVE_NCCL
  if (host && host->size() > 1) return std::make_unique<train::NcclCommunicator>(*host, be);
#else
  (void)be;
  (void)host;
#endif
  return nullptr;
}

}  // namespace mom::examples

#pragma once
// Error checking for the CUDA backend (host code). Every CUDA runtime / cuBLAS call and every
// kernel launch goes through MOM_CUDA_CHECK / MOM_CUBLAS_CHECK, which throw mom::Error naming
// the op, the failing call and the runtime's own message.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "mom/core/check.hpp"

namespace mom::cuda {

namespace detail {
inline const char* cublas_status_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "CUBLAS_STATUS_<unknown>";
  }
}
}  // namespace detail

// The number of usable CUDA devices; 0 when there is none, or no driver at all (libcuda
// missing: cudaGetDeviceCount then reports cudaErrorInsufficientDriver / NoDevice). Never throws.
inline int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return 0;
  }
  return n;
}

}  // namespace mom::cuda

// MOM_CUDA_CHECK(call, "op") throws mom::Error("op: call failed: <cuda error name>: <message>").
#define MOM_CUDA_CHECK(call, op)                                                                              \
  do {                                                                                                        \
    const cudaError_t mom_cuda_err_ = (call);                                                                 \
    if (mom_cuda_err_ != cudaSuccess) [[unlikely]]                                                            \
      ::mom::detail::fail(op, ": ", #call, " failed: ", cudaGetErrorName(mom_cuda_err_), ": ",                \
                          cudaGetErrorString(mom_cuda_err_));                                                 \
  } while (0)

#define MOM_CUBLAS_CHECK(call, op)                                                                            \
  do {                                                                                                        \
    const cublasStatus_t mom_cublas_st_ = (call);                                                             \
    if (mom_cublas_st_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]                                                 \
      ::mom::detail::fail(op, ": ", #call, " failed: ", ::mom::cuda::detail::cublas_status_name(mom_cublas_st_)); \
  } while (0)

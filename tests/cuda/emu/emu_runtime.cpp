// Host stand-ins for the CUDA runtime and cuBLAS entry points that mom::cuda::Backend calls, for
// test_cuda_emu (no libcudart, no libcublas linked): "device" memory is host memory, streams are
// synchronous, and cublasGemmEx is a plain column-major loop that follows the cuBLAS definition
// (so the backend's row-major-as-transposed-column-major trick is exercised, not bypassed).
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <unistd.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <driver_types.h>

namespace {
// What a real runtime would make the host wait for, or allocate: counted so that the tests can check
// that a training step does neither (tests/cuda/cuda_models_test.cpp).
long host_waits = 0, allocations = 0;
}  // namespace

extern "C" {

long mom_emu_host_waits() { return host_waits; }
long mom_emu_allocations() { return allocations; }

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int) {
  *prop = cudaDeviceProp{};
  std::strcpy(prop->name, "CUDA emulated on the CPU");
  prop->totalGlobalMem = size_t(sysconf(_SC_PHYS_PAGES)) * size_t(sysconf(_SC_PAGE_SIZE));
  return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  *total = size_t(sysconf(_SC_PHYS_PAGES)) * size_t(sysconf(_SC_PAGE_SIZE));
  *free = *total;
  return cudaSuccess;
}
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
const char* cudaGetErrorName(cudaError_t) { return "cudaErrorEmulated"; }
const char* cudaGetErrorString(cudaError_t) { return "emulated CUDA runtime error"; }
cudaError_t cudaSetDevice(int) { return cudaSuccess; }
cudaError_t cudaDeviceSynchronize(void) {
  ++host_waits;
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* s) {
  *s = nullptr;
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t) {
  ++host_waits;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  ++allocations;
  *p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFree(void* p) {
  ++allocations;  // synchronises the device on a real runtime
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaMallocHost(void** p, size_t bytes) {
  ++allocations;
  *p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFreeHost(void* p) {
  ++allocations;
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaMemset(void* p, int value, size_t bytes) {
  std::memset(p, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t) { return cudaMemset(p, value, bytes); }
cudaError_t cudaMemset2DAsync(void* p, size_t pitch, int value, size_t width, size_t height, cudaStream_t) {
  for (size_t r = 0; r < height; ++r) std::memset(static_cast<char*>(p) + r * pitch, value, width);
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  ++host_waits;  // blocking
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind, cudaStream_t) {
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind, cudaStream_t) {
  for (size_t r = 0; r < height; ++r)
    std::memmove(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch, width);
  return cudaSuccess;
}

cublasStatus_t cublasCreate_v2(cublasHandle_t* h) {
  static int dummy;
  *h = reinterpret_cast<cublasHandle_t>(&dummy);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy_v2(cublasHandle_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetStream_v2(cublasHandle_t, cudaStream_t) { return CUBLAS_STATUS_SUCCESS; }

}  // extern "C"

namespace {
// C[m×n] = alpha·op(A)·op(B) + beta·C, all column-major (cuBLAS' definition), double accumulation.
// op(A) rows and op(B) columns are first copied out contiguously, so the dot products stream.
// Element loads: T itself, or a bf16 (its 16 bits are the top half of the fp32 pattern).
inline double load(const float* p, long i) { return p[i]; }
inline double load(const double* p, long i) { return p[i]; }
inline double load(const std::uint16_t* p, long i) {
  const std::uint32_t u = std::uint32_t(p[i]) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

template <class T, class In = T>
void gemm_col_major(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, T alpha, const In* A, int lda,
                    const In* B, int ldb, T beta, T* C, int ldc) {
  std::vector<double> a(static_cast<std::size_t>(m) * k), b(static_cast<std::size_t>(n) * k);
  for (int i = 0; i < m; ++i)
    for (int l = 0; l < k; ++l)
      a[static_cast<std::size_t>(i) * k + l] = ta == CUBLAS_OP_N ? load(A, i + static_cast<long>(l) * lda) : load(A, l + static_cast<long>(i) * lda);
  for (int j = 0; j < n; ++j)
    for (int l = 0; l < k; ++l)
      b[static_cast<std::size_t>(j) * k + l] = tb == CUBLAS_OP_N ? load(B, l + static_cast<long>(j) * ldb) : load(B, j + static_cast<long>(l) * ldb);
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) {
      const double* ar = a.data() + static_cast<std::size_t>(i) * k;
      const double* bc = b.data() + static_cast<std::size_t>(j) * k;
      double s = 0;
#pragma omp simd reduction(+ : s)  // vectorised (the sum's order changes; double accumulation keeps it exact to ~1e-16)
      for (int l = 0; l < k; ++l) s += ar[l] * bc[l];
      T& c = C[i + static_cast<long>(j) * ldc];
      c = beta == T(0) ? T(alpha * s) : T(alpha * s + double(beta) * double(c));
    }
}
}  // namespace

extern "C" cublasStatus_t cublasGemmEx(cublasHandle_t, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                                       int k, const void* alpha, const void* A, cudaDataType Atype, int lda,
                                       const void* B, cudaDataType Btype, int ldb, const void* beta, void* C,
                                       cudaDataType Ctype, int ldc, cublasComputeType_t, cublasGemmAlgo_t) {
  // Supported as the backend uses them: 32F/32F/32F, 64F/64F/64F, and 16BF x 16BF -> 32F (Precision::BF16).
  const bool bf16 = Atype == CUDA_R_16BF && Btype == CUDA_R_16BF && Ctype == CUDA_R_32F;
  if (!bf16 && (Atype != Btype || Atype != Ctype)) return CUBLAS_STATUS_NOT_SUPPORTED;
  // cuBLAS' argument checks that matter for row-major callers.
  const int rows_a = transa == CUBLAS_OP_N ? m : k, rows_b = transb == CUBLAS_OP_N ? k : n;
  if (m < 0 || n < 0 || k < 0 || lda < (rows_a > 1 ? rows_a : 1) || ldb < (rows_b > 1 ? rows_b : 1) ||
      ldc < (m > 1 ? m : 1))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (bf16)
    gemm_col_major<float, std::uint16_t>(transa, transb, m, n, k, *static_cast<const float*>(alpha),
                                         static_cast<const std::uint16_t*>(A), lda, static_cast<const std::uint16_t*>(B),
                                         ldb, *static_cast<const float*>(beta), static_cast<float*>(C), ldc);
  else if (Atype == CUDA_R_32F)
    gemm_col_major<float>(transa, transb, m, n, k, *static_cast<const float*>(alpha), static_cast<const float*>(A), lda,
                          static_cast<const float*>(B), ldb, *static_cast<const float*>(beta), static_cast<float*>(C),
                          ldc);
  else if (Atype == CUDA_R_64F)
    gemm_col_major<double>(transa, transb, m, n, k, *static_cast<const double*>(alpha), static_cast<const double*>(A),
                           lda, static_cast<const double*>(B), ldb, *static_cast<const double*>(beta),
                           static_cast<double*>(C), ldc);
  else
    return CUBLAS_STATUS_NOT_SUPPORTED;
  return CUBLAS_STATUS_SUCCESS;
}

// Host stand-ins for the CUDA runtime and cuBLAS entry points that mom::cuda::Backend calls, for
// test_cuda_emu (no libcudart, no libcublas linked): "device" memory is host memory, streams are
// synchronous, and cublasGemmEx follows the cuBLAS definition on column-major operands (in double)
// (so the backend's row-major-as-transposed-column-major trick is exercised, not bypassed).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <new>
#include <vector>

#include <unistd.h>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <driver_types.h>

#include "mom/backend/cpu/gemm.hpp"

namespace {
// What a real runtime would make the host wait for, or allocate: counted so that the tests can check
// that a training step does neither (tests/cuda/cuda_models_test.cpp).
long host_waits = 0, allocations = 0;
// What a step costs, for the per-step budgets (tests/cuda/cuda_budget_test.cpp, docs/cuda.md): kernel launches
// (emulate.hpp's emulate_launch; cuBLAS calls are not launches here, they are counted as GEMMs), bytes set by
// the memsets, bytes copied device to device, cuBLAS GEMM calls and their FLOPs (2·m·n·k), GEMMs with a
// leading dimension or pointer off a 16-byte boundary, and the bf16 staging conversions (to_bf16) with the
// fp32 bytes they read. Each is one addition per call, none inside a kernel or a GEMM loop.
bool lt_refuse = false;  // mom_emu_lt_refuse: cuBLASLt's heuristic finds nothing (tests of the fallback paths)
long launches = 0, memset_bytes = 0, d2d_bytes = 0, gemm_calls = 0, gemm_flops = 0, unaligned_gemms = 0,
     staging_copies = 0, staging_bytes = 0;
// The live cudaMalloc ranges (start -> bytes): cudaMemcpyDefault copies are device-to-device when both ends
// lie in one (the backend passes cudaMemcpyDefault everywhere, as unified addressing allows).
std::map<std::uintptr_t, std::size_t>& device_ranges() {
  static std::map<std::uintptr_t, std::size_t> r;
  return r;
}
bool on_device(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  const auto& r = device_ranges();
  auto it = r.upper_bound(a);
  if (it == r.begin()) return false;
  --it;
  return a < it->first + it->second;
}
void note_copy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) {
  if (kind == cudaMemcpyDeviceToDevice || (kind == cudaMemcpyDefault && on_device(dst) && on_device(src)))
    d2d_bytes += long(bytes);
}

// Stream capture (CUDA graphs), in the thread-local mode the backend uses: between cudaStreamBeginCapture and
// cudaStreamEndCapture the work enqueued on a stream is recorded, not run (kernel launches through
// emulate.hpp, memsets, device-to-device copies, GEMMs); what a capture forbids (a host wait, an allocation, a
// copy to or from host memory) fails and invalidates the capture, as the real runtime does. A graph is the
// recorded list; cudaGraphLaunch runs it in order (one graph launch, no kernel launches counted).
struct EmuGraph {
  std::vector<std::function<void()>> ops;
};
bool capturing = false, capture_invalid = false, replaying = false;
std::vector<std::function<void()>> captured;
long graph_launches = 0;
// What a capture refuses: the capture is invalidated and the call fails.
cudaError_t refuse_in_capture() {
  capture_invalid = true;
  return cudaErrorStreamCaptureUnsupported;
}
// Runs op now, or records it while a stream is captured.
template <class F>
void enqueue(F&& op) {
  if (capturing) captured.emplace_back(std::forward<F>(op));
  else op();
}
}  // namespace

bool mom_emu_capturing() noexcept { return capturing; }
void mom_emu_enqueue(std::function<void()> op) { enqueue(std::move(op)); }

extern "C" {

void mom_emu_lt_refuse(int on) { lt_refuse = on != 0; }
long mom_emu_host_waits() { return host_waits; }
long mom_emu_allocations() { return allocations; }
long mom_emu_launches() { return launches; }
long mom_emu_memset_bytes() { return memset_bytes; }
long mom_emu_d2d_bytes() { return d2d_bytes; }
long mom_emu_gemm_calls() { return gemm_calls; }
long mom_emu_gemm_flops() { return gemm_flops; }
long mom_emu_unaligned_gemms() { return unaligned_gemms; }
long mom_emu_staging_copies() { return staging_copies; }
long mom_emu_staging_bytes() { return staging_bytes; }
long mom_emu_graph_launches() { return graph_launches; }
// Called by the emulated kernels (mom/backend/cuda/emulate.hpp, kernels/linear.cuh).
void mom_emu_note_launch() noexcept {
  if (!replaying) ++launches;  // a kernel a graph's recorded stand-in launches is one of the graph's nodes
}
void mom_emu_note_staging(std::size_t fp32_bytes) noexcept {
  ++staging_copies;
  staging_bytes += long(fp32_bytes);
}

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
  if (capturing) return refuse_in_capture();
  ++host_waits;
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* s) {
  *s = nullptr;
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t) {
  if (capturing) return refuse_in_capture();
  ++host_waits;
  return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t, cudaStreamCaptureMode) {
  if (capturing) return cudaErrorIllegalState;
  capturing = true;
  capture_invalid = false;
  captured.clear();
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t, cudaGraph_t* graph) {
  if (!capturing) return cudaErrorIllegalState;
  capturing = false;
  *graph = nullptr;
  if (capture_invalid) {
    captured.clear();
    return cudaErrorStreamCaptureInvalidated;
  }
  *graph = reinterpret_cast<cudaGraph_t>(new EmuGraph{std::move(captured)});
  captured.clear();
  return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t, cudaStreamCaptureStatus* status) {
  *status = capturing ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  if (!graph) return cudaErrorInvalidValue;
  *exec = reinterpret_cast<cudaGraphExec_t>(new EmuGraph(*reinterpret_cast<EmuGraph*>(graph)));
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t) {
  if (!exec) return cudaErrorInvalidValue;
  if (capturing) return refuse_in_capture();  // a graph launched inside a capture: not emulated (nor used)
  ++graph_launches;
  replaying = true;
  for (const auto& op : reinterpret_cast<const EmuGraph*>(exec)->ops) op();
  replaying = false;
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete reinterpret_cast<EmuGraph*>(exec);
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete reinterpret_cast<EmuGraph*>(graph);
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  if (capturing) return refuse_in_capture();
  ++allocations;
  *p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  if (*p) device_ranges()[reinterpret_cast<std::uintptr_t>(*p)] = bytes;
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFree(void* p) {
  if (capturing) return refuse_in_capture();
  ++allocations;  // synchronises the device on a real runtime
  device_ranges().erase(reinterpret_cast<std::uintptr_t>(p));
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaMallocHost(void** p, size_t bytes) {
  if (capturing) return refuse_in_capture();
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
  if (capturing) return refuse_in_capture();  // the legacy stream, which a capture may not touch
  memset_bytes += long(bytes);
  std::memset(p, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t) {
  enqueue([=] {
    memset_bytes += long(bytes);
    std::memset(p, value, bytes);
  });
  return cudaSuccess;
}
cudaError_t cudaMemset2DAsync(void* p, size_t pitch, int value, size_t width, size_t height, cudaStream_t) {
  enqueue([=] {
    memset_bytes += long(width * height);
    for (size_t r = 0; r < height; ++r) std::memset(static_cast<char*>(p) + r * pitch, value, width);
  });
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (capturing) return refuse_in_capture();
  ++host_waits;  // blocking
  note_copy(dst, src, bytes, kind);
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}
// A captured copy must stay on the device (the backend's host copies are pageable memory, which a graph cannot hold).
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t) {
  if (capturing && !(on_device(dst) && on_device(src))) return refuse_in_capture();
  enqueue([=] {
    note_copy(dst, src, bytes, kind);
    std::memmove(dst, src, bytes);
  });
  return cudaSuccess;
}
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind kind, cudaStream_t) {
  if (capturing && !(on_device(dst) && on_device(src))) return refuse_in_capture();
  enqueue([=] {
    if (height > 0) note_copy(dst, src, width * height, kind);
    for (size_t r = 0; r < height; ++r)
      std::memmove(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch, width);
  });
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
// A column-major matrix is its transpose stored by rows, so C's rows-major view is Cᵀ = op(B)ᵀ·op(A)ᵀ: the
// operands are copied as doubles in their own layout (a contiguous pass each) and multiplied by the CPU
// backend's double product (Eigen's), with the transposes as flags. The sums are exact to ~1e-16 before C's
// rounding. Element loads: T itself, or a bf16 (its 16 bits are the top half of the fp32 pattern).
inline double load(const float* p, long i) { return p[i]; }
inline double load(const double* p, long i) { return p[i]; }
inline double load(const std::uint16_t* p, long i) {
  const std::uint32_t u = std::uint32_t(p[i]) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
// Column-major [rows × cols] (leading dimension ld) as doubles, by rows: [cols × rows].
template <class In>
std::vector<double> by_rows(const In* x, int rows, int cols, int ld) {
  std::vector<double> out(static_cast<std::size_t>(rows) * cols);
  for (int c = 0; c < cols; ++c)
    for (int r = 0; r < rows; ++r) out[static_cast<std::size_t>(c) * rows + r] = load(x, r + static_cast<long>(c) * ld);
  return out;
}

template <class T, class In = T>
void gemm_col_major(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, T alpha, const In* A, int lda,
                    const In* B, int ldb, T beta, T* C, int ldc) {
  using mom::index_t;
  using mom::cpu::Trans;
  const bool at = ta != CUBLAS_OP_N, bt = tb != CUBLAS_OP_N;
  const int rows_a = at ? k : m, cols_a = at ? m : k, rows_b = bt ? n : k, cols_b = bt ? k : n;
  const std::vector<double> a = by_rows(A, rows_a, cols_a, lda), b = by_rows(B, rows_b, cols_b, ldb);
  std::vector<double> s(static_cast<std::size_t>(n) * m);  // Cᵀ [n × m] by rows: s(j, i) = C(i, j) before alpha, beta
  // On one thread, as every emulated kernel runs (Eigen's threads would spin against the suite's other test
  // processes: 4x slower on 2 busy cores), then Eigen's thread count back to its default (nothing else in the
  // library sets it).
  if (m > 0 && n > 0 && k > 0) {
    Eigen::setNbThreads(1);
    mom::cpu::detail::gemm_eigen<double>({s.data(), index_t(n), index_t(m)}, {b.data(), index_t(cols_b), index_t(rows_b)},
                                         bt ? Trans::T : Trans::N, {a.data(), index_t(cols_a), index_t(rows_a)},
                                         at ? Trans::T : Trans::N, 1.0, 0.0);
    Eigen::setNbThreads(-1);
  }
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) {
      const double sum = s[static_cast<std::size_t>(j) * m + i];
      T& c = C[i + static_cast<long>(j) * ldc];
      c = beta == T(0) ? T(alpha * sum) : T(alpha * sum + double(beta) * double(c));
    }
}
}  // namespace

namespace {
// cublasGemmEx's definition, and cublasLtMatmul's without an epilogue (both count as GEMMs for the budgets).
cublasStatus_t gemm_ex(cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k, const void* alpha,
                       const void* A, cudaDataType Atype, int lda, const void* B, cudaDataType Btype, int ldb,
                       const void* beta, void* C, cudaDataType Ctype, int ldc) {
  // Supported as the backend uses them: 32F/32F/32F, 64F/64F/64F, and 16BF x 16BF -> 32F (Precision::BF16).
  const bool bf16 = Atype == CUDA_R_16BF && Btype == CUDA_R_16BF && Ctype == CUDA_R_32F;
  if (!bf16 && (Atype != Btype || Atype != Ctype)) return CUBLAS_STATUS_NOT_SUPPORTED;
  // cuBLAS' argument checks that matter for row-major callers.
  const int rows_a = transa == CUBLAS_OP_N ? m : k, rows_b = transb == CUBLAS_OP_N ? k : n;
  if (m < 0 || n < 0 || k < 0 || lda < (rows_a > 1 ? rows_a : 1) || ldb < (rows_b > 1 ? rows_b : 1) ||
      ldc < (m > 1 ? m : 1))
    return CUBLAS_STATUS_INVALID_VALUE;
  // The budgets' counters: one call, 2·m·n·k FLOPs, and whether an operand is off the 16-byte alignment that
  // cuBLAS' tensor-core kernels want (leading dimension × element size, and the pointer).
  ++gemm_calls;
  gemm_flops += 2L * m * n * k;
  const auto esize = [](cudaDataType t) -> long { return t == CUDA_R_64F ? 8 : t == CUDA_R_16BF ? 2 : 4; };
  const auto off16 = [&](const void* p, int ld, cudaDataType t) {
    return (reinterpret_cast<std::uintptr_t>(p) % 16) != 0 || (long(ld) * esize(t)) % 16 != 0;
  };
  if (off16(A, lda, Atype) || off16(B, ldb, Btype) || off16(C, ldc, Ctype)) {
    ++unaligned_gemms;
    static const bool trace = std::getenv("MOM_EMU_TRACE_UNALIGNED") != nullptr;  // which ones (docs/cuda.md)
    if (trace)
      std::fprintf(stderr, "unaligned GEMM (column-major): m %d n %d k %d, lda %d ldb %d ldc %d, A%s B%s C%s\n", m, n,
                   k, lda, ldb, ldc, off16(A, lda, Atype) ? "*" : "", off16(B, ldb, Btype) ? "*" : "",
                   off16(C, ldc, Ctype) ? "*" : "");
  }
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

// A GEMM enqueued on the stream: run now, or (captured) recorded with its scalars copied, as cuBLAS reads host
// scalars when it is called. Its arguments were valid when the same GEMM ran outside the capture (the decoder
// records a step after running one); a recorded one that fails when replayed stops the run.
template <class F>
cublasStatus_t enqueue_gemm(F&& gemm) {
  if (!capturing) return gemm();
  captured.emplace_back([gemm] {
    if (gemm() != CUBLAS_STATUS_SUCCESS) {
      std::fprintf(stderr, "emulated CUDA graph: a recorded GEMM failed when replayed\n");
      std::abort();
    }
  });
  return CUBLAS_STATUS_SUCCESS;
}
struct Scalars {  // alpha and beta by value: float or double
  double alpha = 0, beta = 0;
  float alpha_f = 0, beta_f = 0;
  Scalars(const void* a, const void* b, bool dbl) {
    if (dbl) alpha = *static_cast<const double*>(a), beta = *static_cast<const double*>(b);
    else alpha_f = *static_cast<const float*>(a), beta_f = *static_cast<const float*>(b);
  }
  const void* a(bool dbl) const { return dbl ? static_cast<const void*>(&alpha) : &alpha_f; }
  const void* b(bool dbl) const { return dbl ? static_cast<const void*>(&beta) : &beta_f; }
};
}  // namespace

extern "C" cublasStatus_t cublasGemmEx(cublasHandle_t, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                                       int k, const void* alpha, const void* A, cudaDataType Atype, int lda,
                                       const void* B, cudaDataType Btype, int ldb, const void* beta, void* C,
                                       cudaDataType Ctype, int ldc, cublasComputeType_t, cublasGemmAlgo_t) {
  const bool dbl = Ctype == CUDA_R_64F;
  return enqueue_gemm([=, sc = Scalars(alpha, beta, dbl)] {
    return gemm_ex(transa, transb, m, n, k, sc.a(dbl), A, Atype, lda, B, Btype, ldb, sc.b(dbl), C, Ctype, ldc);
  });
}

// ---- cuBLASLt, as the backend uses it (lt.hpp): D = alpha·op(A)·op(B) with the epilogue DEFAULT, BIAS (a vector
// added to every column of D), GELU_AUX_BIAS (then aux = D, D = gelu(aux)) or DGELU (D ∘= gelu'(aux)), D = C,
// beta = 0, A and B 32F or 16BF, D (and with it the bias and aux) 32F, or 16BF from 16BF operands. The descriptors
// keep their fields in the semi-opaque structs' storage. With the bias, D is first filled with it and the product added with beta = 1: one rounding of sum + bias,
// the same bits as the backend's broadcast-then-GEMM path. The GELU is the kernels' tanh form in float
// (kernels/activation.cuh), so the fused products agree with the backend's product-then-kernel path.
namespace {
struct EmuLtOp {
  cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  cudaDataType_t bias_type = CUDA_R_32F;
  void* aux = nullptr;
  std::int64_t aux_ld = 0;
};
struct EmuLtLayout {
  cudaDataType type;
  std::uint64_t rows, cols;
  std::int64_t ld;
};
static_assert(sizeof(EmuLtOp) <= sizeof(cublasLtMatmulDescOpaque_t) && sizeof(EmuLtLayout) <= sizeof(cublasLtMatrixLayoutOpaque_t));
EmuLtOp& fields(cublasLtMatmulDesc_t d) { return *reinterpret_cast<EmuLtOp*>(d->data); }
EmuLtLayout& fields(cublasLtMatrixLayout_t l) { return *reinterpret_cast<EmuLtLayout*>(l->data); }
template <class U>
cublasStatus_t set_field(U& field, const void* buf, std::size_t size) {
  if (!buf || size != sizeof(U)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(&field, buf, sizeof(U));
  return CUBLAS_STATUS_SUCCESS;
}
bool lt_supported(cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t d) {
  const EmuLtOp& o = fields(op);
  const cudaDataType ta = fields(a).type;
  const bool bias = o.epilogue == CUBLASLT_EPILOGUE_BIAS || o.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  const bool aux = o.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || o.epilogue == CUBLASLT_EPILOGUE_DGELU;
  const cudaDataType td = fields(d).type;  // D, and with it the bias and aux: 32F, or 16BF from 16BF operands
  return (o.epilogue == CUBLASLT_EPILOGUE_DEFAULT || bias || aux) && (!bias || o.bias_type == td) &&
         (!aux || o.aux_ld >= std::int64_t(fields(d).rows)) && ta == fields(b).type &&
         (ta == CUDA_R_32F || ta == CUDA_R_16BF) && (td == CUDA_R_32F || (td == CUDA_R_16BF && ta == CUDA_R_16BF));
}
// fp32 -> bf16 bits, round to nearest even, NaN kept (the staging's rounding, kernels/linear.cuh); back: load.
std::uint16_t emu_bf16(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}
// The GELU kernels' expressions (kernels/activation.cuh), in float.
float emu_gelu(float v) {
  return 0.5f * v * (1.0f + std::tanh(0.7978845608028654f * (v + 0.044715f * v * v * v)));
}
float emu_dgelu(float v) {
  const float k = 0.7978845608028654f, c = 0.044715f;
  const float t = std::tanh(k * (v + c * v * v * v));
  return 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * k * (1.0f + 3.0f * c * v * v);
}
}  // namespace

extern "C" {
cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) {
  static int dummy;
  *h = reinterpret_cast<cublasLtHandle_t>(&dummy);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t, cudaDataType_t) {
  *d = new cublasLtMatmulDescOpaque_t{};
  new ((*d)->data) EmuLtOp{};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  delete d;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              size_t size) {
  EmuLtOp& o = fields(d);
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA: return set_field(o.ta, buf, size);
    case CUBLASLT_MATMUL_DESC_TRANSB: return set_field(o.tb, buf, size);
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return set_field(o.epilogue, buf, size);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return set_field(o.bias, buf, size);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return set_field(o.bias_type, buf, size);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: return set_field(o.aux, buf, size);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: return set_field(o.aux_ld, buf, size);
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType type, uint64_t rows, uint64_t cols,
                                          int64_t ld) {
  if (ld < std::int64_t(rows > 1 ? rows : 1)) return CUBLAS_STATUS_INVALID_VALUE;
  *l = new cublasLtMatrixLayoutOpaque_t{};
  new ((*l)->data) EmuLtLayout{type, rows, cols, ld};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
  delete l;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) {
  *p = new cublasLtMatmulPreferenceOpaque_t{};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
  delete p;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t, cublasLtMatmulPreferenceAttributes_t,
                                                    const void* buf, size_t) {
  return buf ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int* found) {
  *found = 0;
  if (requested < 1) return CUBLAS_STATUS_INVALID_VALUE;
  if (!lt_supported(op, a, b, d)) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (lt_refuse) return CUBLAS_STATUS_SUCCESS;  // no algorithm found
  results[0] = cublasLtMatmulHeuristicResult_t{};
  results[0].state = CUBLAS_STATUS_SUCCESS;
  *found = 1;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t op, const void* alpha, const void* A,
                              cublasLtMatrixLayout_t a, const void* B, cublasLtMatrixLayout_t b, const void* beta,
                              const void* C, cublasLtMatrixLayout_t c, void* D, cublasLtMatrixLayout_t d,
                              const cublasLtMatmulAlgo_t*, void*, size_t, cudaStream_t) {
  const EmuLtOp& o = fields(op);
  const EmuLtLayout &la = fields(a), &lb = fields(b), &ld = fields(d);
  // beta = 0 (C is D), or beta = 1 with an fp32 C of D's layout, not D itself: the output linears' residual,
  // D = (A·B + bias) + C, added after the bias (the order the separate ops add in: the bits are theirs).
  const float c_scale = *static_cast<const float*>(beta);
  const bool residual = c_scale != 0.0f;
  if (!lt_supported(op, a, b, d) || (!residual && C != D) ||
      (residual && (c_scale != 1.0f || C == D || ld.type != CUDA_R_32F || fields(c).type != CUDA_R_32F ||
                    fields(c).ld != ld.ld || fields(c).rows != ld.rows || fields(c).cols != ld.cols)))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  const bool at = o.ta != CUBLAS_OP_N, bt = o.tb != CUBLAS_OP_N;
  const auto m = ld.rows, n = ld.cols, k = at ? la.rows : la.cols;
  if ((at ? la.cols : la.rows) != m || (bt ? lb.rows : lb.cols) != n || (bt ? lb.cols : lb.rows) != k)
    return CUBLAS_STATUS_INVALID_VALUE;
  const bool bias = o.epilogue == CUBLASLT_EPILOGUE_BIAS || o.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  if ((bias && !o.bias) || (o.epilogue != CUBLASLT_EPILOGUE_DEFAULT && !bias && !o.aux) ||
      (o.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS && !o.aux))
    return CUBLAS_STATUS_INVALID_VALUE;
  // The descriptors' fields by value: a recorded matmul runs with them as they were when it was enqueued.
  // A bf16 D (and bias, aux) is computed in fp32 as a 32F one and rounded once when stored.
  return enqueue_gemm([o, la, lb, ld, m, n, k, A, B, C, D, bias, residual, a = *static_cast<const float*>(alpha)] {
    const float one = 1.0f, zero = 0.0f;
    const bool d16 = ld.type == CUDA_R_16BF;
    std::vector<float> acc(d16 ? std::size_t(m * n) : 0);
    float* out = d16 ? acc.data() : static_cast<float*>(D);
    const std::uint64_t out_ld = d16 ? m : std::uint64_t(ld.ld);
    const auto at = [&](std::uint64_t i, std::uint64_t j) -> float& { return out[i + j * out_ld]; };
    if (bias)
      for (std::uint64_t j = 0; j < n; ++j)
        for (std::uint64_t i = 0; i < m; ++i)
          at(i, j) = float(d16 ? load(static_cast<const std::uint16_t*>(o.bias), long(i))
                                 : load(static_cast<const float*>(o.bias), long(i)));
    const cublasStatus_t st = gemm_ex(o.ta, o.tb, int(m), int(n), int(k), &a, A, la.type, int(la.ld), B, lb.type,
                                      int(lb.ld), bias ? &one : &zero, out, CUDA_R_32F, int(out_ld));
    const auto aux_index = [&](std::uint64_t i, std::uint64_t j) { return i + j * std::uint64_t(o.aux_ld); };
    const auto aux_get = [&](std::uint64_t i, std::uint64_t j) {
      return float(d16 ? load(static_cast<const std::uint16_t*>(o.aux), long(aux_index(i, j)))
                       : load(static_cast<const float*>(o.aux), long(aux_index(i, j))));
    };
    const auto aux_set = [&](std::uint64_t i, std::uint64_t j, float v) {
      if (d16) static_cast<std::uint16_t*>(o.aux)[aux_index(i, j)] = emu_bf16(v);
      else static_cast<float*>(o.aux)[aux_index(i, j)] = v;
    };
    if (o.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS)
      for (std::uint64_t j = 0; j < n; ++j)
        for (std::uint64_t i = 0; i < m; ++i) {
          aux_set(i, j, at(i, j));
          at(i, j) = emu_gelu(at(i, j));
        }
    if (o.epilogue == CUBLASLT_EPILOGUE_DGELU)
      for (std::uint64_t j = 0; j < n; ++j)
        for (std::uint64_t i = 0; i < m; ++i) at(i, j) = 0.0f + at(i, j) * emu_dgelu(aux_get(i, j));
    if (residual)
      for (std::uint64_t j = 0; j < n; ++j)
        for (std::uint64_t i = 0; i < m; ++i) at(i, j) += static_cast<const float*>(C)[i + j * out_ld];
    if (d16)
      for (std::uint64_t j = 0; j < n; ++j)
        for (std::uint64_t i = 0; i < m; ++i)
          static_cast<std::uint16_t*>(D)[i + j * std::uint64_t(ld.ld)] = emu_bf16(at(i, j));
    return st;
  });
}
}  // extern "C"

#pragma once
// mom's own single-precision GEMM (GotoBLAS / BLIS structure), used by cpu::gemm<float>.
//
// Why our own: Eigen's GEMM reaches ~60% of this machine's sgemm peak, and OpenBLAS only
// reaches its AVX-512 kernels when OPENBLAS_CORETYPE does not pin an older core, which
// a library cannot control in its users' environment.
//
// Structure (loops from outer to inner), C[m×n] += alpha·op(A)[m×k]·op(B)[k×n]:
//   jc: n in blocks of NC      packed B block (KC×NC) lives in L3, shared by the threads
//   pc: k in blocks of KC      (beta is applied on the first k block only)
//     pack B block             panels of NR columns: for each k, NR consecutive values
//     ic: m in blocks of MC    packed A block (MC×KC) lives in L2
//       pack A block           panels of MR rows: for each k, MR consecutive values
//       jr, ir: micro-kernel   one MR×NR tile of C in registers; the B panel (KC×NR)
//                              stays in L1 while the A panels stream from L2
// Packing reads op(A) / op(B) through their strides, so transposes and leading
// dimensions cost nothing in the kernel and one micro-kernel serves NN, NT, TN, TT.
// Panels are zero-padded to MR / NR. AVX-512 runs an edge tile (the last rows of m, a
// last panel of ≤ 16 columns) at its own size, stored with masks; AVX2 runs the full
// tile into a small stack tile. With at most 64 columns and op(A) stored by rows (a
// router's logits), AVX-512 skips packing A and reads its rows in place. Each element of
// C is one k-ordered chain of fused multiply-adds in the same k blocks on every path and
// tile size, so none of these choices changes a bit (tests/ops/gemm_test.cpp). The exception
// is the few-rows path (at most 8 rows against a row-major weight: gemv, gemm_native_isa.hpp),
// which sums each dot product across the vector lanes: a product of 8 rows or fewer does not
// give the bits of the same rows inside a larger product.
//
// Threads: gemm_parallel packs each B block cooperatively (one barrier per KC step)
// and hands out (MC block of A) × (share of the B panels) work units through a shared
// counter, each thread packing its A blocks into its own buffer. gemm_serial runs the
// same loops on the calling thread only, with that thread's own buffers, so it may be
// called from inside an OpenMP parallel region (e.g. attention, one gemm per
// (sequence, head) per thread).
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <utility>

#include "mom/core/tensor.hpp"

// Runtime dispatch: the AVX-512 and the AVX2 + FMA kernels are both compiled, each in its own
// namespace under `#pragma GCC target`, whatever flags the including program uses (plain -O2
// included), and the first call picks one from the CPU (__builtin_cpu_supports), as OpenBLAS's
// DYNAMIC_ARCH and ggml do; without either the callers fall back to Eigen's product.
// kernel_name() says which runs. The kernels themselves: gemm_native_isa.hpp.
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define MOM_HAVE_NATIVE_GEMM 1

namespace mom::cpu::detail::native {

// Problems below this many multiply-adds run on one thread: spawning the team and
// the barriers would cost more than the second core gains.
inline constexpr double kParallelMinMacs = 96.0 * 96.0 * 96.0;

// ---- packing buffers --------------------------------------------------------------
// Grown once to the largest size seen, 64-byte aligned, never shrunk: no allocation
// per call after warm-up. One set per thread (thread_local).
struct PackBuffer {
  float* data = nullptr;
  std::size_t capacity = 0;  // floats
  PackBuffer() = default;
  PackBuffer(const PackBuffer&) = delete;
  PackBuffer& operator=(const PackBuffer&) = delete;
  ~PackBuffer() { std::free(data); }
  float* reserve(std::size_t n) {
    if (n > capacity) {
      std::free(data);
      const std::size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
      data = static_cast<float*>(std::aligned_alloc(64, bytes));
      if (!data) {
        capacity = 0;
        throw std::bad_alloc();
      }
      capacity = n;
    }
    return data;
  }
};

struct PackBuffers {
  PackBuffer a, b;
};

inline PackBuffers& thread_buffers() {
  thread_local PackBuffers buffers;
  return buffers;
}

// An operand as the kernel sees it: element (i, j) of op(X) is data[i*rs + j*cs], or, with a list of memory
// rows (a gather fused into the packing), data[rows[i]*rs + j] (op(X) = X, cs == 1: its rows read through the
// list) or data[i + rows[j]*cs] (op(X) = Xᵀ, rs == 1: its columns are X's rows, read through the list;
// `transposed`). With `scale` (A only, with a list), the list's entry l is multiplied by scale[l] as it is packed:
// a routed layer's dL/dy = weight · dout[token] read inside W₂'s backward products (routing/dispatch.hpp).
struct Operand {
  const float* data;
  index_t rs, cs;
  const token_t* rows = nullptr;
  const float* scale = nullptr;
  bool transposed = false;  // rows indexes op(X)'s columns
  const float* row(index_t i) const { return data + (rows && !transposed ? index_t(rows[i]) : i) * rs; }
  // Memory row of op(X)'s column j (transposed lists), and the list entries' scales.
  const float* col(index_t j) const { return data + (rows && transposed ? index_t(rows[j]) : j) * cs; }
  float scale_of(index_t l) const { return scale ? scale[l] : 1.0f; }
  float operator()(index_t i, index_t j) const {
    if (!rows) return data[i * rs + j * cs];
    return transposed ? col(j)[i * rs] * scale_of(j) : row(i)[j * cs] * scale_of(i);
  }
  // The operand from element (i, j) on.
  Operand from(index_t i, index_t j) const {
    if (!rows) return Operand{data + i * rs + j * cs, rs, cs};
    const index_t l = transposed ? j : i;  // the list's first entry from here
    return Operand{data + (transposed ? i * rs : j * cs), rs, cs, rows + l, scale ? scale + l : nullptr, transposed};
  }
};

struct Problem {
  index_t m, n, k;
  Operand a, b;  // op(A) (m×k), op(B) (k×n)
  float* c;
  index_t ldc;
  float alpha, beta;
  bool relu = false;  // then C = max(C, 0) (Epilogue::relu): the blocked tiles in registers at their last k block's
                      // store; the other paths (few rows, few columns) in one pass over C after them (relu_tile)
};

// C[0:rows, 0:cols] = max(C, 0) as std::max(c, 0) takes it (v < 0 ? 0 : v: a NaN and -0 are kept), the bits of
// relu_forward (Eigen's max(0)).
inline void relu_tile(float* c, index_t rows, index_t cols, index_t ldc) {
  for (index_t i = 0; i < rows; ++i) {
    float* ci = c + i * ldc;
#pragma omp simd
    for (index_t j = 0; j < cols; ++j) ci[j] = ci[j] < 0.0f ? 0.0f : ci[j];
  }
}

// Contiguous share [begin, end) of `count` items for part `part` of `parts`.
inline void share(index_t count, index_t part, index_t parts, index_t& begin, index_t& end) {
  begin = count * part / parts;
  end = count * (part + 1) / parts;
}

inline void scale_c(float* c, index_t m, index_t n, index_t ldc, float beta) {
  for (index_t i = 0; i < m; ++i)
    for (index_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
}


}  // namespace mom::cpu::detail::native

// The kernels, once per instruction set (MOM_NATIVE_ISA: 512 = AVX-512F, 256 = AVX2 + FMA).
namespace mom::cpu::detail::native::avx512 {
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
#pragma GCC optimize("O3")  // the packing loops as a -O3 build compiles them, whatever the program uses
#define MOM_NATIVE_ISA 512
#include "mom/backend/cpu/gemm_native_isa.hpp"
#undef MOM_NATIVE_ISA
#pragma GCC pop_options
}  // namespace mom::cpu::detail::native::avx512

namespace mom::cpu::detail::native::avx2 {
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#pragma GCC optimize("O3")  // the packing loops as a -O3 build compiles them, whatever the program uses
#define MOM_NATIVE_ISA 256
#include "mom/backend/cpu/gemm_native_isa.hpp"
#undef MOM_NATIVE_ISA
#pragma GCC pop_options
}  // namespace mom::cpu::detail::native::avx2

namespace mom::cpu::detail::native {

enum class Isa : int { none, avx2, avx512 };
inline Isa detect_isa() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    return Isa::avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::avx2;
  return Isa::none;
}
// The kernel in use: the best the CPU has, detected once; select() may step down (tests, comparisons).
inline std::atomic<int>& selected_isa() {
  static std::atomic<int> s{int(detect_isa())};
  return s;
}
inline Isa isa() { return Isa(selected_isa().load(std::memory_order_relaxed)); }
// Use `want` if the CPU supports it (any ISA at or below the detected one); false otherwise.
inline bool select(Isa want) {
  if (int(want) > int(detect_isa())) return false;
  selected_isa().store(int(want), std::memory_order_relaxed);
  return true;
}

// One thread, this thread's buffers. Safe inside an OpenMP parallel region. false: no native
// kernel on this CPU (the caller uses Eigen).
inline bool gemm_serial(const Problem& p) {
  switch (isa()) {
    case Isa::avx512: avx512::gemm_serial(p); return true;
    case Isa::avx2: avx2::gemm_serial(p); return true;
    default: return false;
  }
}
// All OpenMP threads (omp_get_max_threads()); small problems, and calls made from inside a
// parallel region, run on the calling thread.
inline bool gemm_parallel(const Problem& p) {
  switch (isa()) {
    case Isa::avx512: avx512::gemm_parallel(p); return true;
    case Isa::avx2: avx2::gemm_parallel(p); return true;
    default: return false;
  }
}

}  // namespace mom::cpu::detail::native

#endif  // x86 with GCC or Clang

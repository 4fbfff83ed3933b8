#pragma once
// Shared by the CUDA test sources (test_cuda with the real runtime, test_cuda_emu with the emulated
// one): the skip-without-GPU guard, one backend per scalar type for the whole binary, and Arr, an
// array with a CPU copy and a device copy holding the same initial values.
#include <catch2/catch.hpp>

#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "mom/backend/cpu.hpp"
#include "mom/backend/cuda.hpp"
#include "ops/grad_check.hpp"

namespace mom::test {

// Device-vs-CPU tolerances, relative to the CPU result's largest magnitude: exact kernels (float:
// reassociation only), attention (online softmax), TF32 tensor-core GEMMs.
template <class T>
constexpr double tol_kernel = std::is_same_v<T, double> ? 1e-10 : 1e-5;
template <class T>
constexpr double tol_attention = std::is_same_v<T, double> ? 1e-10 : 1e-4;
template <class T>
constexpr double tol_tf32 = std::is_same_v<T, double> ? 1e-10 : 1e-2;

inline bool gpu_available() {
  static const bool yes = cuda::device_count() > 0;
  return yes;
}

// One backend (one stream, one cuBLAS handle) per scalar type for the whole binary; never
// destroyed, so no cuBLAS/CUDA teardown runs after the runtime has unloaded at exit.
template <class T>
cuda::Backend<T>& gpu() {
  static auto* be = new cuda::Backend<T>();
  return *be;
}
template <class T>
cpu::Backend<T>& host() {
  static cpu::Backend<T> be;
  return be;
}

// h: the CPU backend's copy, initial: the values both started from, d: the device copy.
template <class T, class U = T>
struct Arr {
  std::vector<U> h, initial;
  cuda::Buffer<U> d;
  explicit Arr(std::vector<U> v)
      : h(std::move(v)), initial(h), d(gpu<T>().template alloc<U>(ssize(std::span<U>(h)))) {
    gpu<T>().from_host(d.span(), std::span<const U>(h));
  }
  index_t size() const { return static_cast<index_t>(h.size()); }
  MatrixView<U> hm(index_t r, index_t c) { return {h.data(), r, c}; }
  MatrixView<U> dm(index_t r, index_t c) { return {d.data(), r, c}; }
  MatrixView<U> hm(index_t r, index_t c, index_t ld) { return {h.data(), r, c, ld}; }
  MatrixView<U> dm(index_t r, index_t c, index_t ld) { return {d.data(), r, c, ld}; }
  std::span<U> hs() { return {h.data(), h.size()}; }
  std::span<U> ds() { return d.span(); }
  std::vector<U> fetch() {
    std::vector<U> out(h.size());
    gpu<T>().to_host(std::span<U>(out), std::span<const U>(d.span()));
    return out;
  }
};

template <class T>
Arr<T> rand_arr(index_t n, Rng& rng, double lo = -1, double hi = 1) {
  return Arr<T>(random_vec<T>(static_cast<std::size_t>(n), rng, lo, hi));
}
template <class T>
Arr<T> const_arr(index_t n, T value) {
  return Arr<T>(std::vector<T>(static_cast<std::size_t>(n), value));
}
template <class T>
Arr<T, token_t> tok_arr(std::vector<token_t> v) {
  return Arr<T, token_t>(std::move(v));
}

}  // namespace mom::test

// The emulated runtime (tests/cuda/emu/emu_runtime.cpp) counts what a real runtime would make the host wait for
// (stream / device synchronisation, blocking copies) and the allocations; in test_cuda (the real runtime) these
// symbols are absent, and MOM_REQUIRE_EMU_COUNTERS skips the rest of a test case with one warning line.
extern "C" long mom_emu_host_waits() __attribute__((weak));
extern "C" long mom_emu_allocations() __attribute__((weak));
// The per-step budgets' counters, from the same file (tests/cuda/cuda_budget_test.cpp, docs/cuda.md).
extern "C" long mom_emu_launches() __attribute__((weak));
extern "C" long mom_emu_memset_bytes() __attribute__((weak));
extern "C" long mom_emu_d2d_bytes() __attribute__((weak));
extern "C" long mom_emu_gemm_calls() __attribute__((weak));
extern "C" long mom_emu_gemm_flops() __attribute__((weak));
extern "C" long mom_emu_unaligned_gemms() __attribute__((weak));
extern "C" long mom_emu_staging_copies() __attribute__((weak));
extern "C" long mom_emu_staging_bytes() __attribute__((weak));
extern "C" long mom_emu_graph_launches() __attribute__((weak));  // cudaGraphLaunch calls (backend/cuda/graph.hpp)
// The emulated cuBLASLt's heuristic finds no algorithm while on (the backend's fallback paths; lt.hpp).
extern "C" void mom_emu_lt_refuse(int on) __attribute__((weak));
#define MOM_REQUIRE_EMU_COUNTERS()                                                               \
  do {                                                                                           \
    if (!mom_emu_host_waits || !mom_emu_allocations || !mom_emu_launches || !mom_emu_graph_launches) { \
      WARN("host waits are counted by the emulated runtime only (test_cuda_emu): skipped");      \
      return;                                                                                    \
    }                                                                                            \
  } while (0)

namespace mom::test {

// A snapshot of the emulated runtime's counters; a difference of two is what ran between them. Only under
// MOM_REQUIRE_EMU_COUNTERS (the symbols are absent in test_cuda).
struct EmuCounters {
  long host_waits = 0, allocations = 0, launches = 0, memset_bytes = 0, d2d_bytes = 0, gemm_calls = 0, gemm_flops = 0,
       unaligned_gemms = 0, staging_copies = 0, staging_bytes = 0, graph_launches = 0;
  static EmuCounters now() {
    return {mom_emu_host_waits(),   mom_emu_allocations(), mom_emu_launches(),        mom_emu_memset_bytes(),
            mom_emu_d2d_bytes(),    mom_emu_gemm_calls(),  mom_emu_gemm_flops(),      mom_emu_unaligned_gemms(),
            mom_emu_staging_copies(), mom_emu_staging_bytes(), mom_emu_graph_launches()};
  }
  EmuCounters operator-(const EmuCounters& o) const {
    return {host_waits - o.host_waits,         allocations - o.allocations,         launches - o.launches,
            memset_bytes - o.memset_bytes,     d2d_bytes - o.d2d_bytes,             gemm_calls - o.gemm_calls,
            gemm_flops - o.gemm_flops,         unaligned_gemms - o.unaligned_gemms, staging_copies - o.staging_copies,
            staging_bytes - o.staging_bytes,   graph_launches - o.graph_launches};
  }
};

// The counters of one call of step() on backend be (a warmed-up training step), and what one read of two
// scalars costs in host waits (the stream's synchronisation and the device error flag's copy): the one wait a
// Trainer step may have, its read of {gradient norm, loss}.
struct StepCounts {
  EmuCounters step;
  long one_read_waits = 0;
};
template <class T, class Step>
StepCounts measure_step(const cuda::Backend<T>& be, Step&& step) {
  auto scalars = be.template alloc<T>(2);
  T host[2];
  const long waits = mom_emu_host_waits();
  be.to_host(std::span<T>(host, 2), std::span<const T>(scalars.span()));
  StepCounts out;
  out.one_read_waits = mom_emu_host_waits() - waits;
  REQUIRE(out.one_read_waits > 0);
  const EmuCounters before = EmuCounters::now();
  step();
  out.step = EmuCounters::now() - before;
  return out;
}

// The next sync throws the index error a kernel recorded (its text contains `what`); the sync after it passes (the
// error was consumed).
template <class T>
void require_device_error(const cuda::Backend<T>& be, const std::string& what) {
  try {
    be.sync();
    FAIL("no device error was raised; expected one with: " << what);
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::Contains(what));
  }
  be.sync();
}

}  // namespace mom::test

// Skips the rest of a test case (one warning line) when there is no GPU or no driver.
#define MOM_REQUIRE_GPU()                                \
  do {                                                   \
    if (!::mom::test::gpu_available()) {                 \
      WARN("no CUDA device: skipped");                   \
      return;                                            \
    }                                                    \
  } while (0)

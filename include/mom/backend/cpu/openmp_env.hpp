#pragma once
// OpenMP threads when another process is busy on the machine.
//
// libgomp lets a thread waiting at a barrier spin for up to GOMP_SPINCOUNT iterations (300,000 by
// default) before it sleeps. When another process keeps a core busy, one of our threads is
// descheduled and the other spins away its time slices at every barrier. Measured on the project's
// 2-core machines (bench_train_step --under-load, dense 8-layer step, bench/RESULTS.md): with one core
// kept busy, 2 threads took 1222 ms against 1017 ms for 1 thread with the default spinning (AMD EPYC),
// and 2 / 1 thread was 0.96-1.04 with GOMP_SPINCOUNT=10000, 1.03-1.12 with 20000 (Intel Xeon, three
// rounds each). Too short a spin costs on a quiet machine: a worker that sleeps between two parallel
// regions pays a wake-up at the next, and a routed step opens many small regions. With 1000 (this
// value until the thirty-fourth session) the quiet dense step took ~4% longer than with 10000 and
// MoEUT's non-shared σ-MoE step ~7% longer (8,700-10,600 context switches a run against 700-1,000).
// So a spin of 10,000 iterations: 2 threads within 10% of 1 under load, and few wake-ups when quiet.
//
// The runtime reads these variables when it is loaded, before main runs, so a program can only set
// them for itself by re-executing itself. limit_openmp_spinning(argv), first thing in main, does that
// (same arguments, /proc/self/exe) with GOMP_SPINCOUNT=10000, unless the environment already says how
// OpenMP threads should wait (OMP_WAIT_POLICY or GOMP_SPINCOUNT set: the user's choice wins). It
// returns without re-executing on other systems or if exec fails. mom-train, mom-sample and the
// benches call it; a library user may call it in their main or set the variable themselves.
#include <cstdlib>

#if defined(__linux__)
#include <unistd.h>
#endif

namespace mom::cpu {

inline constexpr const char* kOpenmpSpinCount = "10000";

inline void limit_openmp_spinning(char** argv) {
#if defined(__linux__)
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) return;
  if (::setenv("GOMP_SPINCOUNT", kOpenmpSpinCount, 1) != 0) return;
  ::execv("/proc/self/exe", argv);
  ::unsetenv("GOMP_SPINCOUNT");  // exec failed: run on as we are
#else
  (void)argv;
#endif
}

}  // namespace mom::cpu

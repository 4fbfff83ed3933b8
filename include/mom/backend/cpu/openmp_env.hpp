#pragma once
// OpenMP threads when another process is busy on the machine.
//
// libgomp lets a thread waiting at a barrier spin for up to GOMP_SPINCOUNT iterations (300,000 by
// default) before it sleeps. When another process keeps a core busy, one of our threads is
// descheduled and the other spins away its time slices at every barrier. Measured on the project's
// 2-core machine (bench_train_step --under-load, dense 8-layer step, bench/RESULTS.md): with one core
// kept busy, 2 threads took 1222 ms against 1017 ms for 1 thread (default spinning), 977 ms with
// GOMP_SPINCOUNT=1000 and 995 ms with OMP_WAIT_POLICY=passive; on a quiet machine 2 threads took
// 539 ms, 553 ms with GOMP_SPINCOUNT=1000 and 577 ms passive. So a short spin keeps two threads at the
// speed of one under load, for ~2.5% when the machine is quiet.
//
// The runtime reads these variables when it is loaded, before main runs, so a program can only set
// them for itself by re-executing itself. limit_openmp_spinning(argv), first thing in main, does that
// (same arguments, /proc/self/exe) with GOMP_SPINCOUNT=1000, unless the environment already says how
// OpenMP threads should wait (OMP_WAIT_POLICY or GOMP_SPINCOUNT set: the user's choice wins). It
// returns without re-executing on other systems or if exec fails. mom-train, mom-sample and the
// benches call it; a library user may call it in their main or set the variable themselves.
#include <cstdlib>

#if defined(__linux__)
#include <unistd.h>
#endif

namespace mom::cpu {

inline constexpr const char* kOpenmpSpinCount = "1000";

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

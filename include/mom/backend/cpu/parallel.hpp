#pragma once
// Deterministic parallel reductions. OpenMP's reduction clause (and a critical section) combine
// the threads' partial results in the order the threads finish, so the last bits of a loss, a
// gradient norm or a LayerNorm weight gradient could change from run to run. Here chunk t of
// [0, n) (static, equal split) goes to thread t and partials are combined in chunk order: the
// result is bit-identical for a given thread count, which bit-identical resume relies on.
#include <omp.h>

#include <memory>
#include <vector>

#include "mom/core/tensor.hpp"

namespace mom::cpu::detail {

// Threads a region with this `parallel` condition will use (1 inside an enclosing region).
inline int region_threads(bool parallel) { return parallel && !omp_in_parallel() ? omp_get_max_threads() : 1; }

// Per-calling-thread scratch for the partial results, grown once (no allocation per call after
// warm-up). Returned as a pointer so worker threads write the caller's buffer, not their own.
template <class Acc>
Acc* partial_buffer(std::size_t n) {
  thread_local std::vector<Acc> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

// This thread's scratch buffer number Slot of kernel Owner: at least n elements of T, 64-byte
// aligned, grown once and reused (no allocation after warm-up). Aligned on every thread because
// Eigen's small products peel their vector loops by address alignment: a buffer aligned
// differently on another thread would make a result depend on which thread computed it.
template <class T, class Owner, int Slot>
T* thread_scratch(std::size_t n) {
  constexpr std::size_t align = 64;
  thread_local std::vector<T> buf;
  const std::size_t need = n + align / sizeof(T);
  if (buf.size() < need) buf.resize(need);
  void* p = buf.data();
  std::size_t space = buf.size() * sizeof(T);
  return static_cast<T*>(std::align(align, sizeof(T), p, space));
}

// Σ over chunks of chunk_sum(begin, end), chunks combined in order.
template <class Acc, class ChunkSum>
Acc ordered_sum(index_t n, bool parallel, ChunkSum&& chunk_sum) {
  const int nt = region_threads(parallel);
  if (nt == 1) return chunk_sum(index_t(0), n);
  Acc* partial = partial_buffer<Acc>(static_cast<std::size_t>(nt));
  for (int t = 0; t < nt; ++t) partial[t] = Acc{};  // a chunk the runtime gave no thread adds 0
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num(), m = omp_get_num_threads();
    partial[t] = chunk_sum(n * t / m, n * (t + 1) / m);
  }
  Acc total = partial[0];
  for (int t = 1; t < nt; ++t) total += partial[t];
  return total;
}

}  // namespace mom::cpu::detail

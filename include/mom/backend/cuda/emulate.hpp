#pragma once
// CPU emulation of the few CUDA device features the kernels in kernels.cuh use, so that the very
// same kernel source runs (slowly) on a machine without a GPU: compile kernels.cuh with a host
// compiler and MOM_CUDA_EMULATE defined. A test facility, not a backend: tests/cuda builds
// test_cuda_emu with it (plus host stand-ins for the CUDA runtime and cublasGemmEx), which runs
// the cross-backend suite where no GPU exists.
//
// Model: a launch runs its blocks one after another; the blockDim threads of a block are real
// std::threads, so __syncthreads is a std::barrier, warp shuffles exchange through a per-warp slot
// array between two barriers, and __shared__ variables are function statics (one block at a time
// uses them). Atomics are std::atomic_ref. What it cannot show: races that only a real GPU's
// scheduling exposes, memory-model subtleties, resource limits (registers, shared memory size).
#if !defined(MOM_CUDA_EMULATE)
#error "mom/backend/cuda/emulate.hpp is only for builds with MOM_CUDA_EMULATE"
#endif

#include <atomic>
#include <barrier>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <cstring>
#include <memory>
#include <thread>
#include <type_traits>
#include <vector>

#include <cuda_runtime_api.h>

#undef __global__
#undef __device__
#undef __shared__
#define __global__
#define __device__
#define __shared__ static

namespace mom::cuda::dev {

struct EmuBlock {
  std::barrier<> block;
  std::vector<std::unique_ptr<std::barrier<>>> warps;
  std::vector<unsigned long long> slots;  // one 8-byte shuffle slot per thread
  explicit EmuBlock(unsigned n) : block(n), slots(n) {
    for (unsigned w = 0; w * 32 < n; ++w) warps.push_back(std::make_unique<std::barrier<>>(std::min(32u, n - w * 32)));
  }
};

inline thread_local uint3 threadIdx{};
inline thread_local uint3 blockIdx{};
inline thread_local dim3 blockDim{};
inline thread_local dim3 gridDim{};
inline thread_local EmuBlock* emu_block = nullptr;

inline void __syncthreads() { emu_block->block.arrive_and_wait(); }

template <class T>
T __shfl_xor_sync(unsigned, T v, int lane_mask) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>);
  auto& warp = *emu_block->warps[threadIdx.x / 32];
  std::memcpy(&emu_block->slots[threadIdx.x], &v, sizeof(T));
  warp.arrive_and_wait();
  T out;
  std::memcpy(&out, &emu_block->slots[(threadIdx.x & ~31u) | ((threadIdx.x & 31u) ^ unsigned(lane_mask))], sizeof(T));
  warp.arrive_and_wait();
  return out;
}

template <class T>
T atomicAdd(T* p, T v) {
  return std::atomic_ref<T>(*p).fetch_add(v);
}
inline int atomicCAS(int* p, int expected, int desired) {
  std::atomic_ref<int>(*p).compare_exchange_strong(expected, desired);
  return expected;  // the old value (compare_exchange writes it back on failure)
}

template <class A>
A min(A a, A b) {
  return b < a ? b : a;
}
template <class A>
A max(A a, A b) {
  return a < b ? b : a;
}

// Persistent worker threads (created on first need, reused by every launch: creating a thread
// per emulated GPU thread per launch would dominate the run time).
class EmuPool {
 public:
  static EmuPool& get() {
    static EmuPool* pool = new EmuPool;  // leaked on purpose: workers sleep until the process ends
    return *pool;
  }
  // Runs job(t) for t in [0, n) on n workers; returns when all have finished.
  void run(unsigned n, const std::function<void(unsigned)>& job) {
    std::unique_lock lock(mu_);
    while (workers_.size() < n) {
      const unsigned id = static_cast<unsigned>(workers_.size());
      workers_.emplace_back([this, id] { work(id); });
      workers_.back().detach();
    }
    job_ = &job;
    active_ = n;
    remaining_ = n;
    ++generation_;
    start_.notify_all();
    done_.wait(lock, [&] { return remaining_ == 0; });
    job_ = nullptr;
  }

 private:
  void work(unsigned id) {
    std::uint64_t seen = 0;
    std::unique_lock lock(mu_);
    for (;;) {
      start_.wait(lock, [&] { return generation_ != seen; });
      seen = generation_;
      if (id >= active_) continue;
      const auto* job = job_;
      lock.unlock();
      (*job)(id);
      lock.lock();
      if (--remaining_ == 0) done_.notify_one();
    }
  }
  std::mutex mu_;
  std::condition_variable start_, done_;
  std::vector<std::thread> workers_;
  const std::function<void(unsigned)>* job_ = nullptr;
  unsigned active_ = 0, remaining_ = 0;
  std::uint64_t generation_ = 0;
};

// Runs body() as kernel<<<grid, block>>>: the block's threads step through the blocks in order;
// a barrier between blocks installs fresh per-block barriers.
template <class F>
void emulate_launch(dim3 grid, dim3 block, F&& body) {
  const unsigned n = block.x * block.y * block.z;
  const unsigned total = grid.x * grid.y * grid.z;
  auto state = std::make_unique<EmuBlock>(n);
  std::barrier between(static_cast<std::ptrdiff_t>(n), [&]() noexcept { state = std::make_unique<EmuBlock>(n); });
  EmuPool::get().run(n, [&](unsigned t) {
    threadIdx = uint3{t, 0, 0};
    blockDim = block;
    gridDim = grid;
    for (unsigned b = 0; b < total; ++b) {
      blockIdx = uint3{b % grid.x, (b / grid.x) % grid.y, b / (grid.x * grid.y)};
      emu_block = state.get();
      body();
      // A finished thread no longer counts at barriers (as an exited GPU thread).
      emu_block->warps[t / 32]->arrive_and_drop();
      emu_block->block.arrive_and_drop();
      between.arrive_and_wait();
    }
  });
}

}  // namespace mom::cuda::dev

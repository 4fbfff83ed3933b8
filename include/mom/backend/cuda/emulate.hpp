#pragma once
// CPU emulation of the few CUDA device features the kernels in kernels/*.cuh use, so that the very
// same kernel source runs (slowly) on a machine without a GPU: compile mom_cuda.cu with a host
// compiler and MOM_CUDA_EMULATE defined. A test facility, not a backend: tests/cuda builds
// test_cuda_emu with it (plus host stand-ins for the CUDA runtime and cublasGemmEx), which runs
// the cross-backend suite where no GPU exists.
//
// Model: a launch runs its blocks one after another on the calling thread; the blockDim threads of
// a block are fibers (own stacks, switched at barriers), so __syncthreads and the warp shuffles (a
// per-warp slot array between two warp barriers) cost a context switch, not an OS thread wake-up.
// The fibers run round-robin in thread order, each until its next barrier or its end. A block starts on
// one runner fiber that plays its threads in that order, one after another, for as long as none reaches a
// barrier (an element-wise kernel: no switch per thread); at the first barrier the others get fibers of
// their own and the round-robin goes on from there. The order of execution is the same either way.
// __shared__ variables are function statics (one block at a time uses them). A thread that
// returns stops counting at barriers, as on a GPU; threads waiting at different barriers forever
// (divergent __syncthreads) abort the run with a message, as do launches past the device's limits
// (emu_check_launch) and misaligned 16-byte accesses (common.cuh's check_aligned16). What it cannot
// show: races that only a real GPU's scheduling exposes, memory-model subtleties, registers and static
// shared memory (nvcc reports those), performance.
#if !defined(MOM_CUDA_EMULATE)
#error "mom/backend/cuda/emulate.hpp is only for builds with MOM_CUDA_EMULATE"
#endif

#include <ucontext.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <type_traits>
#include <vector>

#include <cuda_runtime_api.h>

#undef __global__
#undef __device__
#undef __shared__
#define __global__
#define __device__
#define __shared__ static

// Counters of the emulated runtime (tests/cuda/emu/emu_runtime.cpp), read by the tests' per-step budgets
// (tests/cuda/cuda_budget_test.cpp): one call per launch, and one per bf16 staging conversion (to_bf16, with the
// fp32 bytes it reads). Outside the blocks' loops: a launch costs one increment.
extern "C" void mom_emu_note_launch() noexcept;
extern "C" void mom_emu_note_staging(std::size_t fp32_bytes) noexcept;
// Stream capture (CUDA graphs) in the emulated runtime: work enqueued on the stream runs now, or, while the stream
// is captured, is recorded (its arguments copied) for cudaGraphLaunch to run in order. The kernels' launches and
// the host stand-ins (the emulated group_by_module; the runtime's memsets, copies and GEMMs) enqueue through it.
bool mom_emu_capturing() noexcept;
void mom_emu_enqueue(std::function<void()> op);

namespace mom::cuda::dev {

// A barrier among fibers: the last arrival opens the next phase; the others yield until it opens.
struct EmuBarrier {
  unsigned expected = 0, arrived = 0;
  std::uint64_t phase = 0;
  void arrive_and_wait();
  void drop() {  // a finished thread: one fewer to wait for
    --expected;
    if (arrived > 0 && arrived == expected) {
      arrived = 0;
      ++phase;
    }
  }
};

// Context switch between fibers. On x86-64 a 12-instruction switch of the callee-saved registers
// (glibc's swapcontext also saves the signal mask: a system call per switch, 3x slower overall);
// elsewhere ucontext. The switch is a weak symbol: every translation unit that includes this header emits it
// (the kernels' one, and a test of the scheduler itself), and the linker keeps one.
#if defined(__x86_64__) && defined(__linux__) && !defined(__SANITIZE_ADDRESS__)  // ASan follows ucontext switches
#define MOM_EMU_FAST_SWITCH 1
extern "C" void mom_emu_switch(void** save_sp, void* load_sp);
asm(R"(
.text
.weak mom_emu_switch
.type mom_emu_switch,@function
mom_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size mom_emu_switch,.-mom_emu_switch
.section .note.GNU-stack,"",@progbits
.text
)");
#endif

struct EmuFiber {
#if defined(MOM_EMU_FAST_SWITCH)
  void* sp = nullptr;
#else
  ucontext_t context{};
#endif
  std::unique_ptr<char[]> stack;
  bool started = false;
  bool done = false;
  const EmuBarrier* waiting_on = nullptr;
  std::uint64_t wait_phase = 0;
};

struct EmuBlock {
  EmuBarrier block;
  std::vector<EmuBarrier> warps;
  std::vector<unsigned long long> slots;  // one 8-byte shuffle slot per thread
  std::vector<unsigned char> exchange;    // emu_warp_all's records: emu_record bytes per thread
  // Thread t has returned: its warp's and the block's barriers wait for one fewer.
  void drop_thread(unsigned t) {
    warps[t / 32].drop();
    block.drop();
  }
};

inline thread_local uint3 threadIdx{};
inline thread_local uint3 blockIdx{};
inline thread_local dim3 blockDim{};
inline thread_local dim3 gridDim{};

struct EmuScheduler {
  static constexpr std::size_t stack_bytes = 256 * 1024;
#if defined(MOM_EMU_FAST_SWITCH)
  void* main_sp = nullptr;
#else
  ucontext_t main{};
#endif
  std::vector<EmuFiber> fibers;  // grown to the largest block; each fiber lives for the process
  EmuFiber runner;               // plays a block's threads in order until one reaches a barrier
  unsigned runner_thread = 0;    // the thread it plays now
  bool in_order = true;          // no barrier reached yet in this block: the runner goes on to the next thread
  unsigned block_threads = 0;
  EmuFiber* current = nullptr;
  EmuBlock block;
  const std::function<void()>* body = nullptr;

  static EmuScheduler& get() {
    static thread_local EmuScheduler s;
    return s;
  }
  // Fiber -> scheduler.
  void yield() {
#if defined(MOM_EMU_FAST_SWITCH)
    mom_emu_switch(&current->sp, main_sp);
#else
    swapcontext(&current->context, &main);
#endif
  }
  // Scheduler -> fiber f (starting it at entry on first use).
  void resume(EmuFiber& f, void (*entry)() = &EmuScheduler::entry) {
    current = &f;
    if (!f.started) {
      f.started = true;
      if (!f.stack) f.stack = std::make_unique<char[]>(stack_bytes);
#if defined(MOM_EMU_FAST_SWITCH)
      // Initial frame: six zeroed callee-saved registers, then entry as the return address,
      // placed so that entry starts with the stack aligned as after a call.
      auto* top = reinterpret_cast<void**>(
          (reinterpret_cast<std::uintptr_t>(f.stack.get()) + stack_bytes) & ~std::uintptr_t(15));
      top[-1] = nullptr;
      top[-2] = reinterpret_cast<void*>(entry);
      for (int r = 3; r <= 8; ++r) top[-r] = nullptr;
      f.sp = top - 8;
#else
      getcontext(&f.context);
      f.context.uc_stack.ss_sp = f.stack.get();
      f.context.uc_stack.ss_size = stack_bytes;
      f.context.uc_link = nullptr;
      makecontext(&f.context, entry, 0);
#endif
    }
#if defined(MOM_EMU_FAST_SWITCH)
    mom_emu_switch(&main_sp, f.sp);
#else
    swapcontext(&main, &f.context);
#endif
  }

  // A fiber runs the current kernel body once per block, then parks until the next block.
  static void entry() {
    EmuScheduler& s = get();
    for (;;) {
      (*s.body)();
      s.current->done = true;
      s.block.drop_thread(threadIdx.x);
      s.yield();
    }
  }

  // The runner: threads 0, 1, ... of each block in turn, each to its end, while in_order holds; once a
  // barrier has stopped it (run_block then clears in_order), it finishes only the thread it plays.
  static void runner_entry() {
    EmuScheduler& s = get();
    for (;;) {
      for (unsigned t = 0; t < s.block_threads; ++t) {
        threadIdx = uint3{t, 0, 0};
        s.runner_thread = t;
        (*s.body)();
        s.block.drop_thread(t);
        if (!s.in_order) break;
      }
      s.runner.done = true;
      s.yield();
    }
  }

  // Runs body on n threads (one block) until all return: on the runner while no thread reaches a barrier,
  // then on fibers, round-robin, from the thread after the one the barrier stopped.
  void run_block(unsigned n) {
    block.block = EmuBarrier{n};
    block.warps.assign((n + 31) / 32, EmuBarrier{});
    for (unsigned w = 0; w * 32 < n; ++w) block.warps[w].expected = std::min(32u, n - w * 32);
    block.slots.assign(n, 0);
    block_threads = n;
    in_order = true;
    runner.done = false;
    runner.waiting_on = nullptr;
    resume(runner, &EmuScheduler::runner_entry);
    if (runner.done) return;  // no thread reached a barrier
    in_order = false;
    const unsigned first = runner_thread;  // waits at a barrier on the runner; 0 .. first - 1 have ended
    if (fibers.size() < n) fibers.resize(n);
    for (unsigned t = first + 1; t < n; ++t) {
      fibers[t].done = false;
      fibers[t].waiting_on = nullptr;
    }
    for (unsigned from = first + 1;; from = first) {
      bool all_done = true, progress = false;
      for (unsigned t = from; t < n; ++t) {
        EmuFiber& f = t == first ? runner : fibers[t];
        if (f.done) continue;
        all_done = false;
        if (f.waiting_on && f.waiting_on->phase == f.wait_phase) continue;  // still blocked
        f.waiting_on = nullptr;
        threadIdx = uint3{t, 0, 0};
        resume(f);
        progress = true;
      }
      if (all_done && from == first) return;
      if (!progress && from == first) {
        std::fprintf(stderr, "mom CUDA emulation: deadlock in block (%u, %u): threads wait at different barriers\n",
                     blockIdx.x, blockIdx.y);
        std::abort();
      }
    }
  }
};

inline void EmuBarrier::arrive_and_wait() {
  if (++arrived == expected) {
    arrived = 0;
    ++phase;
    return;
  }
  EmuScheduler& s = EmuScheduler::get();
  s.current->waiting_on = this;
  s.current->wait_phase = phase;
  s.yield();
}

inline void __syncthreads() { EmuScheduler::get().block.block.arrive_and_wait(); }
// Every lane of the calling thread's warp must reach it (as the full-mask __syncwarp on a GPU).
inline void __syncwarp(unsigned = 0xffffffffu) {
  EmuBlock& b = EmuScheduler::get().block;
  b.warps[threadIdx.x / 32].arrive_and_wait();
}

template <class T>
T __shfl_xor_sync(unsigned, T v, int lane_mask) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>);
  EmuBlock& b = EmuScheduler::get().block;
  const unsigned t = threadIdx.x;
  EmuBarrier& warp = b.warps[t / 32];
  std::memcpy(&b.slots[t], &v, sizeof(T));
  warp.arrive_and_wait();
  T out;
  std::memcpy(&out, &b.slots[(t & ~31u) | ((t & 31u) ^ unsigned(lane_mask))], sizeof(T));
  warp.arrive_and_wait();
  return out;
}

// Every lane of the calling thread's warp gets every lane's v (all[l] = lane l's): the emulation's stand-in for
// the warp-collective instructions whose registers cross lanes (mma.sync, ldmatrix: kernels/mma.cuh).
// One record a thread at a fixed stride: warps exchanging records of different types at the same time (one in an
// ldmatrix, another in an mma) do not overlap.
inline constexpr std::size_t emu_record = 64;
template <class T, std::size_t N>
void emu_warp_all(const T& v, T (&all)[N]) {
  static_assert(N == 32 && std::is_trivially_copyable_v<T> && sizeof(T) <= emu_record);
  EmuBlock& b = EmuScheduler::get().block;
  const unsigned t = threadIdx.x, w0 = t & ~31u;
  EmuBarrier& warp = b.warps[t / 32];
  const std::size_t need = std::size_t(blockDim.x) * blockDim.y * blockDim.z * emu_record;
  if (b.exchange.size() < need) b.exchange.resize(need);  // keeps what other lanes wrote
  std::memcpy(b.exchange.data() + t * emu_record, &v, sizeof(T));
  warp.arrive_and_wait();
  for (unsigned l = 0; l < 32; ++l) std::memcpy(&all[l], b.exchange.data() + (w0 + l) * emu_record, sizeof(T));
  warp.arrive_and_wait();
}

template <class T>
T atomicAdd(T* p, T v) {
  const T old = *p;  // one OS thread runs every fiber: plain read-modify-write is atomic here
  *p = old + v;
  return old;
}
inline int atomicCAS(int* p, int expected, int desired) {
  const int old = *p;
  if (old == expected) *p = desired;
  return old;
}

template <class A>
A min(A a, A b) {
  return b < a ? b : a;
}
template <class A>
A max(A a, A b) {
  return a < b ? b : a;
}

// Dynamic shared memory (kernel<<<grid, block, bytes>>>'s extern __shared__ array): one buffer,
// sized by the launch, shared by the block's fibers; kernels reach it through dynamic_smem().
inline thread_local std::vector<std::max_align_t> emu_dynamic_smem;

// Runs fn() as kernel<<<grid, block, smem_bytes>>>: blocks in order, each as blockDim fibers.
inline void emulate_run(dim3 grid, dim3 block, const std::function<void()>& fn, std::size_t smem_bytes) {
  EmuScheduler& s = EmuScheduler::get();
  emu_dynamic_smem.assign((smem_bytes + sizeof(std::max_align_t) - 1) / sizeof(std::max_align_t), std::max_align_t{});
  s.body = &fn;
  blockDim = block;
  gridDim = grid;
  const unsigned n = block.x * block.y * block.z;
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        blockIdx = uint3{bx, by, bz};
        s.run_block(n);
      }
  s.body = nullptr;
}

// kernel<<<grid, block, smem_bytes>>>: runs body() now, or (a stream being captured) records it to run when the
// graph is launched; body then owns copies of the kernel's arguments (launch() passes them by value). A recorded
// launch is a node of its graph, not a launch.
// The launch limits of the largest GPU the backend targets (sm_90: 1024 threads a block, block.z <= 64, grid.y and
// grid.z <= 65535, 227 KB of dynamic shared memory a block after cudaFuncSetAttribute): a launch past them fails on
// the device ("invalid configuration argument", or "too many resources requested"), so the emulation refuses it too.
// (A kernel's static shared memory, at most 48 KB, is checked by nvcc.)
inline constexpr std::size_t emu_max_dynamic_smem = 227 * 1024;
inline void emu_check_launch(dim3 grid, dim3 block, std::size_t smem_bytes) {
  const unsigned long long threads = 1ull * block.x * block.y * block.z;
  if (threads == 0 || threads > 1024 || block.z > 64 || grid.y > 65535 || grid.z > 65535 || grid.x > 0x7fffffffu ||
      smem_bytes > emu_max_dynamic_smem) {
    std::fprintf(stderr,
                 "mom CUDA emulation: launch of grid (%u, %u, %u), block (%u, %u, %u), %zu bytes of dynamic shared "
                 "memory exceeds the device's limits\n",
                 grid.x, grid.y, grid.z, block.x, block.y, block.z, smem_bytes);
    std::abort();
  }
}

template <class F>
void emulate_launch(dim3 grid, dim3 block, F&& body, std::size_t smem_bytes = 0) {
  emu_check_launch(grid, block, smem_bytes);
  if (!mom_emu_capturing()) mom_emu_note_launch();
  mom_emu_enqueue([grid, block, smem_bytes, fn = std::function<void()>(std::forward<F>(body))] {
    emulate_run(grid, block, fn, smem_bytes);
  });
}

}  // namespace mom::cuda::dev

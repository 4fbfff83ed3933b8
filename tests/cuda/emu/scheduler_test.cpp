// The CPU emulation's scheduler (mom/backend/cuda/emulate.hpp), in test_cuda_emu only: a block's threads run
// round-robin in thread order, each until its next barrier or its end — first on one runner fiber, one thread
// after another, then (from the first barrier) on fibers of their own. These cases pin that order, the
// barriers' and shuffles' results after threads have ended, and the emulated grid-stride loop's coverage.
#define MOM_CUDA_EMULATE 1
#include "mom/backend/cuda/kernels/common.cuh"

#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

namespace {
using namespace mom::cuda::dev;
using mom::index_t;

std::string event(const char* what, unsigned t) { return std::string(what) + std::to_string(t); }
}  // namespace

TEST_CASE("emulation: threads without a barrier run one after another, block after block", "[emu]") {
  std::vector<std::string> trace;
  std::vector<int> out(3 * 70, -1);
  emulate_launch(dim3(3), dim3(70), [&] {
    trace.push_back(event("b", blockIdx.x) + event("t", threadIdx.x));
    out[blockIdx.x * 70 + threadIdx.x] = int(threadIdx.x) * 2;
  });
  std::vector<std::string> expected;
  for (unsigned b = 0; b < 3; ++b)
    for (unsigned t = 0; t < 70; ++t) expected.push_back(event("b", b) + event("t", t));
  CHECK(trace == expected);
  for (int i = 0; i < 3 * 70; ++i) CHECK(out[std::size_t(i)] == (i % 70) * 2);
}

TEST_CASE("emulation: after threads that ended, the first barrier hands over to round-robin fibers", "[emu]") {
  // Threads 0-4 end at once; the others write, meet at the barrier, and read a neighbour's value. Order of a
  // round-robin over fibers: 5 up to its barrier, 6 .. 63 up to theirs (63, the last to arrive, opens it and
  // goes on), then 5 .. 62 after it.
  constexpr unsigned n = 64, ended = 5;
  for (int block_run = 0; block_run < 2; ++block_run) {  // the runner and the fibers are reused by the next launch
    std::vector<std::string> trace;
    std::vector<int> shared(n, -1), read(n, -1);
    emulate_launch(dim3(1), dim3(n), [&] {
      const unsigned t = threadIdx.x;
      if (t < ended) return;
      shared[t] = int(t) * 10;
      trace.push_back(event("pre", t));
      __syncthreads();
      read[t] = shared[t + 1 < n ? t + 1 : ended];
      trace.push_back(event("post", t));
    });
    std::vector<std::string> expected;
    for (unsigned t = ended; t < n; ++t) expected.push_back(event("pre", t));
    expected.push_back(event("post", n - 1));
    for (unsigned t = ended; t < n - 1; ++t) expected.push_back(event("post", t));
    CHECK(trace == expected);
    for (unsigned t = ended; t < n; ++t) CHECK(read[t] == int(t + 1 < n ? t + 1 : ended) * 10);
  }
}

TEST_CASE("emulation: a block sum by warp shuffles and barriers (block_reduce), block after block", "[emu]") {
  constexpr unsigned n = 96;  // three warps
  std::vector<double> sums(4, 0);
  emulate_launch(dim3(4), dim3(n), [&] {
    const double v = double(blockIdx.x * 1000 + threadIdx.x);
    const double total = block_reduce<double>(v);
    if (threadIdx.x == 0) sums[blockIdx.x] = total;
  });
  for (unsigned b = 0; b < 4; ++b) CHECK(sums[b] == double(n) * b * 1000 + double(n * (n - 1) / 2));
}

TEST_CASE("emulation: the grid-stride loop visits every item once, in contiguous chunks", "[emu]") {
  for (const index_t n : {index_t(0), index_t(1), index_t(5), index_t(1023), index_t(1024), index_t(1025), index_t(5000)}) {
    std::vector<int> seen(std::size_t(n), 0);
    std::vector<index_t> order;
    emulate_launch(dim3(4), dim3(256), [&] {
      MOM_GRID_STRIDE(i, n) {
        ++seen[std::size_t(i)];
        order.push_back(i);
      }
    });
    INFO("n = " << n);
    CHECK(std::count(seen.begin(), seen.end(), 1) == n);
    std::vector<index_t> ascending(static_cast<std::size_t>(n));
    for (index_t i = 0; i < n; ++i) ascending[std::size_t(i)] = i;
    CHECK(order == ascending);  // threads in turn, each through its own chunk: one pass in memory order
  }
}

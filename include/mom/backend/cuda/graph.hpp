#pragma once
// CUDA graphs on the backend's stream: the ops a function enqueues, recorded once (stream capture) and
// replayed by one launch. infer::Decoder records its decode step so (one graph launch per token instead of
// about fifteen kernel launches per layer: bench/RESULTS.md, issue 28's decode target).
//
//   cuda::Graph g = be.record([&] { /* be's ops: enqueued, not run */ });
//   be.replay(g);   // runs them, in order, on the stream; again and again
//
// A graph holds its kernels' arguments as they were when recorded: the pointers, shapes and host scalars. What
// changes between replays must live in device memory the kernels read (the decoder's positions and tokens,
// copied in before each replay). The recording runs in the thread-local capture mode: a host wait, an
// allocation or a copy from pageable host memory inside the function fails, and record() throws mom::Error
// with the stream back to normal and nothing run (the caller then runs its ops directly).
#include <utility>

#include <cuda_runtime_api.h>

#include "mom/backend/cuda/check.hpp"
#include "mom/core/check.hpp"

namespace mom::cuda {

// An instantiated graph (cudaGraphExec_t): move-only, destroyed with the object.
class Graph {
 public:
  Graph() = default;
  explicit Graph(cudaGraphExec_t exec) : exec_(exec) {}
  Graph(Graph&& o) noexcept : exec_(std::exchange(o.exec_, nullptr)) {}
  Graph& operator=(Graph&& o) noexcept {
    if (this != &o) {
      reset();
      exec_ = std::exchange(o.exec_, nullptr);
    }
    return *this;
  }
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  ~Graph() { reset(); }

  explicit operator bool() const { return exec_ != nullptr; }
  cudaGraphExec_t get() const { return exec_; }
  void reset() noexcept {
    if (exec_) (void)cudaGraphExecDestroy(exec_);
    exec_ = nullptr;
  }

 private:
  cudaGraphExec_t exec_ = nullptr;
};

namespace detail {

// Records what f() enqueues on `stream` (cuBLAS and cuBLASLt calls included: their handles are bound to it).
template <class F>
Graph record_graph(cudaStream_t stream, F&& f) {
  MOM_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "record");
  // Ends the capture: its graph, or null when it failed (the error cleared: a failed capture is not sticky). The
  // stream is back to normal either way.
  const auto end = [stream](cudaError_t& e) {
    cudaGraph_t g = nullptr;
    e = cudaStreamEndCapture(stream, &g);
    if (e != cudaSuccess) {
      if (g) (void)cudaGraphDestroy(g);
      g = nullptr;
      (void)cudaGetLastError();
    }
    return g;
  };
  cudaError_t e = cudaSuccess;
  try {
    f();
  } catch (...) {
    if (cudaGraph_t g = end(e)) (void)cudaGraphDestroy(g);
    throw;
  }
  cudaGraph_t g = end(e);
  MOM_CUDA_CHECK(e, "record (a host wait, an allocation or a host copy among the recorded ops?)");
  cudaGraphExec_t exec = nullptr;
  e = cudaGraphInstantiate(&exec, g, 0);
  (void)cudaGraphDestroy(g);
  MOM_CUDA_CHECK(e, "record");
  return Graph(exec);
}

inline void replay_graph(cudaStream_t stream, const Graph& g) {
  MOM_CHECK(bool(g), "replay: an empty graph (record one first)");
  MOM_CUDA_CHECK(cudaGraphLaunch(g.get(), stream), "replay");
}

}  // namespace detail
}  // namespace mom::cuda

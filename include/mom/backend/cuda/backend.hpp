#pragma once
// mom::cuda::Backend<T>: the CUDA counterpart of mom::cpu::Backend<T>, with the same members over
// device memory. Module code is generic over the backend, so Model::make<cuda::Backend<float>>(seed)
// runs the same architecture on a GPU.
//
// - Memory: Buffer<U> (cudaMalloc, RAII, move-only); zero/fill/copy run on the backend's stream;
//   to_host / from_host / read cross the bus (to_host and read wait for the stream).
// - Ops: the same signatures and the same shape checks (same messages) as the CPU ops. GEMMs go
//   through cuBLAS (row-major via the transpose trick; float on TF32 tensor cores by default,
//   set_precision(Precision::BF16) for bf16 tensor cores with fp32 master weights, FP32 for none);
//   everything else is mom's own kernels (kernels/*.cuh), compiled into mom::cuda; the dense
//   attention of float at head dims 64 / 128 follows the same precision on tensor cores
//   (kernels/attention_tc.cuh).
// - Asynchrony: every op only enqueues work on the backend's stream; nothing inside a training step
//   waits for the GPU (grad_norm leaves the norm in device memory for adamw_step). The first host
//   synchronisation after a bad index (token id, target, gather/scatter index) throws its error.
// - Ownership: the stream, the cuBLAS and cuBLASLt handles and small device scratch belong to a shared context;
//   copies of a Backend share them (and their stream order).
//
// The backend in files by concern; this one keeps the Backend struct (context, precision, memory, sync):
//   ops.hpp            the ops of a dense transformer (detail::DenseOps<T>)
//   lt.hpp             cuBLASLt plans for the GEMMs with a fused epilogue (the linear forward's bias)
//   norm_ops.hpp       a LayerNorm and the linear reading it as one op pair (detail::NormOps<T>)
//   attention_ops.hpp  the causal attention and the output linear reading it as one op pair (detail::AttentionOps<T>)
//   mlp_ops.hpp        the FFN, its LayerNorm and MLP, as one op pair (detail::MlpOps<T>)
//   routed_ops.hpp     the ops of routed models: routing, dispatch, depth, grouped (detail::RoutedOps<T>)
//   staging.hpp        the bf16 GEMM staging and the dispatch scratch, grown only outside a step
//   weight_copies.hpp  the weights' bf16 copies, converted once a weight window (the Trainer's step)
//   device_errors.hpp  the index errors kernels record on the device, thrown at the next sync
//   graph.hpp          CUDA graphs: record / replay the ops a function enqueues (the decoder's step)
//
// This header is host C++: it compiles with g++ or clang++; only mom_cuda.cu needs nvcc.
#include <memory>
#include <span>
#include <type_traits>
#include <utility>

#include "mom/backend/backend_concept.hpp"
#include "mom/backend/cpu/optim.hpp"  // AdamWConfig (plain struct, no Eigen)
#include "mom/backend/cuda/buffer.hpp"
#include "mom/backend/cuda/check.hpp"
#include "mom/backend/cuda/depth_kernels.hpp"
#include "mom/backend/cuda/device_errors.hpp"
#include "mom/backend/cuda/graph.hpp"
#include "mom/backend/cuda/grouped_kernels.hpp"
#include "mom/backend/cuda/kernels.hpp"
#include "mom/backend/cuda/ops.hpp"
#include "mom/backend/cuda/routed_ops.hpp"
#include "mom/backend/cuda/staging.hpp"
#include "mom/core/check.hpp"
#include "mom/core/groups.hpp"
#include "mom/core/tensor.hpp"

namespace mom::cuda {

namespace detail {
inline void destroy_context(Context* c) noexcept {
  if (!c) return;
  (void)cudaSetDevice(c->device);
  if (c->stream) (void)cudaStreamSynchronize(c->stream);
  if (c->blas) (void)cublasDestroy(c->blas);
  delete c->lt_plans;
  delete c->weight_copies;
  if (c->lt) (void)cublasLtDestroy(c->lt);
  (void)cudaFree(c->workspace);
  if (c->stream) (void)cudaStreamDestroy(c->stream);
  (void)cudaFree(c->error);
  (void)cudaFree(c->partials);
  (void)cudaFree(c->entropy);
  (void)cudaFree(c->count);
  (void)cudaFree(c->cub_temp);
  (void)cudaFree(c->pair_ids);
  (void)cudaFree(c->counts);
  (void)cudaFree(c->sorted_keys);
  (void)cudaFree(c->bf16_stage);
  delete c;
}

// Creates the stream (blocking w.r.t. the legacy default stream, which Buffer's zero-fill uses), the cuBLAS
// handle bound to it, and the device scratch. Throws mom::Error without a usable GPU (what was created by
// then is released by destroy_context).
inline std::shared_ptr<Context> make_context(int device) {
  std::shared_ptr<Context> ctx(new Context{}, destroy_context);
  Context& c = *ctx;
  c.device = device;
  MOM_CUDA_CHECK(cudaSetDevice(device), "cuda::Backend");
  MOM_CUDA_CHECK(cudaStreamCreate(&c.stream), "cuda::Backend");
  MOM_CUBLAS_CHECK(cublasCreate(&c.blas), "cuda::Backend");
  MOM_CUBLAS_CHECK(cublasSetStream(c.blas, c.stream), "cuda::Backend");
  // cuBLASLt for the fused epilogues, with the workspace its Hopper kernels want (32 MiB to start; the split grouped
  // weight gradients' partial sums and the stick-breaking backward's table use it too: kernels.hpp, Context).
  MOM_CUBLAS_CHECK(cublasLtCreate(&c.lt), "cuda::Backend");
  c.workspace_bytes = std::size_t(32) << 20;
  MOM_CUDA_CHECK(cudaMalloc(&c.workspace, c.workspace_bytes), "cuda::Backend");
  c.lt_plans = new LtPlans;
  c.weight_copies = new WeightCopies;
  MOM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&c.error), 4 * sizeof(int)), "cuda::Backend");
  MOM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&c.partials), Context::reduce_blocks * sizeof(double)),
                 "cuda::Backend");
  MOM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&c.entropy), std::size_t(Context::entropy_partials) * sizeof(double)),
                 "cuda::Backend");
  MOM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&c.count), sizeof(int)), "cuda::Backend");
  MOM_CUDA_CHECK(cudaMemset(c.error, 0, 4 * sizeof(int)), "cuda::Backend");
  MOM_CUDA_CHECK(cudaDeviceSynchronize(), "cuda::Backend");
  return ctx;
}
}  // namespace detail

template <class T>
struct Backend : detail::RoutedOps<T> {
  using Base = detail::RoutedOps<T>;

  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "cuda::Backend<T>: T is float or double");
  using scalar = T;
  template <class U>
  using Buffer = cuda::Buffer<U>;
  // Page-locked host memory: from_host copies from it without a staging copy by the driver, and the host
  // goes on at once (the Trainer's token batches).
  template <class U>
  using HostBuffer = cuda::PinnedBuffer<U>;
  template <class U>
  using View = MatrixView<U>;
  using Trans = cuda::Trans;
  using AdamWConfig = cpu::AdamWConfig;
  using M = MatrixView<T>;
  using CM = MatrixView<const T>;
  using S = std::span<T>;
  using CS = std::span<const T>;
  using Tok = std::span<const token_t>;
  using PG = PerGroup<T>;
  using CPG = PerGroup<const T>;
  using K = Kernels<T>;
  using DK = DepthKernels<T>;
  using GK = GroupedKernels<T>;

  static constexpr const char* name = "cuda";
  // Backend memory is the GPU's: the host reads it through to_host.
  static constexpr bool host_memory = false;
  // Rows of vocabulary width (the logits) are laid out padded to a multiple of 64 elements (backend_concept.hpp,
  // row_align): cuBLAS runs its tensor-core kernels only on 16-byte aligned rows, and at GPT-2's 50257 columns the
  // LM head's three products otherwise fall back to Turing-era kernels (bench/RESULTS.md, tenth session's profile).
  static constexpr index_t row_align = logits_row_align;

  // Creates the backend's context on `device` (detail::make_context): throws mom::Error without a usable GPU.
  explicit Backend(int device = 0) : Base(detail::make_context(device)) {}

  // Precision of float GEMMs (kernels.hpp): TF32 by default; BF16 stages both operands as bf16
  // (fp32 master weights, fp32 accumulate and output); FP32 uses no tensor cores.
  void set_precision(Precision p) const { ctx_->precision = p; }
  Precision precision() const { return ctx_->precision; }
  // TF32 on (the default) or plain FP32.
  void set_tf32(bool on) const { ctx_->precision = on ? Precision::TF32 : Precision::FP32; }
  bool tf32() const { return ctx_->precision == Precision::TF32; }
  cudaStream_t stream() const { return ctx_->stream; }
  cublasHandle_t cublas() const { return ctx_->blas; }
  const Context& context() const { return *ctx_; }

  // Waits for every op enqueued so far; throws the first device-side index error, if any.
  void sync() const {
    MOM_CUDA_CHECK(cudaStreamSynchronize(ctx_->stream), "sync");
    check_device_errors(*ctx_);  // device_errors.hpp
  }

  // ---- memory --------------------------------------------------------------
  template <class U = T>
  Buffer<U> alloc(index_t n) const {
    MOM_CUDA_CHECK(cudaSetDevice(ctx_->device), "alloc");
    return Buffer<U>(n);
  }
  template <class U>
  HostBuffer<U> alloc_host(index_t n) const {
    MOM_CUDA_CHECK(cudaSetDevice(ctx_->device), "alloc_host");
    return HostBuffer<U>(n);
  }
  int device() const { return ctx_->device; }
  template <class U>
  void zero(std::span<U> s) const {
    if (!s.empty()) MOM_CUDA_CHECK(cudaMemsetAsync(s.data(), 0, s.size_bytes(), ctx_->stream), "zero");
  }
  void zero(M m) const { this->clear(m); }
  template <class U>
  void fill(std::span<U> s, U value) const {
    if (!s.empty()) cuda::fill<U>(*ctx_, s.data(), ssize(s), value);
  }
  template <class U>
  void copy(std::span<U> dst, std::span<const U> src) const {
    MOM_CHECK(dst.size() == src.size(), "copy: dst has ", dst.size(), " elements, src has ", src.size());
    if (!src.empty())
      MOM_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), src.size_bytes(), cudaMemcpyDefault, ctx_->stream), "copy");
  }
  template <class U>
  void copy(std::span<U> dst, std::span<U> src) const { copy(dst, std::span<const U>(src)); }
  // A matrix into one of the same shape, either of them strided (a column block of a wider matrix).
  void copy(M dst, CM src) const {
    MOM_CHECK(dst.rows == src.rows && dst.cols == src.cols, "copy: dst ", shape(dst), " and src ", shape(src), " differ");
    if (dst.rows == 0 || dst.cols == 0) return;
    MOM_CUDA_CHECK(cudaMemcpy2DAsync(dst.data, std::size_t(dst.ld) * sizeof(T), src.data, std::size_t(src.ld) * sizeof(T),
                                     std::size_t(dst.cols) * sizeof(T), std::size_t(dst.rows), cudaMemcpyDefault,
                                     ctx_->stream),
                   "copy");
  }
  // Device -> host: waits for the stream (and reports device-side index errors).
  template <class U>
  void to_host(std::span<U> host, std::span<const U> dev) const {
    MOM_CHECK(host.size() == dev.size(), "to_host: host has ", host.size(), " elements, dev has ", dev.size());
    if (!dev.empty())
      MOM_CUDA_CHECK(cudaMemcpyAsync(host.data(), dev.data(), dev.size_bytes(), cudaMemcpyDefault, ctx_->stream),
                     "to_host");
    sync();
  }
  template <class U>
  void to_host(std::span<U> host, std::span<U> dev) const { to_host(host, std::span<const U>(dev)); }
  // Host -> device. From pageable memory the call returns once the host data has been staged,
  // so the host buffer may be reused at once; the stream is not waited for.
  template <class U>
  void from_host(std::span<U> dev, std::span<const U> host) const {
    MOM_CHECK(dev.size() == host.size(), "from_host: dev has ", dev.size(), " elements, host has ", host.size());
    if (!host.empty())
      MOM_CUDA_CHECK(cudaMemcpyAsync(dev.data(), host.data(), host.size_bytes(), cudaMemcpyDefault, ctx_->stream),
                     "from_host");
  }
  template <class U>
  void from_host(std::span<U> dev, std::span<U> host) const { from_host(dev, std::span<const U>(host)); }
  // One scalar back to the host (the loss, a norm): waits for the stream.
  template <class U>
  U read(const U* p) const {
    U value{};
    MOM_CUDA_CHECK(cudaMemcpyAsync(&value, p, sizeof(U), cudaMemcpyDefault, ctx_->stream), "read");
    sync();
    return value;
  }

  // ---- staging and dispatch scratch (staging.hpp) ----------------------------------------------
  // Sizes the bf16 staging of Precision::BF16 GEMMs for operands of up to `elements` elements together
  // (A and B of one GEMM), so that no later GEMM allocates. The first GEMMs of a run grow it
  // otherwise (stream-synchronising cudaFree + cudaMalloc), after which a step of the same shapes
  // never allocates; call it outside the step to size it up front.
  void reserve_bf16_staging(index_t elements) const { cuda::reserve_bf16_staging(*ctx_, elements); }
  // Sizes group_by_module's CUB temp storage and scratch for up to n_pairs pairs and n_modules
  // modules, so that no later call allocates (token dispatch: docs/design.md, "Data and the hot path").
  // Call once, outside the training step.
  void reserve_dispatch(index_t n_pairs, index_t n_modules) const { cuda::reserve_dispatch(*ctx_, n_pairs, n_modules); }
  // Grows the workspace of the GEMMs and the stick-breaking backward (32 MiB to start) to at least `bytes`.
  void reserve_workspace(std::size_t bytes) const { cuda::reserve_workspace(*ctx_, bytes); }

  // ---- the weights' bf16 copies (weight_copies.hpp; backend_concept.hpp, KeepsWeightCopies) ---------------------
  // From begin_weight_copies(weights) to end_weight_copies() the caller writes nothing in `weights` (a model's
  // parameter block): under BF16 a product converts an operand lying in it once, into a copy every later product of the
  // window reads. A window opened while another is open replaces it; outside a window nothing is copied. (A graph
  // recorded inside a window would hold the copies as they were: infer::Decoder records outside any.)
  void begin_weight_copies(CS weights) const {
    if constexpr (std::is_same_v<T, float>) ctx_->weight_copies->open(weights.data(), weights.size());
  }
  void end_weight_copies() const { ctx_->weight_copies->close(); }
  // Copies converted so far (one per weight and window under BF16): what tests count.
  index_t weight_copy_conversions() const { return ctx_->weight_copies->conversions; }
  // Changes whenever one of the buffers above is replaced by a larger one: a graph recorded before reads the old
  // buffers, so infer::Decoder records its step again.
  index_t scratch_generation() const { return ctx_->scratch_grows; }

  // ---- CUDA graphs (graph.hpp) ------------------------------------------------------------------
  // record(f): the ops f() enqueues on this backend, recorded as one graph and not run; throws mom::Error (nothing
  // run, the stream usable) if f waits for the GPU, allocates or copies from host memory. replay(g): enqueues
  // them, one launch. Run f's ops once before recording them, so that what grows on first use (the bf16
  // staging, cuBLASLt's plans, the dispatch scratch) is in place.
  using Graph = cuda::Graph;
  template <class F>
  Graph record(F&& f) const {
    MOM_CUDA_CHECK(cudaSetDevice(ctx_->device), "record");
    return detail::record_graph(ctx_->stream, std::forward<F>(f));
  }
  void replay(const Graph& g) const { detail::replay_graph(ctx_->stream, g); }

 private:
  using Base::ctx_;
};

}  // namespace mom::cuda

static_assert(mom::Backend<mom::cuda::Backend<float>> && mom::Backend<mom::cuda::Backend<double>>,
              "cuda::Backend must satisfy mom::Backend (backend/backend_concept.hpp)");

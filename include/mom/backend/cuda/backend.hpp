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
// - Ownership: the stream, the cuBLAS handle and small device scratch belong to a shared context;
//   copies of a Backend share them (and their stream order).
//
// This header is host C++: it compiles with g++ or clang++; only mom_cuda.cu needs nvcc.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <type_traits>
#include <span>
#include <vector>

#include "mom/backend/backend_concept.hpp"
#include "mom/backend/cpu/optim.hpp"  // AdamWConfig (plain struct, no Eigen)
#include "mom/backend/cuda/buffer.hpp"
#include "mom/backend/cuda/check.hpp"
#include "mom/backend/cuda/depth_kernels.hpp"
#include "mom/backend/cuda/grouped_kernels.hpp"
#include "mom/backend/cuda/kernels.hpp"
#include "mom/backend/shape_checks.hpp"
#include "mom/core/check.hpp"
#include "mom/core/groups.hpp"
#include "mom/core/tensor.hpp"

namespace mom::cuda {

enum class Trans : bool { N = false, T = true };

namespace detail {
inline void destroy_context(Context* c) noexcept {
  if (!c) return;
  (void)cudaSetDevice(c->device);
  if (c->stream) (void)cudaStreamSynchronize(c->stream);
  if (c->blas) (void)cublasDestroy(c->blas);
  if (c->stream) (void)cudaStreamDestroy(c->stream);
  (void)cudaFree(c->error);
  (void)cudaFree(c->partials);
  (void)cudaFree(c->count);
  (void)cudaFree(c->cub_temp);
  (void)cudaFree(c->pair_ids);
  (void)cudaFree(c->counts);
  (void)cudaFree(c->sorted_keys);
  (void)cudaFree(c->bf16_stage);
  delete c;
}
}  // namespace detail

template <class T>
struct Backend {
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

  static constexpr const char* name = "cuda";
  // Backend memory is the GPU's: the host reads it through to_host.
  static constexpr bool host_memory = false;

  // Creates the stream (blocking w.r.t. the legacy default stream, which Buffer's zero-fill uses),
  // the cuBLAS handle bound to it, and the device scratch. Throws mom::Error without a usable GPU.
  explicit Backend(int device = 0) : ctx_(new Context{}, detail::destroy_context) {
    Context& c = *ctx_;
    c.device = device;
    MOM_CUDA_CHECK(cudaSetDevice(device), "cuda::Backend");
    MOM_CUDA_CHECK(cudaStreamCreate(&c.stream), "cuda::Backend");
    MOM_CUBLAS_CHECK(cublasCreate(&c.blas), "cuda::Backend");
    MOM_CUBLAS_CHECK(cublasSetStream(c.blas, c.stream), "cuda::Backend");
    MOM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&c.error), 4 * sizeof(int)), "cuda::Backend");
    MOM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&c.partials), Context::reduce_blocks * sizeof(double)),
                   "cuda::Backend");
    MOM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&c.count), sizeof(int)), "cuda::Backend");
    MOM_CUDA_CHECK(cudaMemset(c.error, 0, 4 * sizeof(int)), "cuda::Backend");
    MOM_CUDA_CHECK(cudaDeviceSynchronize(), "cuda::Backend");
  }

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
    check_device_errors();
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
  void zero(M m) const {
    if (m.rows == 0 || m.cols == 0) return;
    MOM_CUDA_CHECK(cudaMemset2DAsync(m.data, static_cast<std::size_t>(m.ld) * sizeof(T), 0,
                                     static_cast<std::size_t>(m.cols) * sizeof(T), static_cast<std::size_t>(m.rows),
                                     ctx_->stream),
                   "zero");
  }
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
  // ---- ops -----------------------------------------------------------------
  // C = alpha·op(A)·op(B) + beta·C on row-major views. cuBLAS is column-major, and a row-major
  // [r×c] matrix with stride ld is the column-major [c×r] matrix with leading dimension ld, so
  // C = op(A)·op(B) is computed as Cᵀ = op(B)ᵀ·op(A)ᵀ with the operands swapped.
  void gemm(M C, CM A, Trans ta, CM B, Trans tb, T alpha = T(1), T beta = T(0)) const {
    checks::gemm_shapes<T>(C, A, ta == Trans::T, B, tb == Trans::T);
    const index_t m = ta == Trans::N ? A.rows : A.cols;
    const index_t k = ta == Trans::N ? A.cols : A.rows;
    const index_t n = tb == Trans::N ? B.cols : B.rows;
    if (m == 0 || n == 0) return;
    const auto op = [](Trans t) { return t == Trans::T ? CUBLAS_OP_T : CUBLAS_OP_N; };
    const auto ld = [](index_t x) { return static_cast<int>(std::max<index_t>(x, 1)); };
    if constexpr (std::is_same_v<T, float>) {
      if (ctx_->precision == Precision::BF16 && k > 0) {
        // Both operands staged densely as bf16 (one conversion pass each), then bf16 tensor cores with
        // fp32 accumulation into the fp32 C (alpha, beta as usual).
        reserve_bf16_staging(A.rows * A.cols + B.rows * B.cols);
        std::uint16_t* a16 = ctx_->bf16_stage;
        std::uint16_t* b16 = ctx_->bf16_stage + A.rows * A.cols;
        to_bf16(*ctx_, a16, A);
        to_bf16(*ctx_, b16, B);
        MOM_CUBLAS_CHECK(cublasGemmEx(ctx_->blas, op(tb), op(ta), static_cast<int>(n), static_cast<int>(m),
                                      static_cast<int>(k), &alpha, b16, CUDA_R_16BF, ld(B.cols), a16, CUDA_R_16BF,
                                      ld(A.cols), &beta, C.data, CUDA_R_32F, ld(C.ld), CUBLAS_COMPUTE_32F,
                                      CUBLAS_GEMM_DEFAULT),
                         "gemm (bf16)");
        return;
      }
    }
    constexpr cudaDataType_t type = std::is_same_v<T, float> ? CUDA_R_32F : CUDA_R_64F;
    const cublasComputeType_t compute = std::is_same_v<T, double>               ? CUBLAS_COMPUTE_64F
                                        : ctx_->precision == Precision::FP32 ? CUBLAS_COMPUTE_32F
                                                                              : CUBLAS_COMPUTE_32F_FAST_TF32;
    MOM_CUBLAS_CHECK(cublasGemmEx(ctx_->blas, op(tb), op(ta), static_cast<int>(n), static_cast<int>(m),
                                  static_cast<int>(k), &alpha, B.data, type, ld(B.ld), A.data, type, ld(A.ld), &beta,
                                  C.data, type, ld(C.ld), compute, CUBLAS_GEMM_DEFAULT),
                     "gemm");
  }

  // y = x·wᵀ + b: the bias is broadcast into y, then y += x·wᵀ (cuBLAS, beta = 1).
  void linear_forward(M y, CM x, CM w, CS b) const {
    checks::linear_forward_shapes<T>(y, x, w, b);
    if (b.empty()) return gemm(y, x, Trans::N, w, Trans::T);
    K::broadcast_rows(*ctx_, y, b.data());
    gemm(y, x, Trans::N, w, Trans::T, T(1), T(1));
  }
  // dx += dy·w, dw += dyᵀ·x, db += Σ_rows dy (each may be empty).
  void linear_backward(M dx, M dw, S db, CM dy, CM x, CM w) const {
    checks::linear_backward_shapes<T>(dx, dw, db, dy, x, w);
    if (!dx.empty()) gemm(dx, dy, Trans::N, w, Trans::N, T(1), T(1));
    if (!dw.empty()) gemm(dw, dy, Trans::T, x, Trans::N, T(1), T(1));
    if (!db.empty()) K::add_column_sums(*ctx_, db.data(), dy);
  }

  void embedding_forward(M out, Tok tokens, CM wte, CM wpe, index_t seq) const {
    check_embedding_shapes("embedding_forward", out, tokens, wte, wpe, seq);
    K::embedding_forward(*ctx_, out, tokens.data(), wte, wpe, seq);
  }
  // dwte[tokens[t]] += dout[t] (atomics: ids repeat), dwpe[t mod seq] += dout[t].
  void embedding_backward(M dwte, M dwpe, CM dout, Tok tokens, index_t seq) const {
    const CM wte = dwte.empty() ? CM(dout.data, std::numeric_limits<token_t>::max(), dout.cols) : CM(dwte);
    const CM wpe = dwpe.empty() ? CM(dout.data, seq, dout.cols) : CM(dwpe);
    check_embedding_shapes("embedding_backward", dout, tokens, wte, wpe, seq);
    K::embedding_backward(*ctx_, dwte, dwpe, dout, tokens.data(), seq, wte.rows);
  }

  void layernorm_forward(M out, S mean, S rstd, CM x, CS gamma, CS beta, T eps = T(1e-5)) const {
    checks::layernorm_forward_shapes<T>(out, mean, rstd, x, gamma, beta);
    K::layernorm_forward(*ctx_, out, mean.data(), rstd.data(), x, gamma.data(), beta.data(), eps);
  }
  void layernorm_backward(M dx, S dgamma, S dbeta, CM dout, CM x, CS mean, CS rstd, CS gamma) const {
    checks::layernorm_backward_shapes<T>(dx, dgamma, dbeta, dout, x, mean, rstd, gamma);
    K::layernorm_backward(*ctx_, dx, dgamma.data(), dbeta.data(), dout, x, mean.data(), rstd.data(), gamma.data());
  }

  void gelu_forward(S out, CS x) const {
    checks::activation_forward_shapes<T>("gelu_forward", out, x);
    K::gelu_forward(*ctx_, out.data(), x.data(), ssize(x));
  }
  void gelu_backward(S dx, CS x, CS dout) const {
    checks::activation_backward_shapes<T>("gelu_backward", dx, x, dout);
    K::gelu_backward(*ctx_, dx.data(), x.data(), dout.data(), ssize(x));
  }
  void relu_forward(S out, CS x) const {
    checks::activation_forward_shapes<T>("relu_forward", out, x);
    K::relu_forward(*ctx_, out.data(), x.data(), ssize(x));
  }
  void relu_backward(S dx, CS x, CS dout) const {
    checks::activation_backward_shapes<T>("relu_backward", dx, x, dout);
    K::relu_backward(*ctx_, dx.data(), x.data(), dout.data(), ssize(x));
  }
  void add_forward(S out, CS a, CS b) const {
    checks::add_forward_shapes<T>(out, a, b);
    K::add_forward(*ctx_, out.data(), a.data(), b.data(), ssize(out));
  }
  void axpy(S y, T alpha, CS x) const {
    checks::axpy_shapes<T>(y, x);
    K::axpy(*ctx_, y.data(), alpha, x.data(), ssize(y));
  }
  void scale(S y, T alpha) const { K::scale(*ctx_, y.data(), alpha, ssize(y)); }

  void cross_entropy_forward(S loss_out, S lse, CM logits, Tok targets, token_t ignore_index = -1) const {
    checks::cross_entropy_forward_shapes<T>(loss_out, lse, logits, targets);
    K::cross_entropy_forward(*ctx_, loss_out.data(), lse.data(), logits, targets.data(), ignore_index);
  }
  void cross_entropy_backward(M dlogits, CM logits, CS lse, Tok targets, T dloss, token_t ignore_index = -1) const {
    checks::cross_entropy_backward_shapes<T>(dlogits, logits, lse, targets);
    K::cross_entropy_backward(*ctx_, dlogits, logits, lse.data(), targets.data(), dloss, ignore_index);
  }

  void attention_forward(M out, S lse, CM qkv, index_t batch, index_t seq, index_t heads) const {
    check_attention_shapes("attention_forward", qkv, out, lse, batch, seq, heads);
    K::attention_forward(*ctx_, out, lse.data(), qkv, batch, seq, heads);
  }
  void attention_backward(M dqkv, CM dout, CM out, CS lse, CM qkv, index_t batch, index_t seq, index_t heads) const {
    check_attention_shapes("attention_backward", qkv, out, lse, batch, seq, heads);
    checks::attention_backward_grad_shapes<T>("attention_backward", dqkv, dout, out, qkv);
    K::attention_backward(*ctx_, dqkv, dout, out, lse.data(), qkv, batch, seq, heads);
  }
  // Stick-breaking attention (ModuleFormer, arXiv 2306.04640; kernels/stick_breaking.cuh): forward saves
  // nothing, backward reads out. Decode: slot and pos in device memory (checked there: a row outside the
  // cache is skipped and reported at the next sync); keys and values written into the cache beforehand.
  void stick_breaking_forward(M out, CM qkv, index_t batch, index_t seq, index_t heads, index_t kv_heads) const {
    check_qkv_shapes("stick_breaking_forward", qkv, out, batch, seq, heads, kv_heads);
    K::stick_breaking_forward(*ctx_, out, qkv, batch, seq, heads, kv_heads);
  }
  void stick_breaking_backward(M dqkv, CM dout, CM out, CM qkv, index_t batch, index_t seq, index_t heads,
                               index_t kv_heads) const {
    check_qkv_shapes("stick_breaking_backward", qkv, out, batch, seq, heads, kv_heads);
    checks::attention_backward_grad_shapes<T>("stick_breaking_backward", dqkv, dout, out, qkv);
    K::stick_breaking_backward(*ctx_, dqkv, dout, out, qkv, batch, seq, heads, kv_heads);
  }
  // Incremental decoding (cpu/decode.hpp, kernels/decode.cuh): slot and pos in device memory; a slot or
  // position outside the cache is reported at the next sync (the row is skipped).
  void kv_write(M k_cache, M v_cache, CM qkv, std::span<const index_t> slot, std::span<const index_t> pos,
                index_t max_len) const {
    checks::kv_write_shapes<T>(k_cache, v_cache, qkv, ssize(slot), ssize(pos), max_len);
    K::kv_write(*ctx_, k_cache, v_cache, qkv, slot.data(), pos.data(), max_len);
  }
  void attention_decode(M out, CM qkv, CM k_cache, CM v_cache, std::span<const index_t> slot,
                        std::span<const index_t> pos, index_t max_len, index_t heads) const {
    checks::decode_shapes<T>("attention_decode", out, qkv, k_cache, v_cache, ssize(slot), ssize(pos), max_len, heads);
    MOM_CHECK(k_cache.cols / heads <= 128, "attention_decode: head dimension ", k_cache.cols / heads,
              " exceeds the CUDA kernels' maximum of 128");
    K::attention_decode(*ctx_, out, qkv, k_cache, v_cache, slot.data(), pos.data(), max_len, heads);
  }
  void stick_breaking_decode(M out, CM qkv, CM k_cache, CM v_cache, std::span<const index_t> slot,
                             std::span<const index_t> pos, index_t max_len, index_t heads, index_t kv_heads) const {
    checks::decode_shapes<T>("stick_breaking_decode", out, qkv, k_cache, v_cache, ssize(slot), ssize(pos), max_len, heads,
                             kv_heads);
    MOM_CHECK(k_cache.cols / kv_heads <= 128, "stick_breaking_decode: head dimension ", k_cache.cols / kv_heads,
              " exceeds the CUDA kernels' maximum of 128");
    K::stick_breaking_decode(*ctx_, out, qkv, k_cache, v_cache, slot.data(), pos.data(), max_len, heads, kv_heads);
  }

  // Rotary position embedding, in place (cpu/rope.hpp, kernels/rope.cuh); pos and idx in device memory.
  // Every row at pos[r] (or r mod seq when pos is empty), or the grouped rows at idx[r] mod seq.
  void rope_forward(M x, std::span<const index_t> pos, index_t seq, index_t head_dim, T base) const {
    rope("rope_forward", x, pos, seq, head_dim, base, false);
  }
  void rope_backward(M dx, std::span<const index_t> pos, index_t seq, index_t head_dim, T base) const {
    rope("rope_backward", dx, pos, seq, head_dim, base, true);
  }
  void rope_forward(M x, Tok idx, index_t seq, index_t head_dim, T base, RowGroups g) const {
    rope_grouped("rope_forward", x, idx, seq, head_dim, base, g, false);
  }
  void rope_backward(M dx, Tok idx, index_t seq, index_t head_dim, T base, RowGroups g) const {
    rope_grouped("rope_backward", dx, idx, seq, head_dim, base, g, true);
  }

  void gather_rows(M out, CM in, Tok idx) const {
    checks::gather_rows_shapes<T>(out, in, idx);
    K::gather_rows(*ctx_, out, in, idx.data());
  }
  void scatter_add_rows(M out, CM in, Tok idx, CS weights = {}) const {
    checks::scatter_add_rows_shapes<T>(out, in, idx, weights);
    K::scatter_add_rows(*ctx_, out, in, idx.data(), weights.data());
  }
  void scatter_add_rows_backward(M din, S dweights, CM dout, CM in, Tok idx, CS weights = {}) const {
    checks::scatter_add_rows_backward_shapes<T>(din, dweights, dout, in, idx, weights);
    K::scatter_add_rows_backward(*ctx_, din, dweights.data(), dout, in, idx.data(), weights.data());
  }

  void topk_rows(M values, MatrixView<token_t> indices, CM x) const {
    checks::topk_rows_shapes<T>(values, indices, x);
    K::topk_rows(*ctx_, values, indices, x);
  }
  void topk_rows_backward(M dx, CM dvalues, MatrixView<const token_t> indices) const {
    checks::topk_rows_backward_shapes<T>(dx, dvalues, indices);
    K::topk_rows_backward(*ctx_, dx, dvalues, indices);
  }
  void softmax_rows(M y, CM x, T scale = T(1)) const {
    checks::softmax_rows_shapes<T>(y, x);
    K::softmax_rows(*ctx_, y, x, scale);
  }
  void softmax_rows_backward(M dx, CM dy, CM y, T scale = T(1)) const {
    checks::softmax_rows_backward_shapes<T>(dx, dy, y);
    K::softmax_rows_backward(*ctx_, dx, dy, y, scale);
  }

  // GRU cell (PyTorch convention, gates r, z, n): gates = [x·w_ihᵀ + b_ih | h·w_hhᵀ + b_hh] by
  // cuBLAS, then one pointwise kernel for h_out.
  void gru_cell_forward(M h_out, M gates, CM x, CM h, CM w_ih, CM w_hh, CS b_ih, CS b_hh) const {
    const index_t n = h_out.rows, H = h_out.cols;
    check_gru_shapes("gru_cell_forward", n, H, gates, x, h, w_ih, w_hh, ssize(b_ih), ssize(b_hh));
    linear_forward(gates.col_block(0, 3 * H), x, w_ih, b_ih);
    linear_forward(gates.col_block(3 * H, 3 * H), h, w_hh, b_hh);
    K::gru_pointwise_forward(*ctx_, h_out, gates, h);
  }
  void gru_cell_backward(M dx, M dh, M dw_ih, M dw_hh, S db_ih, S db_hh, M scratch, CM dh_out, CM gates, CM x, CM h,
                         CM w_ih, CM w_hh) const {
    const index_t n = dh_out.rows, H = dh_out.cols;
    check_gru_shapes("gru_cell_backward", n, H, gates, x, h, w_ih, w_hh, db_ih.empty() ? 3 * H : ssize(db_ih),
                     db_hh.empty() ? 3 * H : ssize(db_hh));
    checks::gru_backward_extra_shapes<T>(n, H, scratch, dh, h);
    K::gru_pointwise_backward(*ctx_, scratch, dh, dh_out, gates, h);
    const CM dgi = scratch.col_block(0, 3 * H), dgh = scratch.col_block(3 * H, 3 * H);
    linear_backward(dx, dw_ih, db_ih, dgi, x, w_ih);
    linear_backward(dh, dw_hh, db_hh, dgh, h, w_hh);
  }

  // ---- routed assembly (cpu/routing.hpp) -------------------------------------
  void route_topk_forward(M weights, MatrixView<token_t> picks, M probs, CM logits, T inv_temp, bool renormalise) const {
    checks::route_topk_forward_shapes<T>(weights, picks, probs, logits);
    K::route_topk_forward(*ctx_, weights, picks, probs, logits, inv_temp, renormalise);
  }
  void route_topk_backward(M dlogits, CM dweights, CM weights, CM probs, MatrixView<const token_t> picks, T inv_temp,
                           bool renormalise, CS dprobs_col) const {
    checks::route_topk_backward_shapes<T>(dlogits, dweights, weights, probs, picks, dprobs_col);
    K::route_topk_backward(*ctx_, dlogits, dweights, weights, probs, picks, inv_temp, renormalise,
                           dprobs_col.empty() ? nullptr : dprobs_col.data());
  }
  // Stable grouping of the n×K (token, pick) slots by class: group_by_module over the flat picks
  // (CUB radix sort + scan), then row_token = slot / K. Stays on the device.
  void group_by_choice(std::span<token_t> row_token, std::span<token_t> row_slot, std::span<token_t> offsets,
                       MatrixView<const token_t> picks, index_t classes) const {
    const index_t n = picks.rows, k = picks.cols, E = classes;
    checks::group_by_choice_shapes(row_token, row_slot, offsets, picks, E);
    MOM_CHECK(picks.contiguous() || n <= 1, "group_by_choice: picks ", shape(picks), " with row stride ", picks.ld,
              " must be contiguous on the CUDA backend");
    reserve_dispatch(n * k, E);
    cuda::group_by_module(*ctx_, row_slot.data(), ctx_->sorted_keys, offsets.data(), ctx_->counts, picks.data, n * k, E,
                          DeviceError::group_choice);
    cuda::slots_to_rows(*ctx_, row_token.data(), row_slot.data(), n * k, k);
  }
  // Switch-style balance loss (Fedus et al. 2022, eq. (4)); reads the group offsets on the device.
  void balance_loss_forward(S loss_out, S dprobs_col, CM probs, Tok offsets, index_t k, T coef) const {
    const index_t E = probs.cols;
    checks::balance_loss_forward_shapes<T>(loss_out, dprobs_col, probs, offsets);
    MOM_CHECK(E <= Context::reduce_blocks, "balance_loss_forward: ", E, " classes exceed the CUDA backend's ",
              Context::reduce_blocks);
    K::balance_loss_forward(*ctx_, loss_out.data(), dprobs_col.data(), probs, offsets.data(), k, coef);
  }
  void router_z_loss_forward(S loss_out, M dlogits, CM logits, T inv_temp, T coef) const {
    checks::router_z_loss_shapes<T>(loss_out, dlogits, logits);
    K::router_z_loss_forward(*ctx_, loss_out.data(), dlogits, logits, inv_temp, coef);
  }
  void affinity_topk_forward(M weights, MatrixView<token_t> picks, M probs, CM scores, CS bias, index_t shared,
                             index_t groups, index_t top_groups, bool renormalise, T scale) const {
    checks::affinity_topk_forward_shapes<T>(weights, picks, probs, scores, ssize(bias), shared, groups, top_groups);
    K::affinity_topk_forward(*ctx_, weights, picks, probs, scores, bias.data(), shared, groups, top_groups, renormalise,
                             scale);
  }
  void affinity_topk_backward(M dscores, CM dweights, CM scores, MatrixView<const token_t> picks, index_t shared,
                              bool renormalise, T scale, CS dprobs_col) const {
    checks::affinity_topk_backward_shapes<T>(dscores, dweights, scores, picks, shared, ssize(dprobs_col));
    K::affinity_topk_backward(*ctx_, dscores, dweights, scores, picks, shared, renormalise, scale,
                              dprobs_col.empty() ? nullptr : dprobs_col.data());
  }
  void expert_load_add(S load, Tok offsets) const {
    MOM_CHECK(offsets.size() == load.size() + 1, "expert_load_add: ", offsets.size(), " offsets for ", load.size(),
              " classes (needs classes + 1)");
    K::expert_load_add(*ctx_, load.data(), offsets.data(), ssize(load));
  }
  void expert_choice_forward(M weights, MatrixView<token_t> picks, CM probs, index_t capacity) const {
    MOM_CHECK(weights.rows == probs.rows && weights.cols == probs.cols && picks.rows == probs.rows &&
                  picks.cols == probs.cols,
              "expert_choice_forward: weights ", shape(weights), ", picks ", shape(picks), " disagree with probs ",
              shape(probs), " (one slot per expert)");
    MOM_CHECK(capacity >= 0 && capacity <= probs.rows, "expert_choice_forward: capacity ", capacity,
              " must be in [0, ", probs.rows, "] (the rows)");
    K::expert_choice_forward(*ctx_, weights, picks, probs, capacity);
  }
  void expert_choice_backward(M dprobs, CM dweights, MatrixView<const token_t> picks) const {
    MOM_CHECK(dprobs.rows == picks.rows && dprobs.cols == picks.cols && dweights.rows == picks.rows &&
                  dweights.cols == picks.cols,
              "expert_choice_backward: dprobs ", shape(dprobs), ", dweights ", shape(dweights),
              " disagree with picks ", shape(picks));
    K::expert_choice_backward(*ctx_, dprobs, dweights, picks);
  }
  void bias_balance_update(S bias, CS load, T rate) const {
    MOM_CHECK(bias.size() == load.size() && !bias.empty(), "bias_balance_update: ", bias.size(), " biases for ",
              load.size(), " loads");
    K::bias_balance_update(*ctx_, bias.data(), load.data(), ssize(bias), rate);
  }
  void sequence_balance_forward(S loss_out, M dscores, M freq, CM scores, MatrixView<const token_t> picks, index_t shared,
                                index_t seq, T coef) const {
    checks::sequence_balance_shapes<T>(ssize(loss_out), dscores, freq, scores, picks, shared, seq);
    K::sequence_balance_forward(*ctx_, loss_out.data(), dscores, freq, scores, picks, shared, seq, coef);
  }
  void selection_entropy_forward(S loss_out, M dlogits, CM logits, index_t batch, index_t seq, T coef,
                                 T cond_coef = T(0)) const {
    checks::selection_entropy_shapes<T>(loss_out, dlogits, logits, batch, seq);
    MOM_CHECK(batch <= Context::reduce_blocks && logits.cols <= Context::entropy_classes,
              "selection_entropy_forward: ", batch, " sequences and ", logits.cols,
              " classes exceed the CUDA backend's ", Context::reduce_blocks, " and ", Context::entropy_classes);
    K::selection_entropy_forward(*ctx_, loss_out.data(), dlogits, logits, batch, seq, coef, cond_coef);
  }
  // Causal attention over packed queries/keys (positions q_tok, k_tok ascending; k_tok empty =
  // every token). lse is [nq × heads]. Position order is checked on the device (next sync).
  void attention_packed_forward(M out, S lse, CM q, CM k, CM v, Tok q_tok, Tok k_tok, index_t seq, index_t heads) const {
    check_packed("attention_packed_forward", q, k, v, q_tok, k_tok, seq, heads);
    checks::attention_packed_forward_out_shapes<T>(out, lse, q, heads);
    if (q.rows == 0) return;
    K::attention_packed_forward(*ctx_, out, lse.data(), q, k, v, q_tok.data(), k_tok.empty() ? nullptr : k_tok.data(),
                                seq, heads);
  }
  void attention_packed_backward(M dq, M dk, M dv, CM dout, CM out, CS lse, CM q, CM k, CM v, Tok q_tok, Tok k_tok,
                                 index_t seq, index_t heads) const {
    check_packed("attention_packed_backward", q, k, v, q_tok, k_tok, seq, heads);
    checks::attention_packed_backward_grad_shapes<T>(dq, dk, dv, dout, out, lse, q, k, v, heads);
    if (q.rows == 0) return;
    K::attention_packed_backward(*ctx_, dq, dk, dv, dout, out, lse.data(), q, k, v, q_tok.data(),
                                 k_tok.empty() ? nullptr : k_tok.data(), seq, heads);
  }
  // The packed attention per row group (cpu/grouped.hpp): query row r of group g (offsets[g] <= r <
  // offsets[g+1], read on the device only) attends to k[g] / v[g]: with k_tok empty to its rows
  // t < kv_rows (token t), with k_tok to the rows of g's own row range (tokens k_tok); key rows are
  // kv_ld apart. Rows outside [offsets[0], offsets[count]) are untouched. Bad offsets or query
  // positions are reported at the next sync. dq, dk, dv accumulate; groups' dk / dv rows must not
  // overlap (own buffers per group, or disjoint row ranges of a shared one with k_tok).
  void attention_grouped_forward(M out, S lse, CM q, CPG k, CPG v, index_t kv_rows, index_t kv_ld, Tok q_tok,
                                 Tok k_tok, RowGroups g, index_t seq, index_t heads) const {
    check_grouped_attention("attention_grouped_forward", q, k, v, kv_rows, kv_ld, q_tok, k_tok, g, seq, heads);
    checks::attention_packed_forward_out_shapes<T>(out, lse, q, heads);
    if (q.rows == 0 || g.count == 0) return;
    K::attention_grouped_forward(*ctx_, out, lse.data(), q, k, v, kv_rows, kv_ld, q_tok.data(),
                                 k_tok.empty() ? nullptr : k_tok.data(), g, seq, heads);
  }
  void attention_grouped_backward(M dq, PG dk, PG dv, CM dout, CM out, CS lse, CM q, CPG k, CPG v, index_t kv_rows,
                                  index_t kv_ld, Tok q_tok, Tok k_tok, RowGroups g, index_t seq, index_t heads) const {
    check_grouped_attention("attention_grouped_backward", q, k, v, kv_rows, kv_ld, q_tok, k_tok, g, seq, heads);
    MOM_CHECK(dq.rows == q.rows && dq.cols == q.cols && dout.rows == q.rows && dout.cols == q.cols &&
                  out.rows == q.rows && out.cols == q.cols && ssize(lse) == q.rows * heads && !dk.empty() &&
                  !dv.empty(),
              "attention_grouped_backward: dq ", shape(dq), ", dout ", shape(dout), ", out ", shape(out), ", lse ",
              lse.size(), (dk.empty() || dv.empty() ? " (no dk / dv)" : ""), " disagree with q ", shape(q));
    if (q.rows == 0 || g.count == 0) return;
    K::attention_grouped_backward(*ctx_, dq, dk, dv, dout, out, lse.data(), q, k, v, kv_rows, kv_ld, q_tok.data(),
                                  k_tok.empty() ? nullptr : k_tok.data(), g, seq, heads);
  }

  // ---- depth routing (Mixture-of-Depths, layer-skip, early-exit; cpu/depth.hpp) ---------------
  // The same members and checks as the CPU backend's (depth branch, dc98a76). skip_select leaves the
  // count in device memory (read it with read()); selection_mask reports a bad index at the next sync.
  void select_topc_per_sequence(std::span<token_t> idx, CS scores, index_t batch, index_t seq) const {
    checks::select_topc_shapes(ssize(idx), ssize(scores), batch, seq);
    DK::select_topc_per_sequence(*ctx_, idx.data(), scores.data(), batch, seq, ssize(idx) / batch);
  }
  void selection_mask(S mask, Tok idx) const {
    DK::selection_mask(*ctx_, mask.data(), ssize(mask), idx.data(), ssize(idx));
  }
  void skip_select(std::span<token_t> idx, std::span<token_t> count, std::span<token_t> alive, CS logits) const {
    checks::skip_select_shapes(ssize(idx), ssize(count), ssize(alive), ssize(logits));
    DK::skip_select(*ctx_, idx.data(), count.data(), alive.empty() ? nullptr : alive.data(), logits.data(),
                    ssize(logits));
  }
  void depth_choice_rows(S decision, S coef, Tok picks, CS weights, index_t r) const {
    checks::depth_choice_shapes(ssize(decision), ssize(coef), ssize(picks), ssize(weights));
    DK::depth_choice_rows(*ctx_, decision.data(), coef.data(), picks.data(), weights.data(), ssize(picks), r);
  }
  void depth_choice_rows_backward(S dweights, CS dcoef, Tok picks, index_t r) const {
    checks::depth_choice_shapes(ssize(dweights), ssize(dcoef), ssize(picks), ssize(dweights));
    DK::depth_choice_rows_backward(*ctx_, dweights.data(), dcoef.data(), picks.data(), ssize(picks), r);
  }
  void sigmoid_forward(S out, CS x) const {
    checks::sigmoid_forward_shapes<T>(out, x);
    DK::sigmoid_forward(*ctx_, out.data(), x.data(), ssize(x));
  }
  void sigmoid_backward(S dx, CS out, CS dout) const {
    checks::sigmoid_backward_shapes<T>(dx, out, dout);
    DK::sigmoid_backward(*ctx_, dx.data(), out.data(), dout.data(), ssize(out));
  }
  void bce_logits_forward(S out, CS logits, CS targets) const {
    checks::bce_logits_shapes("bce_logits_forward", ssize(out), ssize(logits), ssize(targets));
    DK::bce_logits_forward(*ctx_, out.data(), logits.data(), targets.data(), ssize(logits));
  }
  void bce_logits_backward(S dlogits, CS logits, CS targets, T scale) const {
    checks::bce_logits_shapes("bce_logits_backward", 2, ssize(logits), ssize(targets));
    checks::bce_logits_backward_grad_shapes(ssize(dlogits), ssize(logits));
    DK::bce_logits_backward(*ctx_, dlogits.data(), logits.data(), targets.data(), scale, ssize(logits));
  }

  // ---- grouped ops (core/groups.hpp, cpu/grouped.hpp) ------------------------------------------
  // The same members and host checks as the CPU backend's, but the offsets are never read on the
  // host: every kernel reads them in device memory (grouped_kernels.hpp), so a routed step has no
  // host-device synchronisation. Offsets outside [0, rows] or decreasing are reported at the next
  // sync (the CPU throws at once). The grouped GEMMs are mom's own kernels (not cuBLAS); in float they
  // follow the precision setting: TF32 and BF16 on tensor cores (wmma, operands rounded when staged,
  // fp32 accumulate), FP32 on the CUDA cores; the bias gradient is always summed in full precision.
  using GK = GroupedKernels<T>;

  void grouped_linear_forward(M y, CM x, CPG w, CPG b, RowGroups g) const {
    checks::grouped_linear_shapes<T>("grouped_linear_forward", y, x, !w.empty());
    checks::row_groups_shape("grouped_linear_forward", g);
    GK::linear_forward(*ctx_, y, x, w, b, g);
  }
  void grouped_linear_backward(M dx, PG dw, PG db, CM dy, CM x, CPG w, RowGroups g) const {
    checks::grouped_linear_shapes<T>("grouped_linear_backward", dy, x, !w.empty());
    MOM_CHECK(dx.empty() || (dx.rows == x.rows && dx.cols == x.cols), "grouped_linear_backward: dx ", shape(dx),
              " must match x ", shape(x));
    checks::row_groups_shape("grouped_linear_backward", g);
    if (!dx.empty()) GK::linear_backward_dx(*ctx_, dx, dy, w, g);
    GK::linear_backward_dw(*ctx_, dw, db, dy, x, g);
  }
  // mean, rstd [x.rows] and every group's gamma / beta are required, as on the CPU (whose
  // per-group checks cannot run here: the group sizes live on the device).
  void grouped_layernorm_forward(M out, S mean, S rstd, CM x, CPG gamma, CPG beta, RowGroups g,
                                 T eps = T(1e-5)) const {
    checks::layernorm_forward_shapes<T>(out, mean, rstd, x, group_span(gamma, x.cols), group_span(beta, x.cols));
    checks::row_groups_shape("grouped_layernorm_forward", g);
    GK::layernorm_forward(*ctx_, out, mean.data(), rstd.data(), x, gamma, beta, g, eps);
  }
  void grouped_layernorm_backward(M dx, PG dgamma, PG dbeta, CM dout, CM x, CS mean, CS rstd, CPG gamma,
                                  RowGroups g) const {
    checks::layernorm_backward_shapes<T>(dx, group_span(CPG(dgamma), x.cols), group_span(CPG(dbeta), x.cols), dout, x,
                                         mean, rstd, group_span(gamma, x.cols));
    checks::row_groups_shape("grouped_layernorm_backward", g);
    GK::layernorm_backward(*ctx_, dx, dgamma, dbeta, dout, x, mean.data(), rstd.data(), gamma, g);
  }
  void gelu_forward(M out, CM x, RowGroups g) const {
    checks::same_shape<T>("gelu_forward", out, x);
    checks::row_groups_shape("gelu_forward", g);
    GK::gelu_forward(*ctx_, out, x, g);
  }
  void gelu_backward(M dx, CM x, CM dout, RowGroups g) const {
    checks::same_shape<T>("gelu_backward", dx, x);
    checks::same_shape<T>("gelu_backward", dout, x);
    checks::row_groups_shape("gelu_backward", g);
    GK::gelu_backward(*ctx_, dx, x, dout, g);
  }
  void add_forward(M out, CM a, CM b, RowGroups g) const {
    checks::same_shape<T>("add_forward", out, a);
    checks::same_shape<T>("add_forward", out, b);
    checks::row_groups_shape("add_forward", g);
    GK::axpby(*ctx_, out, T(1), a, T(1), b, g);
  }
  void axpy(M y, T alpha, CM x, RowGroups g) const {
    checks::same_shape<T>("axpy", y, x);
    checks::row_groups_shape("axpy", g);
    GK::axpby(*ctx_, y, T(1), CM(y), alpha, x, g);
  }
  void zero_rows(M m, RowGroups g) const {
    checks::row_groups_shape("zero_rows", g);
    GK::zero_rows(*ctx_, m, g);
  }
  void gather_rows(M out, CM in, Tok idx, RowGroups g) const {
    checks::gather_rows_shapes<T>(out, in, idx);
    checks::row_groups_shape("gather_rows", g);
    GK::gather_rows(*ctx_, out, in, idx.data(), g);
  }
  void gather_rows(M out, CPG in, index_t in_rows, Tok idx, RowGroups g) const {
    MOM_CHECK(ssize(idx) == out.rows, "gather_rows: ", idx.size(), " indices for out ", shape(out));
    checks::row_groups_shape("gather_rows", g);
    MOM_CHECK(!in.empty() || g.count == 0, "gather_rows: no per-group inputs");
    GK::gather_rows(*ctx_, out, in, in_rows, idx.data(), g);
  }
  void scatter_add_rows(M out, CM in, Tok idx, CS weights, RowGroups g) const {
    checks::scatter_add_rows_shapes<T>(out, in, idx, weights);
    checks::row_groups_shape("scatter_add_rows", g);
    GK::scatter_add_rows(*ctx_, out, in, idx.data(), weights.empty() ? nullptr : weights.data(), g);
  }
  void scatter_add_rows(PG out, index_t out_rows, CM in, Tok idx, RowGroups g) const {
    MOM_CHECK(ssize(idx) == in.rows, "scatter_add_rows: ", idx.size(), " indices for in ", shape(in));
    checks::row_groups_shape("scatter_add_rows", g);
    MOM_CHECK(!out.empty() || g.count == 0, "scatter_add_rows: no per-group outputs");
    GK::scatter_add_rows(*ctx_, out, out_rows, in, idx.data(), g);
  }
  void scatter_add_rows_backward(M din, S dweights, CM dout, CM in, Tok idx, CS weights, RowGroups g) const {
    checks::scatter_add_rows_backward_shapes<T>(din, dweights, dout, in, idx, weights);
    checks::row_groups_shape("scatter_add_rows_backward", g);
    GK::scatter_add_rows_backward(*ctx_, din, dweights.empty() ? nullptr : dweights.data(), dout, in, idx.data(),
                                  weights.empty() ? nullptr : weights.data(), g);
  }

  // *norm_out = sqrt(Σ g²) (double accumulation), written to device memory: no host sync.
  void grad_norm(CS grads, T* norm_out) const {
    checks::grad_norm_args<T>(grads, norm_out);
    K::grad_norm(*ctx_, grads.data(), ssize(grads), norm_out);
  }
  // AdamW; with grad_norm (device memory) and max_norm > 0 the gradient is scaled by
  // min(1, max_norm / *grad_norm) inside the kernel (fused clipping, no host sync).
  void adamw_step(S params, CS grads, S m, S v, const AdamWConfig& cfg, std::int64_t step,
                  const T* grad_norm = nullptr, T max_norm = T(0)) const {
    checks::adamw_step_args<T>(params, grads, m, v, step);
    const T step_size = T(cfg.lr / (1.0 - std::pow(cfg.beta1, double(step))));
    const T inv_sqrt_bc2 = T(1.0 / std::sqrt(1.0 - std::pow(cfg.beta2, double(step))));
    K::adamw_step(*ctx_, params.data(), grads.data(), m.data(), v.data(), ssize(params), T(cfg.beta1), T(cfg.beta2),
                  T(cfg.eps), T(cfg.lr * cfg.weight_decay), step_size, inv_sqrt_bc2, grad_norm, max_norm);
  }

  // Sizes the bf16 staging of Precision::BF16 GEMMs for operands of up to `elements` elements together
  // (A and B of one GEMM), so that no later GEMM allocates. The first GEMMs of a run grow it
  // otherwise (stream-synchronising cudaFree + cudaMalloc), after which a step of the same shapes
  // never allocates; call it outside the step to size it up front.
  void reserve_bf16_staging(index_t elements) const {
    Context& c = *ctx_;
    if (elements <= c.bf16_stage_size) return;
    MOM_CUDA_CHECK(cudaStreamSynchronize(c.stream), "reserve_bf16_staging");
    MOM_CUDA_CHECK(cudaFree(c.bf16_stage), "reserve_bf16_staging");
    c.bf16_stage = nullptr;
    c.bf16_stage_size = 0;
    MOM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&c.bf16_stage), static_cast<std::size_t>(elements) * 2),
                   "reserve_bf16_staging");
    c.bf16_stage_size = elements;
    ++c.bf16_stage_grows;
  }

  // ---- token dispatch (docs/design.md, "Data and the hot path") ------------
  // Sizes group_by_module's CUB temp storage and scratch for up to n_pairs pairs and n_modules
  // modules, so that no later call allocates. Call once, outside the training step.
  void reserve_dispatch(index_t n_pairs, index_t n_modules) const {
    MOM_CHECK(n_pairs >= 0 && n_modules >= 1, "reserve_dispatch: n_pairs ", n_pairs, ", n_modules ", n_modules);
    Context& c = *ctx_;
    if (n_pairs <= c.dispatch_pairs && n_modules <= c.dispatch_modules) return;  // sized already
    n_pairs = std::max(n_pairs, c.dispatch_pairs);
    n_modules = std::max(n_modules, c.dispatch_modules);
    const std::size_t bytes = group_by_module_temp_bytes(n_pairs, n_modules);
    if (bytes > c.cub_temp_bytes) {
      MOM_CUDA_CHECK(cudaStreamSynchronize(c.stream), "reserve_dispatch");
      MOM_CUDA_CHECK(cudaFree(c.cub_temp), "reserve_dispatch");
      c.cub_temp = nullptr;
      c.cub_temp_bytes = 0;
      MOM_CUDA_CHECK(cudaMalloc(&c.cub_temp, bytes), "reserve_dispatch");
      c.cub_temp_bytes = bytes;
    }
    if (n_pairs > c.pair_ids_size) {
      MOM_CUDA_CHECK(cudaStreamSynchronize(c.stream), "reserve_dispatch");
      MOM_CUDA_CHECK(cudaFree(c.pair_ids), "reserve_dispatch");
      MOM_CUDA_CHECK(cudaFree(c.sorted_keys), "reserve_dispatch");
      c.pair_ids = c.sorted_keys = nullptr;
      c.pair_ids_size = 0;
      const std::size_t bytes_ids = static_cast<std::size_t>(n_pairs) * sizeof(token_t);
      MOM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&c.pair_ids), bytes_ids), "reserve_dispatch");
      MOM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&c.sorted_keys), bytes_ids), "reserve_dispatch");
      c.pair_ids_size = n_pairs;
    }
    if (n_modules + 1 > c.counts_size) {
      MOM_CUDA_CHECK(cudaStreamSynchronize(c.stream), "reserve_dispatch");
      MOM_CUDA_CHECK(cudaFree(c.counts), "reserve_dispatch");
      c.counts = nullptr;
      c.counts_size = 0;
      MOM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&c.counts), static_cast<std::size_t>(n_modules + 1) * sizeof(int)),
                     "reserve_dispatch");
      c.counts_size = n_modules + 1;
    }
    c.dispatch_pairs = n_pairs;
    c.dispatch_modules = n_modules;
  }
  // Groups (token, module) pairs by module: modules[p] is the module of pair p (e.g. p = token·K + j
  // for a router's K choices). Writes sorted_ids (pair indices, stably sorted by module, so causal
  // order is kept inside each group), sorted_modules, and offsets[n_modules + 1] (group m is
  // [offsets[m], offsets[m+1])). Everything stays on the device: group sizes are never read back.
  // Grows its scratch on first use unless reserve_dispatch sized it.
  void group_by_module(std::span<token_t> sorted_ids, std::span<token_t> sorted_modules, std::span<token_t> offsets,
                       Tok modules, index_t n_modules) const {
    const index_t n = ssize(modules);
    MOM_CHECK(n_modules >= 1, "group_by_module: n_modules = ", n_modules, " must be >= 1");
    MOM_CHECK(ssize(sorted_ids) == n && ssize(sorted_modules) == n, "group_by_module: sorted_ids/sorted_modules have ",
              sorted_ids.size(), "/", sorted_modules.size(), " elements for ", n, " pairs");
    MOM_CHECK(ssize(offsets) == n_modules + 1, "group_by_module: offsets has ", offsets.size(),
              " elements, expected n_modules + 1 = ", n_modules + 1);
    reserve_dispatch(n, n_modules);
    cuda::group_by_module(*ctx_, sorted_ids.data(), sorted_modules.data(), offsets.data(), ctx_->counts,
                          modules.data(), n, n_modules);
  }

 private:
  void check_device_errors() const {
    int e[4] = {0, 0, 0, 0};
    MOM_CUDA_CHECK(cudaMemcpy(e, ctx_->error, sizeof(e), cudaMemcpyDeviceToHost), "sync");
    if (e[0] == 0) return;
    MOM_CUDA_CHECK(cudaMemset(ctx_->error, 0, sizeof(e)), "sync");
    const char* op = "?";
    const char* what = "index";
    switch (static_cast<DeviceError>(e[0])) {
      case DeviceError::embedding_token: op = "embedding_forward", what = "token id"; break;
      case DeviceError::embedding_backward_token: op = "embedding_backward", what = "token id"; break;
      case DeviceError::cross_entropy_target: op = "cross_entropy", what = "target"; break;
      case DeviceError::gather_index: op = "gather_rows", what = "idx"; break;
      case DeviceError::scatter_index: op = "scatter_add_rows", what = "idx"; break;
      case DeviceError::scatter_backward_index: op = "scatter_add_rows_backward", what = "idx"; break;
      case DeviceError::topk_backward_index: op = "topk_rows_backward", what = "index"; break;
      case DeviceError::group_module: op = "group_by_module", what = "module id"; break;
      case DeviceError::group_choice: op = "group_by_choice", what = "pick"; break;
      case DeviceError::selection_index: op = "selection_mask", what = "idx"; break;
      case DeviceError::rope_position: op = "rope", what = "position"; break;
      case DeviceError::decode_position: op = "stick_breaking_decode", what = "slot or position"; break;
      case DeviceError::kv_write_position: op = "kv_write", what = "slot or position"; break;
      case DeviceError::attention_decode_position: op = "attention_decode", what = "slot or position"; break;
      case DeviceError::group_offsets:
        mom::detail::fail("grouped op: group offsets must be non-decreasing in [0, ", e[3], "]; offsets[", e[1],
                          "] = ", e[2], " (found on the device)");
      case DeviceError::packed_positions:
        mom::detail::fail("attention_packed: query positions must be ascending and in range; q_tok[", e[1], "] = ",
                          e[2], " (found on the device)");
      default: break;
    }
    mom::detail::fail(op, ": ", what, " ", e[2], " at position ", e[1], " is out of range [0, ", e[3],
                      ") (found on the device; the row was skipped)");
  }

  void rope(const char* op, M x, std::span<const index_t> pos, index_t seq, index_t head_dim, T base,
            bool inverse) const {
    checks::rope_shapes<T>(op, x, pos.empty() ? -1 : ssize(pos), seq, head_dim, base);
    K::rope(*ctx_, x, pos.empty() ? nullptr : pos.data(), nullptr, RowGroups{}, false, seq, head_dim, double(base),
            inverse);
  }
  void rope_grouped(const char* op, M x, Tok idx, index_t seq, index_t head_dim, T base, RowGroups g,
                    bool inverse) const {
    checks::rope_shapes<T>(op, x, ssize(idx), seq, head_dim, base);
    checks::row_groups_shape(op, g);
    K::rope(*ctx_, x, nullptr, idx.data(), g, true, seq, head_dim, double(base), inverse);
  }

  // A per-group tensor's size for the host checks: cols elements when given, empty otherwise.
  static CS group_span(CPG p, index_t cols) { return p.empty() ? CS{} : CS{p.base, std::size_t(cols)}; }

  static void check_embedding_shapes(const char* op, CM rows, Tok tokens, CM wte, CM wpe, index_t seq) {
    checks::embedding_shapes<T>(op, rows, tokens, wte, wpe, seq);
  }
  // A packed attention op's qkv and out, and the kernels' head-dimension bound; softmax attention adds its lse.
  static void check_qkv_shapes(const char* op, CM qkv, CM out, index_t batch, index_t seq, index_t heads,
                               std::optional<index_t> kv_heads = std::nullopt) {
    checks::attention_qkv_shapes<T>(op, qkv, out, batch, seq, heads, kv_heads);
    const index_t hd = qkv.cols / (heads + 2 * kv_heads.value_or(heads));
    MOM_CHECK(hd <= 128, op, ": head dimension ", hd, " exceeds the CUDA kernels' maximum of 128");
  }
  static void check_attention_shapes(const char* op, CM qkv, CM out, CS lse, index_t batch, index_t seq,
                                     index_t heads) {
    check_qkv_shapes(op, qkv, out, batch, seq, heads);
    checks::attention_lse_shapes<T>(op, lse, batch, seq, heads);
  }
  static void check_packed(const char* op, CM q, CM k, CM v, Tok q_tok, Tok k_tok, index_t seq, index_t heads) {
    checks::packed_attention_shapes<T>(op, q, k, v, q_tok, k_tok, seq, heads);
    MOM_CHECK(q.cols / heads <= 128, op, ": head dimension ", q.cols / heads,
              " exceeds the CUDA kernels' maximum of 128");
  }
  // The CPU's per-group checks (packed_attention_shapes) on the whole packed matrices; every group's
  // key matrix is [kv_rows × d] (k_tok empty) or [q.rows × d] (k_tok given: one key per query row).
  static void check_grouped_attention(const char* op, CM q, CPG k, CPG v, index_t kv_rows, index_t kv_ld, Tok q_tok,
                                      Tok k_tok, RowGroups g, index_t seq, index_t heads) {
    checks::row_groups_shape(op, g);
    MOM_CHECK(!k.empty() && !v.empty() && kv_ld >= q.cols && kv_rows >= 0, op, ": keys ",
              (k.empty() ? "missing" : "given"), ", values ", (v.empty() ? "missing" : "given"), ", kv_rows ", kv_rows,
              ", kv_ld ", kv_ld, " for q ", shape(q));
    const index_t key_rows = k_tok.empty() ? kv_rows : q.rows;
    check_packed(op, q, CM{k.base, key_rows, q.cols, kv_ld}, CM{v.base, key_rows, q.cols, kv_ld}, q_tok, k_tok, seq,
                 heads);
  }
  static void check_gru_shapes(const char* op, index_t n, index_t H, CM gates, CM x, CM h, CM w_ih, CM w_hh,
                               index_t b_ih, index_t b_hh) {
    checks::gru_shapes<T>(op, n, H, gates, x, h, w_ih, w_hh, b_ih, b_hh);
  }

  std::shared_ptr<Context> ctx_;
};

}  // namespace mom::cuda

static_assert(mom::Backend<mom::cuda::Backend<float>> && mom::Backend<mom::cuda::Backend<double>>,
              "cuda::Backend must satisfy mom::Backend (backend/backend_concept.hpp)");

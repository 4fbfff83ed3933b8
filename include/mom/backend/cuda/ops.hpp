#pragma once
// The CUDA backend's ops of a dense transformer, over device memory: GEMMs (cuBLAS), linear, embedding,
// LayerNorm, activations, cross-entropy, the dense and stick-breaking attention with their decode ops,
// rotary embedding, row gather / scatter, top-k and softmax over rows, the GRU cell, grad_norm and AdamW.
// Each op checks shapes on the host with the CPU op's message (backend/shape_checks.hpp), then enqueues its
// launcher (kernels.hpp) on the backend's stream and returns. cuda::Backend<T> (backend.hpp) is these ops,
// the routed ones (routed_ops.hpp) and the backend's memory, stream and precision; the Context they share
// is created and owned there.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>

#include "mom/backend/cpu/optim.hpp"  // AdamWConfig (plain struct, no Eigen)
#include "mom/backend/cuda/lt.hpp"
#include "mom/backend/cuda/check.hpp"
#include "mom/backend/cuda/kernels.hpp"
#include "mom/backend/cuda/staging.hpp"
#include "mom/backend/cuda/weight_copies.hpp"
#include "mom/backend/shape_checks.hpp"
#include "mom/core/check.hpp"
#include "mom/core/groups.hpp"
#include "mom/core/tensor.hpp"

namespace mom::cuda {

enum class Trans : bool { N = false, T = true };

// cuda::Backend::row_align: rows of vocabulary width (the logits) are padded to a multiple of it (backend.hpp).
inline constexpr index_t logits_row_align = 64;

namespace detail {

template <class T>
class DenseOps {
 public:
  using AdamWConfig = cpu::AdamWConfig;
  using M = MatrixView<T>;
  using CM = MatrixView<const T>;
  using S = std::span<T>;
  using CS = std::span<const T>;
  using Tok = std::span<const token_t>;
  using K = Kernels<T>;

  explicit DenseOps(std::shared_ptr<Context> ctx) : ctx_(std::move(ctx)) {}

  // m = 0 on the stream (the ops' Store::overwrite where the kernel itself only adds).
  void clear(M m) const {
    if (m.rows == 0 || m.cols == 0) return;
    MOM_CUDA_CHECK(cudaMemset2DAsync(m.data, static_cast<std::size_t>(m.ld) * sizeof(T), 0,
                                     static_cast<std::size_t>(m.cols) * sizeof(T), static_cast<std::size_t>(m.rows),
                                     ctx_->stream),
                   "clear");
  }

  // C = alpha·op(A)·op(B) + beta·C on row-major views. cuBLAS is column-major, and a row-major
  // [r×c] matrix with stride ld is the column-major [c×r] matrix with leading dimension ld, so
  // C = op(A)·op(B) is computed as Cᵀ = op(B)ᵀ·op(A)ᵀ with the operands swapped.
  void gemm(M C, CM A, Trans ta, CM B, Trans tb, T alpha = T(1), T beta = T(0)) const {
    checks::gemm_shapes<T>(C, A, ta == Trans::T, B, tb == Trans::T);
    if (C.rows == 0 || C.cols == 0) return;
    if constexpr (std::is_same_v<T, float>) {
      if (bf16_products(A, ta)) {
        // Both operands staged as bf16 (one conversion pass each), then bf16 tensor cores with fp32 accumulation
        // into the fp32 C (alpha, beta as usual).
        cuda::reserve_bf16_staging(*ctx_, staged_size(A) + staged_size(B));
        const Staged a = stage(ctx_->bf16_stage, A);
        const Staged b = stage(ctx_->bf16_stage + staged_size(A), B);
        return gemm_staged(C, a, ta, b, tb, alpha, beta);
      }
    }
    constexpr cudaDataType_t type = std::is_same_v<T, float> ? CUDA_R_32F : CUDA_R_64F;
    const cublasComputeType_t compute = std::is_same_v<T, double>               ? CUBLAS_COMPUTE_64F
                                        : ctx_->precision == Precision::FP32 ? CUBLAS_COMPUTE_32F
                                                                              : CUBLAS_COMPUTE_32F_FAST_TF32;
    const index_t k = ta == Trans::N ? A.cols : A.rows;
    MOM_CUBLAS_CHECK(cublasGemmEx(ctx_->blas, op(tb), op(ta), static_cast<int>(C.cols), static_cast<int>(C.rows),
                                  static_cast<int>(k), &alpha, B.data, type, ld(B.ld), A.data, type, ld(A.ld), &beta,
                                  C.data, type, ld(C.ld), compute, CUBLAS_GEMM_DEFAULT),
                     "gemm");
  }

  // y = x·wᵀ + b: on float one cuBLASLt product with the bias epilogue (lt.hpp) where cuBLASLt has an algorithm for
  // it; else (and on double) the bias is broadcast into y, then y += x·wᵀ (cuBLAS, beta = 1).
  void linear_forward(M y, CM x, CM w, CS b) const {
    checks::linear_forward_shapes<T>(y, x, w, b);
    if (b.empty()) return gemm(y, x, Trans::N, w, Trans::T);
    if constexpr (std::is_same_v<T, float>) {
      if (linear_forward_lt(y, x, w, b)) return;
    }
    K::broadcast_rows(*ctx_, y, b.data());
    gemm(y, x, Trans::N, w, Trans::T, T(1), T(1));
  }
  // y = x·wᵀ + b + residual (residual empty: none; else dense, of y's shape, distinct from y): eq. (4)'s residual add
  // in the linear that ends a module (backend_concept.hpp, FusesLinearResidual; the fused pairs' output linears). On
  // float the bias and the residual ride in cuBLASLt's epilogue (no add kernel, y written once) where it has an
  // algorithm; else linear_forward, then the add (y + residual: the executor's residual + y, the same bits).
  void linear_forward_residual(M y, CM x, CM w, CS b, CM residual) const {
    checks::linear_forward_shapes<T>(y, x, w, b);
    check_residual("linear_forward_residual", CM(y), residual);
    if constexpr (std::is_same_v<T, float>) {
      if (!residual.empty() && !b.empty() && linear_forward_lt(y, x, w, b, CUBLASLT_EPILOGUE_BIAS, M{}, residual))
        return;
    }
    linear_forward(y, x, w, b);
    add_residual(y, residual);
  }
  // The FFN's GELU fused into its products (backend_concept.hpp, FusesGelu). pre = x·wᵀ + b, act = gelu(pre): on
  // float one cuBLASLt product with CUBLASLT_EPILOGUE_GELU_AUX_BIAS (D = act, the pre-activation into its aux matrix
  // pre) where cuBLASLt has an algorithm for it; else linear_forward, then gelu_forward.
  void linear_forward_gelu(M pre, M act, CM x, CM w, CS b) const {
    checks::linear_forward_shapes<T>(pre, x, w, b);
    check_gelu_pair("linear_forward_gelu", act, pre);
    if constexpr (std::is_same_v<T, float>) {
      if (!b.empty() && linear_forward_lt(act, x, w, b, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, pre)) return;
    }
    linear_forward(pre, x, w, b);
    gelu_forward(act.flat(), CM(pre).flat());
  }
  // The backward of a linear whose input is act = gelu(pre), and of that GELU: dpre = (dy·w) ∘ gelu'(pre) (written),
  // dw += dyᵀ·act, db += Σ_rows dy. On float the dx product carries CUBLASLT_EPILOGUE_DGELU (aux = pre) where
  // cuBLASLt has an algorithm for it (under BF16 from one staging of dy, w and act, as linear_backward); else
  // linear_backward into dpre, then the GELU's backward in place.
  void linear_backward_dgelu(M dpre, M dw, S db, CM dy, CM act, CM w, CM pre) const {
    checks::linear_backward_shapes<T>(dpre, dw, db, dy, act, w);
    check_gelu_pair("linear_backward_dgelu", dpre, pre);
    if constexpr (std::is_same_v<T, float>) {
      if (!dw.empty() && dy.rows > 0 && backward_dgelu_lt(dpre, dw, db, dy, act, w, pre)) return;
    }
    linear_backward(dpre, dw, db, dy, act, w, Store::overwrite);
    dgelu_in_place(dpre, pre);
  }

  // dx += dy·w (dx_store = Store::overwrite: dx = dy·w), dw += dyᵀ·x, db += Σ_rows dy (each may be empty). Under
  // BF16, dy is staged once for both products, its column sums (db) taken in the same pass.
  void linear_backward(M dx, M dw, S db, CM dy, CM x, CM w, Store dx_store = Store::add) const {
    checks::linear_backward_shapes<T>(dx, dw, db, dy, x, w);
    const T dx_beta = dx_store == Store::add ? T(1) : T(0);
    if constexpr (std::is_same_v<T, float>) {
      if (!dx.empty() && !dw.empty() && dy.rows > 0 && bf16_products(dy, Trans::N))
        return backward_staged(dx, dw, dy, x, w, dy.cols, dx_beta, db.empty() ? nullptr : db.data());
    }
    if (!dx.empty()) gemm(dx, dy, Trans::N, w, Trans::N, T(1), dx_beta);
    if (!dw.empty()) gemm(dw, dy, Trans::T, x, Trans::N, T(1), T(1));
    if (!db.empty()) K::add_column_sums(*ctx_, db.data(), dy);
  }

  // The LM head tied to the token embedding (ModelInstance calls these where a backend has them): logits = x·wᵀ,
  // and backward dx += dlogits·w, dw += dlogitsᵀ·x. The logits' rows own their padding columns [cols, ld)
  // (ModelInstance lays them out padded_ld(vocab) wide: backend_concept.hpp, row_align). Under BF16 the forward and
  // the dx product run over that padded width, with zero rows staged below w and zeros staged for dlogits' padding,
  // so that their extent (the vocabulary: m of the forward, k of dx) is aligned like their rows: cuBLAS keeps an
  // odd extent on Turing-era kernels with every leading dimension aligned (bench/RESULTS.md, fourteenth session).
  // The forward writes the padding columns (zeros); the results in [0, cols) equal linear_forward / linear_backward's.
  void lm_head_forward(M logits, CM x, CM w) const {
    checks::linear_forward_shapes<T>(logits, x, w, CS{});
    if constexpr (std::is_same_v<T, float>) {
      const index_t vp = padded_vocab(logits);
      if (vp != logits.cols && bf16_products(x, Trans::N)) {
        cuda::reserve_bf16_staging(*ctx_, staged_size(x) + vp * staged_ld(w));
        const Staged sx = stage(ctx_->bf16_stage, x);
        const Staged sw = stage(ctx_->bf16_stage + staged_size(x), w, vp, w.cols);
        return gemm_staged(M(logits.data, logits.rows, vp, logits.ld), sx, Trans::N, sw, Trans::T, 1.0f, 0.0f);
      }
    }
    linear_forward(logits, x, w, CS{});
  }
  void lm_head_backward(M dx, M dw, CM dlogits, CM x, CM w) const {
    checks::linear_backward_shapes<T>(dx, dw, S{}, dlogits, x, w);
    if constexpr (std::is_same_v<T, float>) {
      const index_t vp = padded_vocab(dlogits);
      if (vp != dlogits.cols && !dx.empty() && !dw.empty() && dlogits.rows > 0 && bf16_products(dlogits, Trans::N))
        return backward_staged(dx, dw, dlogits, x, w, vp);
    }
    linear_backward(dx, dw, S{}, dlogits, x, w);
  }

  // The LM head's backward from the loss (ModelInstance calls it where a backend has it): the cross-entropy's
  // gradient dlogits = dloss·(softmax(logits) − onehot(targets)) / count, then dx += dlogits·w, dw += dlogitsᵀ·x.
  // Under BF16 the gradient is written once, as the bf16 operand of both products (cross_entropy_backward_bf16, over
  // the padded width as lm_head_backward's staging): the largest matrix of a step is not stored in fp32 and read back
  // to be staged, and the logits are left as they are. Otherwise cross_entropy_backward overwrites the logits with
  // the gradient, then lm_head_backward. The same bits either way under BF16 (the staging rounds the same fp32 values).
  void lm_head_loss_backward(M dx, M dw, M logits, CS lse, Tok targets, T dloss, CM x, CM w,
                             token_t ignore_index = -1) const {
    checks::cross_entropy_backward_shapes<T>(logits, logits, lse, targets);
    checks::linear_backward_shapes<T>(dx, dw, S{}, logits, x, w);
    if constexpr (std::is_same_v<T, float>) {
      if (!dx.empty() && !dw.empty() && logits.rows > 0 && bf16_products(logits, Trans::N)) {
        const BackwardStage at = backward_stage_places(logits, w, x, padded_vocab(logits));
        cuda::cross_entropy_backward_bf16(*ctx_, at.dy, at.dy_ld, at.k, logits, lse.data(), targets.data(), dloss,
                                          ignore_index);
        return backward_products(dx, dw, {at.dy, logits.rows, at.k, at.dy_ld}, stage(at.w, w, at.k, w.cols),
                                 stage(at.x, x), logits.cols);
      }
    }
    cross_entropy_backward(logits, logits, lse, targets, dloss, ignore_index);
    lm_head_backward(dx, dw, logits, x, w);
  }

  void embedding_forward(M out, Tok tokens, CM wte, CM wpe, index_t seq) const {
    check_embedding_shapes("embedding_forward", out, tokens, wte, wpe, seq);
    K::embedding_forward(*ctx_, out, tokens.data(), wte, wpe, seq);
  }
  // Rows at positions of their own (a decode step's): pos in device memory; a position outside wpe is reported at
  // the next sync (the row is skipped).
  void embedding_forward(M out, Tok tokens, CM wte, CM wpe, std::span<const index_t> pos) const {
    checks::embedding_at_shapes<T>("embedding_forward", out, tokens, wte, wpe, ssize(pos));
    K::embedding_forward(*ctx_, out, tokens.data(), wte, wpe, 1, pos.data());
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
  void gelu_backward(S dx, CS x, CS dout, Store st = Store::add) const {
    checks::activation_backward_shapes<T>("gelu_backward", dx, x, dout);
    K::gelu_backward(*ctx_, dx.data(), x.data(), dout.data(), ssize(x), st == Store::add);
  }
  void relu_forward(S out, CS x) const {
    checks::activation_forward_shapes<T>("relu_forward", out, x);
    K::relu_forward(*ctx_, out.data(), x.data(), ssize(x));
  }
  void relu_backward(S dx, CS x, CS dout, Store st = Store::add) const {
    checks::activation_backward_shapes<T>("relu_backward", dx, x, dout);
    K::relu_backward(*ctx_, dx.data(), x.data(), dout.data(), ssize(x), st == Store::add);
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
    cuda::reserve_workspace(*ctx_, stick_breaking_table_bytes(batch, seq, heads));  // grows on first use only
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
  // Store::overwrite: out cleared first (an async memset), then the same additions.
  void scatter_add_rows(M out, CM in, Tok idx, CS weights = {}, Store st = Store::add) const {
    checks::scatter_add_rows_shapes<T>(out, in, idx, weights);
    if (st == Store::overwrite) clear(out);
    K::scatter_add_rows(*ctx_, out, in, idx.data(), weights.data());
  }
  void scatter_add_rows_backward(M din, S dweights, CM dout, CM in, Tok idx, CS weights = {},
                                 Store st = Store::add) const {
    checks::scatter_add_rows_backward_shapes<T>(din, dweights, dout, in, idx, weights);
    K::scatter_add_rows_backward(*ctx_, din, dweights.data(), dout, in, idx.data(), weights.data(), st == Store::add);
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

 protected:
  // The bf16 copy of an operand in the staging buffer: rows padded to a multiple of 8 elements (16 bytes, the
  // alignment cuBLAS' tensor-core kernels want; docs/cuda.md, "Precision").
  struct Staged {
    const std::uint16_t* data;
    index_t rows, cols, ld;
  };
  static index_t staged_ld(CM v) { return (std::max<index_t>(v.cols, 1) + 7) / 8 * 8; }
  static index_t staged_size(CM v) { return v.rows * staged_ld(v); }
  Staged stage(std::uint16_t* at, CM v) const { return stage(at, v, v.rows, v.cols); }
  // An operand of a BF16 product: an fp32 matrix m, staged before the product, or (bf16 set) m's bf16 copy that a
  // fused pair wrote in place of it (norm_ops.hpp: the LayerNorm's output), ld16 apart, read as it is: it takes no
  // staging space and no copy.
  struct Operand {
    CM m;
    const std::uint16_t* bf16 = nullptr;
    index_t ld16 = 0;
    Operand(CM v) : m(v) {}  // NOLINT(google-explicit-constructor): an fp32 matrix is the usual operand
    Operand(CM v, Staged in_place) : m(v), bf16(in_place.data), ld16(in_place.ld) {}
  };
  static index_t staged_ld(const Operand& v) { return v.bf16 ? v.ld16 : staged_ld(v.m); }
  static index_t staged_size(const Operand& v) { return v.bf16 ? 0 : staged_size(v.m); }
  Staged stage(std::uint16_t* at, const Operand& v) const {
    return v.bf16 ? Staged{v.bf16, v.m.rows, v.m.cols, v.ld16} : stage(at, v.m);
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
  static void check_gru_shapes(const char* op, index_t n, index_t H, CM gates, CM x, CM h, CM w_ih, CM w_hh,
                               index_t b_ih, index_t b_hh) {
    checks::gru_shapes<T>(op, n, H, gates, x, h, w_ih, w_hh, b_ih, b_hh);
  }

  // y = x·wᵀ + b as one cuBLASLt product (CUBLASLT_EPILOGUE_BIAS adds b to every column of the column-major
  // result: every row of y), in cuBLAS's terms as gemm() calls it: D [out × rows] = op(A)·op(B) with A = w
  // (transposed) and B = x. The precision's operands: fp32 (FP32, TF32 compute), or both staged as bf16 first (BF16). False where
  // cuBLASLt has no algorithm for the product (nothing staged or enqueued then).
  // With epilogue GELU_AUX_BIAS: y = gelu(x·wᵀ + b) and the pre-activation into aux (laid out as y). With a residual
  // (laid out as y; the bias epilogue only): y = x·wᵀ + b + residual, cuBLASLt's C with beta = 1.
  // Under BF16, x may be a bf16 copy in place already (Operand), read as it is.
  bool linear_forward_lt(M y, Operand xo, CM w, CS b, cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS,
                         M aux = M{}, CM residual = CM{}) const {
    const CM x = xo.m;
    if (y.rows == 0 || y.cols == 0 || x.cols == 0) return false;
    LtProduct g{int(y.cols), int(y.rows), int(x.cols), CUBLAS_OP_T, CUBLAS_OP_N, ld(w.ld), ld(x.ld), ld(y.ld)};
    g.epilogue = epilogue;
    g.ld_aux = aux.data ? ld(aux.ld) : 0;
    if (ctx_->precision == Precision::BF16) {
      // The staged copies' places (stage() lays them out so) decide the plan before anything is converted.
      cuda::reserve_bf16_staging(*ctx_, staged_size(xo) + staged_size(w));
      std::uint16_t* at = ctx_->bf16_stage;
      const std::uint16_t* sx = xo.bf16 ? xo.bf16 : at;
      std::uint16_t* sw = at + staged_size(xo);
      g.ab_type = CUDA_R_16BF;
      g.lda = ld(staged_ld(w)), g.ldb = ld(staged_ld(xo));
      LtPlan* p = lt_plan(*ctx_, g, sw, sx, y.data, b.data(), aux.data, residual.data);
      if (!p) return false;
      const Staged a = stage(sw, w), bx = stage(at, xo);  // (a weight's copy: 256-byte aligned, as its plan allows)
      return lt_run(*ctx_, *p, 1.0f, a.data, bx.data, y.data, b.data(), aux.data, residual.data);
    }
    MOM_CHECK(!xo.bf16, "linear_forward: a bf16 operand outside Precision::BF16");
    g.compute = lt_compute();
    LtPlan* p = lt_plan(*ctx_, g, w.data, x.data, y.data, b.data(), aux.data, residual.data);
    return p && lt_run(*ctx_, *p, 1.0f, w.data, x.data, y.data, b.data(), aux.data, residual.data);
  }
  // linear_backward_dgelu's products with the dx one on cuBLASLt (CUBLASLT_EPILOGUE_DGELU, aux = pre): in cuBLAS's
  // terms D [in × rows] = op(A)·op(B) with A = w, B = dy, both not transposed. False, with nothing staged or
  // enqueued, where cuBLASLt has no algorithm for it.
  bool backward_dgelu_lt(M dpre, M dw, S db, CM dy, CM act, CM w, CM pre) const {
    if (dpre.rows == 0 || dpre.cols == 0 || dy.cols == 0) return false;
    LtProduct g{int(dpre.cols), int(dpre.rows), int(dy.cols), CUBLAS_OP_N, CUBLAS_OP_N, ld(w.ld), ld(dy.ld),
                ld(dpre.ld)};
    g.epilogue = CUBLASLT_EPILOGUE_DGELU;
    g.ld_aux = ld(pre.ld);
    if (ctx_->precision == Precision::BF16) {
      // One staging of dy (its column sums into db), w and act, in backward_staged's places.
      const BackwardStage at = backward_stage_places(dy, w, act, dy.cols);
      g.ab_type = CUDA_R_16BF;
      g.lda = ld(staged_ld(w)), g.ldb = ld(staged_ld(dy));
      LtPlan* p = lt_plan(*ctx_, g, at.w, at.dy, dpre.data, nullptr, pre.data);
      if (!p) return false;
      const auto [sdy, sw, sx] = stage_backward(at, dy, w, act, db.empty() ? nullptr : db.data());
      if (!lt_run(*ctx_, *p, 1.0f, sw.data, sdy.data, dpre.data, nullptr, pre.data)) {
        gemm_staged(dpre, sdy, Trans::N, sw, Trans::N, 1.0f, 0.0f);  // refused: dy is staged already
        dgelu_in_place(dpre, pre);
      }
      gemm_staged(dw, sdy, Trans::T, sx, Trans::N, 1.0f, 1.0f);
      return true;
    }
    g.compute = lt_compute();
    LtPlan* p = lt_plan(*ctx_, g, w.data, dy.data, dpre.data, nullptr, pre.data);
    if (!p || !lt_run(*ctx_, *p, 1.0f, w.data, dy.data, dpre.data, nullptr, pre.data)) return false;
    gemm(dw, dy, Trans::T, act, Trans::N, T(1), T(1));
    if (!db.empty()) K::add_column_sums(*ctx_, db.data(), dy);
    return true;
  }
  void add_residual(M y, CM residual) const {
    if (!residual.empty()) add_forward(y.flat(), CM(y).flat(), residual.flat());
  }
  // A pair's residual: empty, or dense and of its output's shape (the flat add and cuBLASLt's C, laid out as D).
  static void check_residual(const char* op, CM y, CM residual) {
    MOM_CHECK(residual.empty() || (residual.rows == y.rows && residual.cols == y.cols && residual.ld == residual.cols &&
                                   y.ld == y.cols),
              op, ": the residual ", shape(residual), " must be dense and of the output's shape ", shape(y),
              ", which must be dense too");
  }
  cublasComputeType_t lt_compute() const {
    return ctx_->precision == Precision::FP32 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_FAST_TF32;
  }
  // dpre = dpre ∘ gelu'(pre): the GELU's backward in place (elementwise), after a product wrote dL/d(act) into dpre.
  void dgelu_in_place(M dpre, CM pre) const { gelu_backward(dpre.flat(), pre.flat(), CM(dpre).flat(), Store::overwrite); }
  // The fused GELU ops' second matrix has the first's shape, and both are dense (the GELU kernels' flat spans).
  static void check_gelu_pair(const char* op, CM a, CM b) {
    MOM_CHECK(a.rows == b.rows && a.cols == b.cols && a.ld == a.cols && b.ld == b.cols,
              op, ": the activation and the pre-activation must be dense matrices of one shape");
  }

  static cublasOperation_t op(Trans t) { return t == Trans::T ? CUBLAS_OP_T : CUBLAS_OP_N; }
  static int ld(index_t x) { return static_cast<int>(std::max<index_t>(x, 1)); }

  // Precision::BF16 products: a float GEMM with a nonempty inner dimension (A's columns under N, its rows under T).
  bool bf16_products(CM A, Trans ta) const {
    return ctx_->precision == Precision::BF16 && (ta == Trans::N ? A.cols : A.rows) > 0;
  }
  // v staged as a [rows × cols] block (zeros outside v; cols a multiple of 8 or v's staged width) at `at`; with
  // col_sums, v's column sums added to it in the same pass. A weight, v lying in an open window's block
  // (weight_copies.hpp), is read from its copy instead, converted the first time the window reads it: `at` is not
  // written, and the caller takes the returned place.
  Staged stage(std::uint16_t* at, CM v, index_t rows, index_t cols, float* col_sums = nullptr) const {
    const index_t ld = std::max(cols, staged_ld(v));
    if constexpr (std::is_same_v<T, float>) {
      WeightCopy* copy = col_sums ? nullptr : ctx_->weight_copies->find(v, rows, cols, ld);
      if (copy && !copy->fresh) {
        to_bf16(*ctx_, copy->data, ld, v, rows, cols);
        copy->fresh = true;
        ++ctx_->weight_copies->conversions;
      }
      if (copy) return {copy->data, rows, cols, ld};
    }
    to_bf16(*ctx_, at, ld, v, rows, cols, col_sums);
    return {at, rows, cols, ld};
  }
  // The width an LM head's products may run over: the logits' row stride when it is a multiple of 8 and within
  // logits_row_align of the vocabulary (the padding ModelInstance lays out), else the vocabulary itself.
  static index_t padded_vocab(CM logits) {
    const index_t ld = logits.ld;
    return ld > logits.cols && ld % 8 == 0 && ld - logits.cols < logits_row_align ? ld : logits.cols;
  }
  // A linear's dx += dy·w and dw += dyᵀ·x from one staging of dy, w and x (bf16), dy staged k columns wide and w k
  // rows tall (k >= dy.cols; zeros beyond them: the LM head's padded width), so that dx's inner dimension is k. With
  // db: db += Σ_rows dy, summed while dy is staged (no second read of dy).
  void backward_staged(M dx, M dw, CM dy, const Operand& x, CM w, index_t k, float dx_beta = 1.0f,
                       float* db = nullptr) const {
    const auto [sdy, sw, sx] = stage_backward(backward_stage_places(dy, w, x, k), dy, w, x, db);
    backward_products(dx, dw, sdy, sw, sx, dy.cols, dx_beta);
  }
  // The two products of a staged backward: dx = dy·w (+ dx_beta·dx) over the staged dy's k columns, dw += dyᵀ·x over
  // its first dy_cols (dw's rows).
  void backward_products(M dx, M dw, Staged sdy, Staged sw, Staged sx, index_t dy_cols, float dx_beta = 1.0f) const {
    gemm_staged(dx, sdy, Trans::N, sw, Trans::N, 1.0f, dx_beta);                                 // inner dimension k
    gemm_staged(dw, {sdy.data, sdy.rows, dy_cols, sdy.ld}, Trans::T, sx, Trans::N, 1.0f, 1.0f);  // dw's rows: dy.cols
  }
  // A backward's staging places (the staging reserved): dy k columns wide, then w k rows tall, then x; a caller may
  // ask cuBLASLt for a plan over them before anything is converted (backward_dgelu_lt).
  struct BackwardStage {
    std::uint16_t *dy, *w, *x;
    index_t k, dy_ld;  // dy's staged rows are dy_ld apart (as stage(at.dy, dy, dy.rows, k) lays them out)
  };
  BackwardStage backward_stage_places(CM dy, CM w, const Operand& x, index_t k) const {
    const index_t dy_ld = std::max(k, staged_ld(dy)), dy_size = dy.rows * dy_ld, w_size = k * staged_ld(w);
    cuda::reserve_bf16_staging(*ctx_, dy_size + w_size + staged_size(x));
    std::uint16_t* at = ctx_->bf16_stage;
    return {at, at + dy_size, at + dy_size + w_size, k, dy_ld};
  }
  // dy, w and x staged in those places (with db: db += Σ_rows dy, summed while dy is staged).
  struct BackwardStaged {
    Staged dy, w, x;
  };
  BackwardStaged stage_backward(const BackwardStage& at, CM dy, CM w, const Operand& x, float* db) const {
    return {stage(at.dy, dy, dy.rows, at.k, db), stage(at.w, w, at.k, w.cols), stage(at.x, x)};
  }
  // C = alpha·op(A)·op(B) + beta·C from staged operands (bf16 tensor cores, fp32 accumulation and C); shapes
  // checked by the caller.
  void gemm_staged(M C, Staged A, Trans ta, Staged B, Trans tb, float alpha, float beta) const {
    const index_t k = ta == Trans::N ? A.cols : A.rows;
    MOM_CUBLAS_CHECK(cublasGemmEx(ctx_->blas, op(tb), op(ta), static_cast<int>(C.cols), static_cast<int>(C.rows),
                                  static_cast<int>(k), &alpha, B.data, CUDA_R_16BF, ld(B.ld), A.data, CUDA_R_16BF,
                                  ld(A.ld), &beta, C.data, CUDA_R_32F, ld(C.ld), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     "gemm (bf16)");
  }

  std::shared_ptr<Context> ctx_;  // shared by copies of the backend (docs/cuda.md, "Ownership")
};

}  // namespace detail
}  // namespace mom::cuda

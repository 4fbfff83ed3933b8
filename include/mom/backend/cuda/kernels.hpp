#pragma once
// Host-side declarations of the CUDA backend's kernel launchers. This header is plain C++ (any
// host compiler reads it); the definitions live in kernels/*.cuh (one file per op family, each
// with its kernels and their launchers) and are compiled by nvcc into the mom::cuda library
// (mom_cuda.cu: explicit instantiations for float and double).
//
// The launchers do no shape checking: mom::cuda::Backend checks shapes (with the same messages
// as the CPU ops) and then calls them. Every launcher enqueues on ctx.stream and returns without
// waiting; a launch failure throws mom::Error naming the op.
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "mom/core/groups.hpp"
#include "mom/core/tensor.hpp"

namespace mom::cuda {

// Index errors found on the device (a token id, target or row index out of range). The CPU ops
// throw before doing any work; a kernel cannot, so it skips the offending row and records the
// first error in Context::error ({code, position, value, bound}); the backend throws it at the
// next host synchronisation (read, to_host, sync).
enum class DeviceError : int {
  none = 0,
  embedding_token,
  embedding_backward_token,
  cross_entropy_target,
  gather_index,
  scatter_index,
  scatter_backward_index,
  topk_backward_index,
  group_module,
  group_choice,
  packed_positions,
  selection_index,  // depth routing: selection_mask (depth_kernels.hpp)
  group_offsets,    // grouped ops: RowGroups offsets outside [0, rows] or decreasing (grouped attention, grouped_kernels.hpp)
  rope_position,    // rope_forward / rope_backward: a negative position or token index, or pos[r] >= seq
  decode_position,  // stick_breaking_decode: a slot or position outside the cache (the row is skipped)
  kv_write_position,          // kv_write: the same
  attention_decode_position,  // attention_decode: the same
  embedding_position,         // embedding_forward at rows' own positions: a position outside wpe (the row is skipped)
};

// Precision of float matrix products (double always runs in fp64): the GEMMs (cuBLAS and the
// grouped GEMM) and the products inside the dense attention at head dims 64 and 128
// (kernels/attention_tc.cuh). Parameters, gradients, activations, AdamW moments and every other own
// kernel stay fp32, so BF16 is mixed precision with fp32 master weights.
enum class Precision : int {
  FP32,  // fp32 inputs, fp32 accumulate (no tensor cores)
  TF32,  // inputs rounded to TF32 (10-bit mantissa) on tensor cores, fp32 accumulate (the default)
  BF16,  // both operands staged as bf16 (round to nearest even, 7-bit mantissa), bf16 tensor cores,
         // fp32 accumulate and fp32 output (cublasGemmEx 16BF x 16BF -> 32F, CUBLAS_COMPUTE_32F)
};

// The grouped weight gradients (kernels/grouped_linear.cuh) take the tensor cores' 128 × 128 tile only where it gives
// at least this many blocks, the 64 × 64 one below (the same dW bits; the tests pick shapes on either side): two
// blocks for each of an H100's or H200's 132 multiprocessors (with 128 × 128 tiles moeut8's SwitchHead dW_g ran
// 16 blocks a launch).
inline constexpr index_t dw_wide_tile_blocks = 264;
// Where even the 64 × 64 tile gives fewer than dw_wide_tile_blocks blocks (few, small dW_g over many rows: moeut8's
// SwitchHead dW ran 16 blocks a launch, each over its expert's whole row group), the rows are split (split-K): slice s
// of S of every group's rows goes to blocks of its own, whose partial dW_g and db_g go to the context's workspace, and
// a second kernel adds the S partials in slice order to dW and db (deterministic; the bits differ from the unsplit
// sums only by the order of the additions). Each slice keeps at least dw_split_min_rows rows of an average group.
inline constexpr index_t dw_split_min_rows = 256;
// The number of row slices S for a grouped dW launch of `blocks` blocks over `rows` packed rows in `count` groups, of
// dW_g [m × n] and db_g [m] in elements of `elem_bytes`: enough slices for dw_wide_tile_blocks blocks, at most one per
// dw_split_min_rows rows of an average group (group sizes stay on the device), and S partials within `workspace`
// bytes; 1 (no split) below two.
inline int dw_splits(index_t blocks, index_t rows, int count, index_t m, index_t n, std::size_t elem_bytes,
                     std::size_t workspace) {
  if (blocks <= 0 || blocks >= dw_wide_tile_blocks || count <= 0) return 1;
  index_t s = (dw_wide_tile_blocks + blocks - 1) / blocks;
  s = std::min(s, rows / count / dw_split_min_rows);
  const std::size_t slice_bytes = std::size_t(count) * std::size_t(m * n + m) * elem_bytes;
  s = std::min(s, index_t(workspace / slice_bytes));
  return s < 2 ? 1 : int(s);
}

// The stick-breaking backward's second pass takes key tiles of this many keys; its first pass leaves each query row's
// D_i and its softplus and g·p suffixes above every key tile (doubles) in the context's workspace: this many bytes.
inline constexpr index_t stick_breaking_key_tile = 64;
inline std::size_t stick_breaking_table_bytes(index_t batch, index_t seq, index_t heads) {
  const index_t tiles = (seq + stick_breaking_key_tile - 1) / stick_breaking_key_tile;
  return sizeof(double) * std::size_t(batch * heads * seq) * std::size_t(1 + 2 * tiles);
}

// Per-backend state shared by the launchers: the stream, the cuBLAS handle and small device
// scratch, all created once by the backend (never inside a step, except that the CUB temp storage
// of group_by_module grows on its first use unless reserve_dispatch sized it).
namespace detail {
struct LtPlans;       // lt.hpp
struct WeightCopies;  // weight_copies.hpp
}

struct Context {
  static constexpr int reduce_blocks = 1024;  // grid of the two-pass reductions (grad_norm)
  static constexpr int entropy_classes = 1024;  // most classes selection_entropy_forward takes
  // selection_entropy_forward's per-chunk column sums: room for every sequence's (classes + 1) at one chunk each.
  static constexpr index_t entropy_partials = index_t(reduce_blocks) * (entropy_classes + 1);

  int device = 0;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  cublasLtHandle_t lt = nullptr;          // cuBLASLt: the GEMMs with a fused epilogue (lt.hpp)
  // device [workspace_bytes]: cuBLASLt's workspace, the partial sums of the grouped weight gradients split over their
  // rows (dw_splits) and the stick-breaking backward's table (stick_breaking_table_bytes). Each is used only between
  // its launches on ctx.stream, so they never overlap; reserve_workspace grows it.
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  detail::LtPlans* lt_plans = nullptr;    // host: the cuBLASLt plans made so far (owned)
  Precision precision = Precision::TF32;  // of float GEMMs
  std::uint16_t* bf16_stage = nullptr;    // device [bf16_stage_size]: the two bf16 GEMM operands (Precision::BF16)
  index_t bf16_stage_size = 0;
  index_t bf16_stage_grows = 0;           // how often the staging buffer grew (tests: never inside a step)
  detail::WeightCopies* weight_copies = nullptr;  // host: the weights' bf16 copies and the open window (owned)
  index_t scratch_grows = 0;              // how often any scratch buffer was replaced (staging.hpp, regrow): a
                                          // recorded graph holds the old pointers
  int* error = nullptr;            // device [4]: DeviceError code, position, value, bound
  double* partials = nullptr;      // device [reduce_blocks]
  double* entropy = nullptr;       // device [entropy_partials]
  int* count = nullptr;            // device [1]: non-ignored targets of the last cross-entropy call
  void* cub_temp = nullptr;        // device: CUB temp storage for group_by_module
  std::size_t cub_temp_bytes = 0;
  token_t* pair_ids = nullptr;     // device [pair_ids_size]: 0, 1, 2, ... (group_by_module's values)
  index_t pair_ids_size = 0;
  int* counts = nullptr;           // device [counts_size]: group_by_module's per-module counts
  index_t counts_size = 0;
  token_t* sorted_keys = nullptr;  // device [pair_ids_size]: group_by_choice's sorted classes
  index_t dispatch_pairs = 0, dispatch_modules = 0;  // what reserve_dispatch last sized for
};

// Bytes of CUB temp storage group_by_module needs for n_pairs pairs and n_modules modules.
std::size_t group_by_module_temp_bytes(index_t n_pairs, index_t n_modules);

// sorted_ids[j]: the pair indices (0 .. n-1) stably sorted by modules[pair]; sorted_modules[j]:
// their module ids; offsets[m] .. offsets[m+1]: the group of module m (offsets has n_modules + 1
// entries, offsets[n_modules] = n). counts is device scratch [n_modules + 1]. Temp storage must be
// at least group_by_module_temp_bytes(n, n_modules) (ctx.cub_temp), ctx.pair_ids at least n.
// A module id outside [0, n_modules) is reported as DeviceError::group_module (and sorts last).
void group_by_module(const Context& ctx, token_t* sorted_ids, token_t* sorted_modules, token_t* offsets, int* counts,
                     const token_t* modules, index_t n, index_t n_modules,
                     DeviceError code = DeviceError::group_module);
// out[r * out_ld + c] = bf16(in(r, c)) (copy of a strided view into rows out_ld apart; round to nearest even,
// NaN kept NaN) over a block of max(rows, in.rows) × max(cols, in.cols), zeros outside `in`: the staging of a GEMM
// operand under Precision::BF16. bf16 values are passed as their 16 bits (the top half of the fp32 bit pattern),
// so this header needs no CUDA fp16 types. With col_sums: also col_sums[c] += Σ_r in(r, c) for c < in.cols, in the
// same pass (linear_backward's bias gradient from the dy it stages).
void to_bf16(const Context& ctx, std::uint16_t* out, index_t out_ld, MatrixView<const float> in, index_t rows = 0,
             index_t cols = 0, float* col_sums = nullptr);

// The cross-entropy's gradient, dloss·(softmax(logits) − onehot(targets)) / count (Kernels::cross_entropy_backward),
// written as bf16 bits into rows out_ld apart, max(width, logits.cols) columns (zeros beyond the logits' columns and in
// rows whose target is ignore_index): the LM head's dlogits staged for its products without an fp32 copy. The logits
// are only read. A target outside [0, logits.cols) other than ignore_index is reported at the next sync.
void cross_entropy_backward_bf16(const Context& ctx, std::uint16_t* out, index_t out_ld, index_t width,
                                 MatrixView<const float> logits, const float* lse, const token_t* targets, float dloss,
                                 token_t ignore_index);

// The MLP's bf16 layout under BF16 (mlp_ops.hpp), bf16 values as their 16 bits: acc[c] += Σ_r m[r·ld + c] for c < cols
// (its bias gradient from d(pre)); dpre[i] = bf16(dact[i] · gelu'(pre[i])) (DGELU where cuBLASLt refused it).
void bf16_column_sums(const Context& ctx, float* acc, const std::uint16_t* m, index_t rows, index_t cols, index_t ld);
void dgelu_bf16(const Context& ctx, std::uint16_t* dpre, const float* dact, const std::uint16_t* pre, index_t n);
// layernorm_forward with its output written as bf16 bits into rows out_ld apart (norm_ops.hpp's bf16 layout): the bits
// to_bf16 makes of layernorm_forward's output, without the fp32 copy.
void layernorm_forward_bf16(const Context& ctx, std::uint16_t* out, index_t out_ld, float* mean, float* rstd,
                            MatrixView<const float> x, const float* gamma, const float* beta, float eps);

// Dense causal attention with its output O as bf16 bits, rows out_ld apart (attention_ops.hpp's layout; the bits
// to_bf16 makes of attention_forward's fp32 O): attention_forward_bf16 returns false and launches nothing where its
// kernels do not apply (not BF16, head dim not 64 or 128); attention_backward_bf16 reads that O (D = rowsum(dO ∘ O)),
// and accumulates dqkv (+=) or, in the second form (the pair's gradient layout), adds dQ into dq (fp32, rows dq_ld
// apart: the caller zeroes it first and converts it after) and writes dK and dV as bf16 bits into rows dkv_ld apart
// (dK at column 0, dV at column d), the bits to_bf16 makes of the fp32 values the first form adds.
// With qkv16 (not null) Q, K and V are read from those bf16 bits instead of qkv's fp32 values: rows qkv.cols apart,
// qkv's shape (the attention-linear pair's qkv layout, attention_ops.hpp); qkv only gives the shape then.
bool attention_forward_bf16(const Context& ctx, std::uint16_t* out, index_t out_ld, float* lse,
                            MatrixView<const float> qkv, index_t batch, index_t seq, index_t heads,
                            const std::uint16_t* qkv16 = nullptr);
// Whether their bf16-qkv instances apply at head dim hd (BF16, hd 64, launchable): where they do, a qkv may be laid out
// in bf16 for them (norm_ops.hpp), which they read with O in bf16 as above or, with the forms below, in fp32 (rows
// out_ld apart: an attention output the bf16 layout does not fit; the backward's dqkv then accumulated (+=)).
bool attention_takes_bf16_qkv(const Context& ctx, index_t hd);
void attention_forward_bf16(const Context& ctx, MatrixView<float> out, float* lse, MatrixView<const float> qkv,
                            index_t batch, index_t seq, index_t heads, const std::uint16_t* qkv16);
void attention_backward_bf16(const Context& ctx, MatrixView<float> dqkv, MatrixView<const float> dout,
                             MatrixView<const float> out, const float* lse, MatrixView<const float> qkv, index_t batch,
                             index_t seq, index_t heads, const std::uint16_t* qkv16);
void attention_backward_bf16(const Context& ctx, MatrixView<float> dqkv, MatrixView<const float> dout,
                             const std::uint16_t* out, index_t out_ld, const float* lse, MatrixView<const float> qkv,
                             index_t batch, index_t seq, index_t heads, const std::uint16_t* qkv16 = nullptr);
void attention_backward_bf16(const Context& ctx, float* dq, index_t dq_ld, std::uint16_t* dkv, index_t dkv_ld,
                             MatrixView<const float> dout, const std::uint16_t* out, index_t out_ld, const float* lse,
                             MatrixView<const float> qkv, index_t batch, index_t seq, index_t heads,
                             const std::uint16_t* qkv16 = nullptr);

// rows[i] = slots[i] / k (group_by_choice: a slot r·K + j belongs to token row r).
void slots_to_rows(const Context& ctx, token_t* rows, const token_t* slots, index_t n, index_t k);

// dst[i] = value for i < n (U = float, double or token_t).
template <class U>
void fill(const Context& ctx, U* dst, index_t n, U value);

// The op launchers for scalar T (float, double). Argument order follows the CPU ops.
template <class T>
struct Kernels {
  using M = MatrixView<T>;
  using CM = MatrixView<const T>;

  // y[r, :] = b for every row (linear_forward's bias, before y += x·wᵀ).
  static void broadcast_rows(const Context& ctx, M y, const T* b);
  // acc[c] += Σ_r m(r, c) (bias gradients); atomics across row chunks.
  static void add_column_sums(const Context& ctx, T* acc, CM m);

  // Row t at position t mod seq, or at pos[t] when pos is given.
  static void embedding_forward(const Context& ctx, M out, const token_t* tokens, CM wte, CM wpe, index_t seq,
                                const index_t* pos = nullptr);
  static void embedding_backward(const Context& ctx, M dwte, M dwpe, CM dout, const token_t* tokens, index_t seq,
                                 index_t vocab);

  static void layernorm_forward(const Context& ctx, M out, T* mean, T* rstd, CM x, const T* gamma, const T* beta,
                                T eps);
  static void layernorm_backward(const Context& ctx, M dx, T* dgamma, T* dbeta, CM dout, CM x, const T* mean,
                                 const T* rstd, const T* gamma);

  static void gelu_forward(const Context& ctx, T* out, const T* x, index_t n);
  // dx += dout · act'(x) (add), or dx = dout · act'(x).
  static void gelu_backward(const Context& ctx, T* dx, const T* x, const T* dout, index_t n, bool add);
  static void relu_forward(const Context& ctx, T* out, const T* x, index_t n);
  static void relu_backward(const Context& ctx, T* dx, const T* x, const T* dout, index_t n, bool add);
  static void add_forward(const Context& ctx, T* out, const T* a, const T* b, index_t n);
  static void axpy(const Context& ctx, T* y, T alpha, const T* x, index_t n);
  static void scale(const Context& ctx, T* y, T alpha, index_t n);

  static void cross_entropy_forward(const Context& ctx, T* loss_out, T* lse, CM logits, const token_t* targets,
                                    token_t ignore_index);
  static void cross_entropy_backward(const Context& ctx, M dlogits, CM logits, const T* lse, const token_t* targets,
                                     T dloss, token_t ignore_index);

  // Dense causal attention. Float with Precision::TF32 / BF16 at head dims 64 and 128 runs on
  // tensor cores (kernels/attention_tc.cuh: operands, P and dS rounded to TF32 / bf16, fp32 statistics);
  // everything else on the SIMT kernels of kernels/attention.cuh. Same outputs and layout either way.
  static void attention_forward(const Context& ctx, M out, T* lse, CM qkv, index_t batch, index_t seq, index_t heads);
  static void attention_backward(const Context& ctx, M dqkv, CM dout, CM out, const T* lse, CM qkv, index_t batch,
                                 index_t seq, index_t heads);

  // Stick-breaking attention (ModuleFormer, arXiv 2306.04640; cpu/stick_breaking.hpp, kernels/stick_breaking.cuh):
  // forward saves nothing; backward reads forward's out (D_i = dO_i·o_i) and needs stick_breaking_table_bytes of
  // ctx.workspace (reserve_workspace). Decode: slot and pos in device memory, one per row of qkv; a row outside the
  // cache is DeviceError::decode_position.
  static void stick_breaking_forward(const Context& ctx, M out, CM qkv, index_t batch, index_t seq, index_t heads,
                                     index_t kv_heads);
  static void stick_breaking_backward(const Context& ctx, M dqkv, CM dout, CM out, CM qkv, index_t batch, index_t seq,
                                      index_t heads, index_t kv_heads);
  static void stick_breaking_decode(const Context& ctx, M out, CM qkv, CM k_cache, CM v_cache, const index_t* slot,
                                    const index_t* pos, index_t max_len, index_t heads, index_t kv_heads);

  // Rotary position embedding in place (cpu/rope.hpp, kernels/rope.cuh): x's head_dim chunks rotated by
  // +p·θ_i (forward) or −p·θ_i (inverse: backward). Row r's position p: pos[r] when pos is given, else
  // (idx ? idx[r] : r) mod seq; grouped: only the rows [offsets[0], offsets[count]) of g (read on the
  // device). A negative position or index (or pos[r] >= seq) is DeviceError::rope_position; the row is
  // left as it is.
  static void rope(const Context& ctx, M x, const index_t* pos, const token_t* idx, RowGroups g, bool grouped,
                   index_t seq, index_t head_dim, double base, bool inverse);

  static void gather_rows(const Context& ctx, M out, CM in, const token_t* idx);
  static void scatter_add_rows(const Context& ctx, M out, CM in, const token_t* idx, const T* weights);
  static void scatter_add_rows_backward(const Context& ctx, M din, T* dweights, CM dout, CM in, const token_t* idx,
                                        const T* weights, bool add);

  static void topk_rows(const Context& ctx, M values, MatrixView<token_t> indices, CM x);
  static void topk_rows_backward(const Context& ctx, M dx, CM dvalues, MatrixView<const token_t> indices);
  static void softmax_rows(const Context& ctx, M y, CM x, T scale);
  static void softmax_rows_backward(const Context& ctx, M dx, CM dy, CM y, T scale);

  // The GRU cell's pointwise parts (the GEMMs run through cuBLAS in the backend).
  static void gru_pointwise_forward(const Context& ctx, M h_out, CM gates, CM h);
  static void gru_pointwise_backward(const Context& ctx, M scratch, M dh, CM dh_out, CM gates, CM h);

  // Routed assembly (cpu/routing.hpp).
  static void route_topk_forward(const Context& ctx, M weights, MatrixView<token_t> picks, M probs, CM logits,
                                 T inv_temp, bool renormalise);
  static void route_topk_backward(const Context& ctx, M dlogits, CM dweights, CM weights, CM probs,
                                  MatrixView<const token_t> picks, T inv_temp, bool renormalise,
                                  const T* dprobs_col);
  static void balance_loss_forward(const Context& ctx, T* loss_out, T* dprobs_col, CM probs, const token_t* offsets,
                                   index_t k, T coef);
  static void selection_entropy_forward(const Context& ctx, T* loss_out, M dlogits, CM logits, index_t batch,
                                        index_t seq, T coef, T cond_coef);
  static void router_z_loss_forward(const Context& ctx, T* loss_out, M dlogits, CM logits, T inv_temp, T coef);
  // Affinity routing (DeepSeekMoE; cpu/affinity.hpp, kernels/affinity.cuh).
  static void affinity_topk_forward(const Context& ctx, M weights, MatrixView<token_t> picks, M probs, CM scores,
                                    const T* bias, index_t shared, index_t groups, index_t top_groups, bool renormalise,
                                    T scale);
  static void affinity_topk_backward(const Context& ctx, M dscores, CM dweights, CM scores,
                                     MatrixView<const token_t> picks, index_t shared, bool renormalise, T scale,
                                     const T* dprobs_col);
  static void expert_load_add(const Context& ctx, T* load, const token_t* offsets, index_t classes);
  static void bias_balance_update(const Context& ctx, T* bias, const T* load, index_t E, T rate);
  static void sequence_balance_forward(const Context& ctx, T* loss_out, M dscores, M freq, CM scores,
                                       MatrixView<const token_t> picks, index_t shared, index_t seq, T coef);
  // Expert-choice routing (cpu/expert_choice.hpp, kernels/expert_choice.cuh).
  static void expert_choice_forward(const Context& ctx, M weights, MatrixView<token_t> picks, CM probs, index_t capacity);
  static void expert_choice_backward(const Context& ctx, M dprobs, CM dweights, MatrixView<const token_t> picks);
  // Incremental decoding (cpu/decode.hpp, kernels/decode.cuh); slot and pos are device arrays.
  static void kv_write(const Context& ctx, M k_cache, M v_cache, CM qkv, const index_t* slot, const index_t* pos,
                       index_t max_len);
  static void attention_decode(const Context& ctx, M out, CM qkv, CM k_cache, CM v_cache, const index_t* slot,
                               const index_t* pos, index_t max_len, index_t heads);
  static void attention_packed_forward(const Context& ctx, M out, T* lse, CM q, CM k, CM v, const token_t* q_tok,
                                       const token_t* k_tok, index_t seq, index_t heads);
  static void attention_packed_backward(const Context& ctx, M dq, M dk, M dv, CM dout, CM out, const T* lse, CM q,
                                        CM k, CM v, const token_t* q_tok, const token_t* k_tok, index_t seq,
                                        index_t heads);
  // The packed attention per row group (cpu/grouped.hpp); the same kernels as the packed op, which
  // is one group. g.offsets stay on the device; the grids follow q.rows, g.count and kv_rows.
  static void attention_grouped_forward(const Context& ctx, M out, T* lse, CM q, PerGroup<const T> k,
                                        PerGroup<const T> v, index_t kv_rows, index_t kv_ld, const token_t* q_tok,
                                        const token_t* k_tok, RowGroups g, index_t seq, index_t heads);
  static void attention_grouped_backward(const Context& ctx, M dq, PerGroup<T> dk, PerGroup<T> dv, CM dout, CM out,
                                         const T* lse, CM q, PerGroup<const T> k, PerGroup<const T> v,
                                         index_t kv_rows, index_t kv_ld, const token_t* q_tok, const token_t* k_tok,
                                         RowGroups g, index_t seq, index_t heads);

  static void grad_norm(const Context& ctx, const T* grads, index_t n, T* norm_out);
  static void adamw_step(const Context& ctx, T* params, const T* grads, T* m, T* v, index_t n, T b1, T b2, T eps,
                         T decay, T step_size, T inv_sqrt_bc2, const T* grad_norm, T max_norm);
};

extern template struct Kernels<float>;
extern template struct Kernels<double>;
extern template void fill<float>(const Context&, float*, index_t, float);
extern template void fill<double>(const Context&, double*, index_t, double);
extern template void fill<token_t>(const Context&, token_t*, index_t, token_t);

}  // namespace mom::cuda

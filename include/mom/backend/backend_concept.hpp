#pragma once
// mom::Backend<Be>: the op set the library calls on a backend (modules/, assembly/, routers/, models/,
// train/), as one C++20 concept. cpu::Backend<T> and cuda::Backend<T> satisfy it (checked by a
// static_assert at the end of each backend's header); a new backend, or a wrapper that counts or
// times ops, checks itself the same way:
//
//   static_assert(mom::Backend<MyBackend<float>>, "MyBackend must satisfy mom::Backend");
//
// Each op is checked as a call on an lvalue Be& (const or non-const members both qualify) with the
// argument types the library passes, T = Be::scalar: outputs MatrixView<T> / std::span<T>, inputs
// MatrixView<const T> / std::span<const T>, indices std::span<const token_t>, per-group tensors
// PerGroup<T> / PerGroup<const T> with RowGroups. Defaulted trailing arguments the library leaves
// out are checked both with and without them. The parts (memory, dense ops, routing, grouped ops,
// depth routing, optimizer) are separate concepts, so a failure names the part and the call.
//
// Not listed: ops that only tests call (softmax_rows, attention_packed_* and their
// backwards), and each backend's own extras (cuda::Backend's sync, precision, reserve_dispatch,
// group_by_module, ...). Optional capabilities the library uses where a backend has them are their own
// concepts beside their users: dispatch::ReadsScaledRows (routing/dispatch.hpp; the CPU's grouped linear
// backward over dy = scale · table[index], not stored).
#include <concepts>
#include <cstdint>
#include <span>
#include <type_traits>

#include "mom/core/groups.hpp"
#include "mom/core/tensor.hpp"

namespace mom {

namespace backend_parts {

// Types, buffers and host/backend memory traffic.
template <class Be, class T>
concept Memory = requires(Be& be, index_t n, std::span<T> s, std::span<const T> cs, std::span<token_t> ts,
                          std::span<const token_t> cts, MatrixView<T> m, T x, token_t tok, const T* p,
                          typename Be::template Buffer<T>& buf) {
  typename Be::template Buffer<T>;
  typename Be::template Buffer<token_t>;
  typename Be::template HostBuffer<token_t>;  // host memory the backend copies from fastest (pinned on CUDA)
  { be.template alloc<T>(n) } -> std::same_as<typename Be::template Buffer<T>>;
  { be.template alloc_host<token_t>(n).span() } -> std::same_as<std::span<token_t>>;
  { be.template alloc<token_t>(n) } -> std::same_as<typename Be::template Buffer<token_t>>;
  { buf.data() } -> std::convertible_to<T*>;
  { buf.span() } -> std::convertible_to<std::span<T>>;
  be.zero(s);
  be.zero(m);
  be.fill(s, x);
  be.fill(ts, tok);
  be.copy(s, cs);
  be.copy(s, s);
  be.copy(m, MatrixView<const T>(m));  // strided matrices
  be.to_host(s, cs);
  be.to_host(ts, cts);
  be.from_host(s, cs);
  be.from_host(ts, cts);
  { be.read(p) } -> std::convertible_to<T>;
};

// The dense model's ops (embedding, LayerNorm, linear / GEMM, activations, attention (softmax and
// stick-breaking), rotary position embedding, loss) and the GRU router's cell. The decode ops are not
// part of it (kv_write, attention_decode and embedding_forward at positions are infer::DecodeBackend's;
// stick_breaking_decode is the CPU's and CUDA's, asked for by no concept yet).
template <class Be, class T>
concept DenseOps = requires(Be& be, MatrixView<T> m, MatrixView<const T> cm, std::span<T> s, std::span<const T> cs,
                            std::span<const token_t> tok, std::span<const index_t> pos, index_t i, T x) {
  { Be::Trans::N } -> std::convertible_to<typename Be::Trans>;
  { Be::Trans::T } -> std::convertible_to<typename Be::Trans>;
  be.gemm(m, cm, Be::Trans::N, cm, Be::Trans::T);
  be.gemm(m, cm, Be::Trans::N, cm, Be::Trans::N, x, x);
  be.linear_forward(m, cm, cm, cs);
  be.linear_backward(m, m, s, cm, cm, cm);
  be.linear_backward(m, m, s, cm, cm, cm, Store::overwrite);  // dx = dy·w instead of +=
  be.embedding_forward(m, tok, cm, cm, i);
  be.embedding_backward(m, m, cm, tok, i);
  be.layernorm_forward(m, s, s, cm, cs, cs);
  be.layernorm_forward(m, s, s, cm, cs, cs, x);
  be.layernorm_backward(m, s, s, cm, cm, cs, cs, cs);
  be.gelu_forward(s, cs);
  be.gelu_backward(s, cs, cs);
  be.gelu_backward(s, cs, cs, Store::overwrite);  // (core/tensor.hpp's Store: dx = ..., no zeroing first)
  be.relu_forward(s, cs);
  be.relu_backward(s, cs, cs);
  be.relu_backward(s, cs, cs, Store::overwrite);
  be.add_forward(s, cs, cs);
  be.axpy(s, x, cs);
  be.scale(s, x);
  be.attention_forward(m, s, cm, i, i, i);
  be.attention_backward(m, cm, cm, cs, cm, i, i, i);
  be.stick_breaking_forward(m, cm, i, i, i, i);           // ModuleFormer's attention (arXiv 2306.04640)
  be.stick_breaking_backward(m, cm, cm, cm, i, i, i, i);
  be.rope_forward(m, pos, i, i, x);
  be.rope_backward(m, pos, i, i, x);
  be.cross_entropy_forward(s, s, cm, tok);
  be.cross_entropy_forward(s, s, cm, tok, token_t(-1));
  be.cross_entropy_backward(m, cm, cs, tok, x);
  be.cross_entropy_backward(m, cm, cs, tok, x, token_t(-1));
  be.gather_rows(m, cm, tok);
  be.scatter_add_rows(m, cm, tok);
  be.scatter_add_rows(m, cm, tok, cs);
  be.scatter_add_rows(m, cm, tok, cs, Store::overwrite);  // out = the sum (not read; rows no entry names: 0)
  be.scatter_add_rows_backward(m, s, cm, cm, tok, cs);
  be.scatter_add_rows_backward(m, s, cm, cm, tok, cs, Store::overwrite);
  be.gru_cell_forward(m, m, cm, cm, cm, cm, cs, cs);
  be.gru_cell_backward(m, m, m, m, s, s, m, cm, cm, cm, cm, cm, cm);
};

// Routed assembly (Mixture-of-Modules, MoE, σ-MoE): router top-K, grouping by choice, balance loss, the
// selection entropy regulariser, plain top-k of rows (σ-MoE and SwitchHead select on sigmoid scores).
template <class Be, class T>
concept RoutingOps = requires(Be& be, MatrixView<T> m, MatrixView<const T> cm, MatrixView<token_t> picks,
                              MatrixView<const token_t> cpicks, std::span<T> s, std::span<const T> cs,
                              std::span<token_t> ts, std::span<const token_t> tok, index_t i, T x, bool flag) {
  be.route_topk_forward(m, picks, m, cm, x, flag);
  be.route_topk_backward(m, cm, cm, cm, cpicks, x, flag, cs);
  be.group_by_choice(ts, ts, ts, cpicks, i);
  be.balance_loss_forward(s, s, cm, tok, i, x);
  be.selection_entropy_forward(s, m, cm, i, i, x);
  be.selection_entropy_forward(s, m, cm, i, i, x, x);
  be.router_z_loss_forward(s, m, cm, x, x);          // ST-MoE's router z-loss
  be.topk_rows(m, picks, cm);
  be.topk_rows_backward(m, cm, cpicks);
  // DeepSeekMoE's affinity routing (cpu/affinity.hpp): biased top-K, loads, the bias's sign update
  be.affinity_topk_forward(m, picks, m, cm, cs, i, i, i, flag, x);
  be.affinity_topk_backward(m, cm, cm, cpicks, i, flag, x, cs);
  be.expert_load_add(s, tok);
  be.bias_balance_update(s, cs, x);
  // expert-choice MoE (cpu/expert_choice.hpp): each expert's top-c rows
  be.expert_choice_forward(m, picks, cm, i);
  be.expert_choice_backward(m, cm, cpicks);
};

// Grouped ops (core/groups.hpp): rows split into groups by offsets in backend memory, each group with
// its own parameters.
template <class Be, class T>
concept GroupedOps = requires(Be& be, MatrixView<T> m, MatrixView<const T> cm, std::span<T> s, std::span<const T> cs,
                              std::span<const token_t> tok, PerGroup<T> pg, PerGroup<const T> cpg, RowGroups g,
                              index_t i, T x) {
  be.grouped_linear_forward(m, cm, cpg, cpg, g);
  be.grouped_linear_backward(m, pg, pg, cm, cm, cpg, g);
  be.grouped_linear_backward(m, pg, pg, cm, cm, cpg, g, Store::overwrite);  // dx overwritten, not added to
  be.grouped_linear_forward(m, cm, tok, cpg, cpg, g);  // gathered: row r reads x[tok[r]]
  be.grouped_linear_backward(m, pg, pg, cm, cm, tok, cpg, g, Store::overwrite);
  be.grouped_layernorm_forward(m, s, s, cm, cpg, cpg, g);
  be.grouped_layernorm_backward(m, pg, pg, cm, cm, cs, cs, cpg, g);
  be.grouped_layernorm_backward(m, pg, pg, cm, cm, cs, cs, cpg, g, Store::overwrite);  // dx overwritten
  be.grouped_layernorm_forward(m, s, s, cm, tok, cpg, cpg, g);  // gathered: row r normalises x[tok[r]]
  be.grouped_layernorm_backward(m, pg, pg, cm, cm, tok, cs, cs, cpg, g, Store::overwrite);
  be.gelu_forward(m, cm, g);
  be.gelu_backward(m, cm, cm, g);
  be.gelu_backward(m, cm, cm, g, Store::overwrite);
  be.add_forward(m, cm, cm, g);
  be.axpy(m, x, cm, g);
  be.zero_rows(m, g);
  be.gather_rows(m, cm, tok, g);
  be.gather_rows(m, cpg, i, tok, g);
  be.scatter_add_rows(m, cm, tok, cs, g);
  be.scatter_add_rows(m, cm, tok, cs, g, Store::overwrite);
  be.scatter_add_rows(pg, i, cm, tok, g);
  be.scatter_add_rows_backward(m, s, cm, cm, tok, cs, g);
  be.scatter_add_rows_backward(m, s, cm, cm, tok, cs, g, Store::overwrite);
  be.attention_grouped_forward(m, s, cm, cpg, cpg, i, i, tok, tok, g, i, i);
  be.attention_grouped_backward(m, pg, pg, cm, cm, cs, cm, cpg, cpg, i, i, tok, tok, g, i, i);
  be.rope_forward(m, tok, i, i, x, g);
  be.rope_backward(m, tok, i, i, x, g);
};

// Depth routing (Mixture-of-Depths, layer-skip, early-exit).
template <class Be, class T>
concept DepthOps = requires(Be& be, std::span<T> s, std::span<const T> cs, std::span<token_t> ts,
                            std::span<const token_t> tok, index_t i, T x) {
  be.select_topc_per_sequence(ts, cs, i, i);
  be.selection_mask(s, tok);
  be.skip_select(ts, ts, ts, cs);
  be.sigmoid_forward(s, cs);
  be.sigmoid_backward(s, cs, cs);
  be.bce_logits_forward(s, cs, cs);
  be.bce_logits_backward(s, cs, cs, x);
};

// The optimizer: gradient norm (left in backend memory) and AdamW with fused clipping.
template <class Be, class T>
concept OptimOps = requires(Be& be, std::span<T> s, std::span<const T> cs, T* out, const T* norm, T x,
                            const typename Be::AdamWConfig& cfg, std::int64_t step) {
  be.grad_norm(cs, out);
  be.adamw_step(s, cs, s, s, cfg, step);
  be.adamw_step(s, cs, s, s, cfg, step, norm, x);
};

}  // namespace backend_parts

// A backend: a scalar type (float or double) and every op above over it.
template <class Be>
concept Backend = requires { typename Be::scalar; } && backend_parts::Memory<Be, typename Be::scalar> && backend_parts::DenseOps<Be, typename Be::scalar> &&
                  backend_parts::RoutingOps<Be, typename Be::scalar> &&
                  backend_parts::GroupedOps<Be, typename Be::scalar> &&
                  backend_parts::DepthOps<Be, typename Be::scalar> && backend_parts::OptimOps<Be, typename Be::scalar>;

// The LayerNorm in front of a fused op pair (FusesNormLinear, FusesMlp): its output `out` [rows × d], dense, which the
// backend may keep in a layout of its own between the pair's forward and backward (read by nothing else), and the
// per-row statistics its backward reads (mean, rstd [rows]), as layernorm_forward writes them.
template <class T>
struct NormSaved {
  MatrixView<T> out;
  std::span<T> mean, rstd;
  // NormSaved<T> converts to NormSaved<const T> (what a backward reads).
  template <class U>
    requires(std::is_same_v<const U, T> && !std::is_same_v<U, T>)
  constexpr NormSaved(const NormSaved<U>& o) : out(o.out), mean(o.mean), rstd(o.rstd) {}
  constexpr NormSaved(MatrixView<T> o, std::span<T> m, std::span<T> r) : out(o), mean(m), rstd(r) {}
};

// Where a fused pair's backward leaves the gradient it hands to the next pair below it: GradLayout::fp32, an fp32
// matrix any op may read; GradLayout::backend, a layout of the backend's own, written by attention_linear_backward (its
// dqkv) only for norm_linear_backward to read as its dy, with nothing called between the two (modules/mha.hpp, without
// RoPE). Under BF16 the CUDA backend hands it over in bf16, the qkv linear's operand (attention_ops.hpp).
enum class GradLayout { fp32, backend };

// Where a fused pair's forward leaves the output it hands to the pair above it (norm_linear_forward's y): OutLayout{}, an
// fp32 matrix any op may read; OutLayout{.attention_heads = H}, the qkv [rows × 3d] of a causal attention over H heads,
// read only by the attention_linear_forward called next (no op between the two) and its attention_linear_backward, as
// their qkv, nothing else reading or writing it (modules/mha.hpp, without RoPE): a layout of the backend's own. Under
// BF16 the CUDA backend writes it in bf16 where its attention kernels read bf16 (head dim 64: attention_ops.hpp).
struct OutLayout {
  index_t attention_heads = 0;
};

// A backend may also run a pre-LayerNorm and the linear that reads it as one op pair (cuda::Backend: norm_ops.hpp;
// GPT-2's attention input, modules/mha.hpp), free to keep the LayerNorm's output in a layout of its own between the
// two (under BF16 the CUDA backend writes it in bf16, the linear's operand, and never in fp32):
//   norm_linear_forward(y, ln, x, gamma, beta, w, b, y_layout):
//                                                       ln.out = LN(x) (ln.mean, ln.rstd as layernorm_forward's),
//                                                       y = ln.out·wᵀ + b (written), in y_layout (OutLayout);
//   norm_linear_backward(dx, dgamma, dbeta, dw, db, dln, dy, x, ln, gamma, w, dy_layout):
//                                                       dln = dy·w (scratch [rows × d], written), dw += dyᵀ·ln.out,
//                                                       db += Σ_rows dy, then layernorm_backward: dx += dL/dx,
//                                                       dgamma, dbeta accumulated; ln as the forward left it; dy in
//                                                       dy_layout (GradLayout).
// A module calls them where they exist and layernorm_forward + linear_forward (and their backwards) where not: the
// results must agree within the precision.
template <class Be, class T>
concept FusesNormLinear = requires(Be& be, MatrixView<T> m, MatrixView<const T> cm, std::span<T> s,
                                   std::span<const T> cs, NormSaved<T> ln) {
  be.norm_linear_forward(m, ln, cm, cs, cs, cm, cs, OutLayout{});
  be.norm_linear_backward(m, s, s, m, s, m, cm, cm, NormSaved<const T>(ln), cs, cm, GradLayout::fp32);
};

// A backend may also run the causal attention and the output linear that reads it as one op pair (cuda::Backend:
// attention_ops.hpp; GPT-2's attention, modules/mha.hpp), free to keep the attention's output in a layout of its own
// between the two (under BF16 the CUDA backend writes it in bf16, the linear's operand, and never in fp32):
//   attention_linear_forward(y, att, lse, qkv, w, b, batch, seq, heads, residual):
//        att = attention(qkv) and lse as attention_forward's, y = att·wᵀ + b (+ residual where it is not empty: a
//        dense matrix of y's shape, distinct from y; the module's x, eq. (4)'s residual add) (written);
//   attention_linear_backward(dqkv, dw, db, datt, dy, att, lse, qkv, w, batch, seq, heads, dqkv_layout):
//        datt = dy·w (scratch [rows × d], written), dw += dyᵀ·att, db += Σ_rows dy, then attention_backward's
//        dL/dqkv: dqkv written, in dqkv_layout (GradLayout); att and lse as the forward left them.
// modules/mha.hpp calls them where they exist and attention_forward + linear_forward (and their backwards) where not:
// the results must agree within the precision.
template <class Be, class T>
concept FusesAttentionLinear = requires(Be& be, MatrixView<T> m, MatrixView<const T> cm, std::span<T> s,
                                        std::span<const T> cs, index_t n) {
  be.attention_linear_forward(m, m, s, cm, cm, cs, n, n, n);
  be.attention_linear_forward(m, m, s, cm, cm, cs, n, n, n, cm);
  be.attention_linear_backward(m, m, s, m, cm, cm, cs, cm, cm, n, n, n, GradLayout::fp32);
};

// A backend may also run the FFN (its pre-LayerNorm and its MLP) as one op pair (cuda::Backend: mlp_ops.hpp), free to
// keep the LayerNorm's output and the MLP's activations in a layout of its own between the two (under BF16 the CUDA
// backend keeps them in bf16):
//   mlp_forward(y, ln, pre, act, x, gamma, beta, w1, b1, w2, b2, residual):
//        ln.out = LN(x), pre = ln.out·w1ᵀ + b1, act = gelu(pre), y = act·w2ᵀ + b2 (+ residual, as above) (written);
//   mlp_backward(dx, dgamma, dbeta, dw1, db1, dw2, db2, dln, dact, dpre, dy, x, ln, gamma, pre, act, w1, w2):
//        dx += dL/dx, the LayerNorm's, weight and bias gradients accumulated; ln, pre and act as mlp_forward left
//        them; dln [rows × d], dact and dpre scratch;
// pre, act, dact and dpre dense matrices of one shape. modules/ffn.hpp calls them where they exist, and
// layernorm_forward, linear_forward, gelu_forward, linear_forward (and their backwards) where not: the results must
// agree within the precision.
template <class Be, class T>
concept FusesMlp = requires(Be& be, MatrixView<T> m, MatrixView<const T> cm, std::span<T> s, std::span<const T> cs,
                            NormSaved<T> ln) {
  be.mlp_forward(m, ln, m, m, cm, cs, cs, cm, cs, cm, cs);
  be.mlp_forward(m, ln, m, m, cm, cs, cs, cm, cs, cm, cs, cm);
  be.mlp_backward(m, s, s, m, s, m, s, m, m, m, cm, cm, NormSaved<const T>(ln), cs, cm, cm, cm, cm);
};
// The GELU fused into a linear's products (cuda::Backend: cuBLASLt's GELU epilogues, ops.hpp), what its mlp ops run on
// with fp32 activations:
//   linear_forward_gelu(pre, act, x, w, b):             pre = x·wᵀ + b, act = gelu(pre);
//   linear_backward_dgelu(dpre, dw, db, dy, act, w, pre): the backward of a linear whose input is act = gelu(pre), and
//                                                        of that GELU: dpre = (dy·w) ∘ gelu'(pre) (written),
//                                                        dw += dyᵀ·act, db += Σ_rows dy;
// pre, act and dpre dense matrices of one shape; the results must agree with the separate ops.
template <class Be, class T>
concept FusesGelu = requires(Be& be, MatrixView<T> m, MatrixView<const T> cm, std::span<T> s, std::span<const T> cs) {
  be.linear_forward_gelu(m, m, cm, cm, cs);
  be.linear_backward_dgelu(m, m, s, cm, cm, cm, cm);
};

// A backend may also add eq. (4)'s residual in the linear that ends a module (cuda::Backend: in cuBLASLt's epilogue):
//   linear_forward_residual(y, x, w, b, residual):  y = x·wᵀ + b + residual (written; residual dense, of y's shape,
//                                                   distinct from y; empty: linear_forward's y)
// modules/mha.hpp's decode calls it where a backend has it (AddsResidualOn's decoding counterpart, DecodesResidualOn);
// the results must agree with linear_forward and add_forward within the precision.
template <class Be, class T>
concept FusesLinearResidual = requires(Be& be, MatrixView<T> m, MatrixView<const T> cm, std::span<const T> cs) {
  be.linear_forward_residual(m, cm, cm, cs, cm);
};

// A backend may also keep copies of a model's weights in the form its products read (cuda::Backend under BF16: bf16
// copies, cuda/weight_copies.hpp), for as long as its caller promises not to write them:
//   begin_weight_copies(weights):  from now until end_weight_copies(), nothing writes `weights` (a model's parameter
//                                  block); a product may read an operand lying in it from a copy made the first time
//                                  it is read;
//   end_weight_copies():           the promise ends; later products read the weights as they are.
// The results are the same with or without the copies. train::Trainer opens a WeightCopyWindow around a step's
// micro-batches (the parameters change only in AdamW, after them); a backend without the pair is left as it is.
template <class Be, class T>
concept KeepsWeightCopies = requires(Be& be, std::span<const T> cs) {
  be.begin_weight_copies(cs);
  be.end_weight_copies();
};
// begin_weight_copies for the window's lifetime, where the backend has it.
template <class Be, class T>
class WeightCopyWindow {
 public:
  WeightCopyWindow(Be& be, std::span<const T> weights) : be_(be) {
    if constexpr (KeepsWeightCopies<Be, T>) be_.begin_weight_copies(weights);
  }
  ~WeightCopyWindow() {
    if constexpr (KeepsWeightCopies<Be, T>) be_.end_weight_copies();
  }
  WeightCopyWindow(const WeightCopyWindow&) = delete;
  WeightCopyWindow& operator=(const WeightCopyWindow&) = delete;

 private:
  Be& be_;
};

// True when a backend's memory is host memory the host may read directly (cpu::Backend says so with
// `static constexpr bool host_memory = true`); a backend that does not say so is read through to_host.
template <class Be>
inline constexpr bool host_memory = requires { requires Be::host_memory; };

// The row stride, in elements, that a backend's matrix products want for full speed: a buffer whose rows are as wide
// as the vocabulary (the LM head's logits and their gradient) is laid out with each row padded to a multiple of it.
// cuda::Backend says 64 (`static constexpr index_t row_align = 64`): cuBLAS' tensor-core kernels need 16-byte
// aligned rows, and GPT-2's 50257 then becomes 50304, the padded vocabulary of llm.c and nanoGPT, without changing
// the model. A backend that does not say: 1 (rows as wide as they are).
template <class Be>
inline constexpr index_t row_align = [] {
  if constexpr (requires { Be::row_align; })
    return static_cast<index_t>(Be::row_align);
  else
    return index_t(1);
}();
// A backend with a row_align may also have the LM head's ops, lm_head_forward(logits, x, w) and
// lm_head_backward(dx, dw, dlogits, x, w): linear_forward / linear_backward without a bias, allowed to run over (and
// write) the logits' padding columns; ModelInstance calls them where they exist (cuda::Backend's, ops.hpp). And
// lm_head_loss_backward(dx, dw, logits, lse, targets, dloss, x, w): cross_entropy_backward and lm_head_backward in one
// op, free to leave the logits as they are (cuda::Backend's writes the gradient straight into its products' bf16
// operand under BF16); ModelInstance's backward calls it in their place where it exists.

// cols rounded up to a multiple of Be's row_align.
template <class Be>
constexpr index_t padded_ld(index_t cols) {
  return (cols + row_align<Be> - 1) / row_align<Be> * row_align<Be>;
}

}  // namespace mom

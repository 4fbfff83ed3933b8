#pragma once
// The CUDA backend's causal attention and the output linear that reads it as one op pair (backend_concept.hpp,
// FusesAttentionLinear; GPT-2's attention, modules/mha.hpp): att = attention(qkv), y = att·wᵀ + b, and its backward.
//
// Under Precision::BF16 (float, head dim 64 or 128) the attention writes its output as bf16 only
// (attention_forward_bf16: the mma kernel with a bf16 store), in the first half of att's fp32 buffer; the linear's two
// products that read it (the forward, and dW in the backward) take it in place (DenseOps::Operand), and the
// attention's backward reads it for D = rowsum(dO ∘ O). The bits are those to_bf16 makes of the fp32 output, so the
// forward, datt, dw and db are attention_forward + linear_forward's (and linear_backward's) bit for bit; dqkv differs
// from attention_backward's by D taken from the rounded O (FlashAttention-2's rule, arXiv:2307.08691, whose O is
// bf16), within bf16's precision. Elsewhere (TF32, FP32, double, another head dim, an unaligned or padded att) the
// pair is those ops with att in fp32. Which layout a forward wrote is recorded per att buffer (NormOps' record).
//
// Its input: qkv as norm_linear_forward wrote it just before (handed over, then recorded per buffer: norm_ops.hpp).
// Asked for the attention's layout (OutLayout, modules/mha.hpp without RoPE) at head dim 64, the qkv product writes qkv
// as bf16 only, in the first half of its fp32 buffer, and the mma kernels' Q16 instances copy Q, K and V from those bits
// (the bits they would round an fp32 qkv to, the bias having entered in bf16; cp.async, two tiles deep:
// attention_mma.cuh): half the bytes written and read, no conversion in the kernels. With att in fp32 (its layout does
// not fit) the same kernels run with an fp32 output.
//
// The backward's dqkv, handed to norm_linear_backward (GradLayout::backend, backend_concept.hpp): where att is bf16 and
// dqkv dense and aligned, the kernel writes dK and dV as bf16 in the first half of dqkv's fp32 buffer and dQ, added
// atomically, goes through fp32 in its second half (backward_bf16_layout); recorded like att, and read in place by the
// qkv linear's products (NormOps::linear_backward_from_bf16). Elsewhere dqkv is fp32, recorded so.
#include <cstdint>
#include <span>
#include <type_traits>

#include "mom/backend/backend_concept.hpp"  // GradLayout
#include "mom/backend/cuda/kernels.hpp"
#include "mom/backend/cuda/norm_ops.hpp"
#include "mom/backend/cuda/ops.hpp"
#include "mom/backend/shape_checks.hpp"
#include "mom/core/tensor.hpp"

namespace mom::cuda::detail {

template <class T>
class AttentionOps : public NormOps<T> {
  using Base = NormOps<T>;

 public:
  using M = MatrixView<T>;
  using CM = MatrixView<const T>;
  using S = std::span<T>;
  using CS = std::span<const T>;

  using Base::Base;

  // att = attention(qkv), lse as attention_forward writes it; y = att·wᵀ + b (+ residual, where given) (written). att
  // in the backend's layout until attention_linear_backward reads it. The residual rides in the proj product's
  // epilogue (linear_forward_residual).
  void attention_linear_forward(M y, M att, S lse, CM qkv, CM w, CS b, index_t batch, index_t seq, index_t heads,
                                CM residual = CM{}) const {
    Base::check_attention_shapes("attention_forward", qkv, CM(att), CS(lse), batch, seq, heads);
    checks::linear_forward_shapes<T>(y, CM(att), w, b);
    Base::check_residual("attention_linear_forward", CM(y), residual);
    if constexpr (std::is_same_v<T, float>) {
      const std::uint16_t* q16 = this->take_qkv(qkv);
      const bool bf16 = this->bf16_layout_fits(CM(att)) && y.cols > 0 &&
                        cuda::attention_forward_bf16(*this->ctx_, this->bits(att.data), att.cols, lse.data(), qkv,
                                                     batch, seq, heads, q16);
      this->record(att.data, bf16);
      if (bf16) return this->linear_forward_in_place(y, Operand(CM(att), this->bf16_rows(CM(att))), w, b, residual);
      if (q16) {  // a bf16 qkv, att in fp32 (its layout does not fit): the same kernels with an fp32 output
        cuda::attention_forward_bf16(*this->ctx_, att, lse.data(), qkv, batch, seq, heads, q16);
        return this->linear_forward_residual(y, CM(att), w, b, residual);
      }
    }
    this->attention_forward(att, lse, qkv, batch, seq, heads);
    this->linear_forward_residual(y, CM(att), w, b, residual);
  }
  // Its backward from dy = dL/dy, att and lse as the forward left them: datt = dy·w (scratch, written), dw += dyᵀ·att,
  // db += Σ_rows dy (dw, db may be empty), then the attention's: dqkv = dL/dqkv (written), in dqkv_layout.
  void attention_linear_backward(M dqkv, M dw, S db, M datt, CM dy, CM att, CS lse, CM qkv, CM w, index_t batch,
                                 index_t seq, index_t heads, GradLayout dqkv_layout = GradLayout::fp32) const {
    Base::check_attention_shapes("attention_backward", qkv, att, lse, batch, seq, heads);
    checks::attention_backward_grad_shapes<T>("attention_backward", dqkv, CM(datt), att, qkv);
    checks::linear_backward_shapes<T>(datt, dw, db, dy, att, w);
    const Operand xo = this->recorded_operand(att);
    const std::uint16_t* q16 = this->recorded_qkv(qkv);
    if (!this->linear_backward_in_place(datt, dw, db, dy, xo, w))  // (without dw, att is not read)
      this->linear_backward(datt, dw, db, dy, att, w, Store::overwrite);
    const bool handoff = xo.bf16 && dqkv_layout == GradLayout::backend && this->bf16_layout_fits(CM(dqkv));
    this->record(dqkv.data, handoff);
    if constexpr (std::is_same_v<T, float>) {
      if (handoff) return backward_bf16_layout(dqkv, datt, xo, lse, qkv, q16, batch, seq, heads);
    }
    this->clear(dqkv);  // the attention's backward accumulates
    if constexpr (std::is_same_v<T, float>) {
      if (xo.bf16)
        return cuda::attention_backward_bf16(*this->ctx_, dqkv, CM(datt), xo.bf16, xo.ld16, lse.data(), qkv, batch,
                                             seq, heads, q16);
      if (q16)
        return cuda::attention_backward_bf16(*this->ctx_, dqkv, CM(datt), att, lse.data(), qkv, batch, seq, heads, q16);
    }
    this->attention_backward(dqkv, CM(datt), att, lse, qkv, batch, seq, heads);
  }

 protected:
  using Operand = typename Base::Operand;

  // dqkv in the pair's gradient layout (the bf16 layout, bf16_rows, read by norm_linear_backward): dK and dV written as
  // bf16 by the attention kernel; dQ, summed over key blocks by atomic adds, accumulates in fp32 in the second half of
  // dqkv's buffer (past the bf16 rows, [rows × d] fits in its 1.5·d floats a row) and is then rounded into its place.
  // The bits to_bf16 makes of the fp32 dqkv that attention_backward_bf16 accumulates (dQ's order of additions aside).
  void backward_bf16_layout(M dqkv, CM datt, const Operand& xo, CS lse, CM qkv, const std::uint16_t* q16,
                            index_t batch, index_t seq, index_t heads) const {
    const index_t n = dqkv.rows, d = dqkv.cols / 3;
    const M dq(dqkv.data + n * (3 * d / 2), n, d, d);
    std::uint16_t* const g16 = this->bits(dqkv.data);
    this->clear(dq);
    cuda::attention_backward_bf16(*this->ctx_, dq.data, d, g16 + d, 3 * d, datt, xo.bf16, xo.ld16, lse.data(), qkv,
                                  batch, seq, heads, q16);
    cuda::to_bf16(*this->ctx_, g16, 3 * d, CM(dq), n, d);
  }
};

}  // namespace mom::cuda::detail

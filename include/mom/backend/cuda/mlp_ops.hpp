#pragma once
// The CUDA backend's FFN as one op pair (backend_concept.hpp, FusesMlp): y = gelu(LN(x)·w1ᵀ + b1)·w2ᵀ + b2, GPT-2's
// feed-forward network with its pre-LayerNorm (modules/ffn.hpp), with ln.out = LN(x), pre = ln.out·w1ᵀ + b1 and act =
// gelu(pre) kept between mlp_forward and mlp_backward in the backend's own layout.
//
// Under Precision::BF16 (float) ln.out, pre and act live in bf16, in the first half of their fp32 buffers (llm.c's
// layout for them): the LayerNorm writes ln.out as bf16 (norm_ops.hpp's layout, where it applies; else fp32, staged),
// which the fc product and dW1 read in place; the fc product writes act as its output and pre as the GELU epilogue's
// aux, both bf16
// (CUBLASLT_EPILOGUE_GELU_AUX_BIAS with a bf16 D; the bias staged as bf16, cuBLASLt's rule for a bf16 D); the proj
// product reads act as its bf16 operand, with no staging copy; the backward's DGELU product writes d(pre) as bf16,
// and the fc linear's two backward products read it as theirs (its bias gradient summed from it, bf16_column_sums).
// What goes: the LayerNorm's fp32 output and its two stagings, the staging of act (forward and backward) and of
// d(pre), and half of what the epilogues write and read (bench/RESULTS.md has the bytes). ln.out's bits are those the
// staging made of the fp32 output. Numerics: act and every operand are rounded to bf16 where the staged products
// round them, but the fc bias enters in bf16 (as PyTorch's autocast casts it), gelu' is taken at pre rounded to bf16,
// and d(pre) is rounded to bf16 from that (the staged path rounds an fp32 d(pre) taken at the fp32 pre): the results
// agree with the fp32 layout's to bf16's precision, not to the bit.
//
// Elsewhere (TF32, FP32, double, or where cuBLASLt has no algorithm for the bf16 fc or proj product) the pair is
// layernorm_forward + linear_forward_gelu + linear_forward and linear_backward_dgelu + linear_backward +
// layernorm_backward, with ln.out, pre and act in fp32. Which layout a forward wrote is recorded per act and ln.out
// buffer (LtPlans::bf16_layout), and its backward reads that; a backward in the bf16 layout whose DGELU product
// cuBLASLt refuses takes a bf16 GEMM into dact (fp32) and dgelu_bf16.
#include <algorithm>
#include <cstdint>
#include <span>
#include <type_traits>

#include "mom/backend/cuda/attention_ops.hpp"
#include "mom/backend/cuda/kernels.hpp"
#include "mom/backend/cuda/lt.hpp"
#include "mom/backend/cuda/norm_ops.hpp"
#include "mom/backend/cuda/ops.hpp"
#include "mom/backend/cuda/staging.hpp"
#include "mom/backend/shape_checks.hpp"
#include "mom/core/tensor.hpp"

namespace mom::cuda::detail {

template <class T>
class MlpOps : public AttentionOps<T> {
  using Base = AttentionOps<T>;

 public:
  using M = MatrixView<T>;
  using CM = MatrixView<const T>;
  using S = std::span<T>;
  using CS = std::span<const T>;

  using Base::Base;

  // ln.out = LN(x), pre = ln.out·w1ᵀ + b1, act = gelu(pre), y = act·w2ᵀ + b2 (+ residual, where given) (written):
  // ln.out, pre and act [rows × f] dense, in the backend's layout until mlp_backward reads them. The residual rides in
  // the proj product's epilogue (linear_forward_residual).
  void mlp_forward(M y, NormSaved<T> ln, M pre, M act, CM x, CS gamma, CS beta, CM w1, CS b1, CM w2, CS b2,
                   CM residual = CM{}) const {
    Base::check_gelu_pair("mlp_forward", act, pre);  // first: the pair's own message
    checks::layernorm_forward_shapes<T>(ln.out, ln.mean, ln.rstd, x, gamma, beta);
    checks::linear_forward_shapes<T>(pre, CM(ln.out), w1, b1);
    checks::linear_forward_shapes<T>(y, CM(act), w2, b2);
    Base::check_residual("mlp_forward", CM(y), residual);
    if constexpr (std::is_same_v<T, float>) {
      const int layout = forward_bf16(y, ln, pre, act, x, gamma, beta, w1, b1, w2, b2, residual);
      this->record(act.data, layout != 0);
      this->record(ln.out.data, layout == 2);
      if (layout != 0) return;
    }
    this->layernorm_forward(ln.out, ln.mean, ln.rstd, x, gamma, beta);
    this->linear_forward_gelu(pre, act, CM(ln.out), w1, b1);
    this->linear_forward_residual(y, CM(act), w2, b2, residual);
  }
  // Its backward from dy = dL/dy, ln, pre and act as the forward left them: dx += dL/dx; the LayerNorm's and the
  // linears' parameter gradients accumulated (dw1, db1, dw2, db2 may be empty); dln [rows × d], dact and dpre
  // [rows × f] dense scratch.
  void mlp_backward(M dx, S dgamma, S dbeta, M dw1, S db1, M dw2, S db2, M dln, M dact, M dpre, CM dy, CM x,
                    NormSaved<const T> ln, CS gamma, CM pre, CM act, CM w1, CM w2) const {
    Base::check_gelu_pair("mlp_backward", act, pre);  // first: the pairs' own messages
    Base::check_gelu_pair("mlp_backward", dact, dpre);
    checks::linear_backward_shapes<T>(dpre, dw2, db2, dy, act, w2);
    checks::linear_backward_shapes<T>(dln, dw1, db1, CM(dpre), ln.out, w1);
    checks::layernorm_backward_shapes<T>(dx, dgamma, dbeta, CM(dln), x, ln.mean, ln.rstd, gamma);
    bool bf16 = false;
    if constexpr (std::is_same_v<T, float>) {
      bf16 = this->recorded(act.data);
      if (bf16) backward_bf16(dln, dw1, db1, dw2, db2, dact, dpre, dy, this->recorded_operand(ln.out), pre, act, w1, w2);
    }
    if (!bf16) {
      this->linear_backward_dgelu(dpre, dw2, db2, dy, act, w2, pre);
      this->linear_backward(dln, dw1, db1, CM(dpre), ln.out, w1, Store::overwrite);
    }
    this->layernorm_backward(dx, dgamma, dbeta, CM(dln), x, ln.mean, ln.rstd, gamma);
  }

 private:
  using Staged = typename Base::Staged;
  using Operand = typename Base::Operand;
  using Base::bits;

  // The forward in the bf16 layout: 2 with ln.out in bf16 too, 1 with ln.out in fp32 (written, then staged), 0 with
  // nothing written but the staging where it does not apply (precision, a width f that is not a multiple of 8,
  // unaligned buffers, no bias) or cuBLASLt has no algorithm for the fc or proj product or refuses the fc one (the
  // caller then runs the fp32 layout from the start).
  int forward_bf16(M y, const NormSaved<T>& ln, M pre, M act, CM x, CS gamma, CS beta, CM w1, CS b1, CM w2, CS b2,
                   CM residual) const {
    const index_t n = x.rows, f = w1.rows;
    if (this->ctx_->precision != Precision::BF16 || n == 0 || f % 8 != 0 || x.cols == 0 || y.cols == 0 ||
        b1.empty() || b2.empty() || lt_alignment(pre.data) < 16 || lt_alignment(act.data) < 16)
      return 0;
    const bool ln16 = this->bf16_layout_fits(CM(ln.out));
    const Operand xo = ln16 ? Operand(CM(ln.out), Base::bf16_rows(CM(ln.out))) : Operand(CM(ln.out));
    const CM bias1(b1.data(), 1, f);
    const index_t nx = Base::staged_size(xo), nw1 = Base::staged_size(w1), nb1 = Base::staged_size(bias1);
    cuda::reserve_bf16_staging(*this->ctx_, nx + nw1 + nb1 + Base::staged_size(w2));
    std::uint16_t* at = this->ctx_->bf16_stage;
    std::uint16_t *sw1 = at + nx, *sb1 = sw1 + nw1, *sw2 = sb1 + nb1;
    const std::uint16_t* sx = xo.bf16 ? xo.bf16 : at;
    std::uint16_t *act16 = bits(act.data), *pre16 = bits(pre.data);
    // In cuBLAS's terms (column-major, as linear_forward_lt): fc D = act [f × n] = w1ᵀ·x, aux = pre; proj D = y
    // [out × n] = w2ᵀ·act.
    LtProduct fc{int(f), int(n), int(x.cols), CUBLAS_OP_T, CUBLAS_OP_N, Base::ld(Base::staged_ld(w1)),
                 Base::ld(Base::staged_ld(xo)), Base::ld(f)};
    fc.epilogue = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    fc.ld_aux = Base::ld(f);
    fc.ab_type = fc.d_type = CUDA_R_16BF;
    LtProduct proj{int(y.cols), int(n), int(f), CUBLAS_OP_T, CUBLAS_OP_N, Base::ld(Base::staged_ld(w2)), Base::ld(f),
                   Base::ld(y.ld)};
    proj.epilogue = CUBLASLT_EPILOGUE_BIAS;
    proj.ab_type = CUDA_R_16BF;
    LtPlan* p_fc = lt_plan(*this->ctx_, fc, sw1, sx, act16, sb1, pre16);
    LtPlan* p_proj = p_fc ? lt_plan(*this->ctx_, proj, sw2, act16, y.data, b2.data(), nullptr, residual.data) : nullptr;
    if (!p_proj) return 0;
    if (ln16) {
      this->norm_forward_bf16(ln, x, gamma, beta);
    } else {
      this->layernorm_forward(ln.out, ln.mean, ln.rstd, x, gamma, beta);
      this->stage(at, xo);
    }
    // The weights and the fc bias from their places (their copies inside a weight window: weight_copies.hpp).
    const Staged s1 = this->stage(sw1, w1), sb = this->stage(sb1, bias1);
    if (!lt_run(*this->ctx_, *p_fc, 1.0f, s1.data, sx, act16, sb.data, pre16)) return 0;
    const Staged sw = this->stage(sw2, w2), sa{act16, n, f, f};
    if (!lt_run(*this->ctx_, *p_proj, 1.0f, sw.data, act16, y.data, b2.data(), nullptr, residual.data)) {
      Base::K::broadcast_rows(*this->ctx_, y, b2.data());  // refused: act is written already
      this->gemm_staged(y, sa, Trans::N, sw, Trans::T, 1.0f, 1.0f);
      this->add_residual(y, residual);
    }
    return ln16 ? 2 : 1;
  }

  // The backward in the bf16 layout: dW2 += dyᵀ·act and db2 += Σ dy (summed while dy is staged); d(pre) = (dy·w2) ∘
  // gelu'(pre) as bf16 (DGELU; else a bf16 GEMM into dact, then dgelu_bf16); db1 += Σ d(pre); dln = d(pre)·w1 and
  // dW1 += d(pre)ᵀ·ln.out from the bf16 d(pre) (ln.out read in place where the forward wrote it in bf16).
  void backward_bf16(M dln, M dw1, S db1, M dw2, S db2, M dact, M dpre, CM dy, const Operand& xo, CM pre, CM act,
                     CM w1, CM w2) const {
    const index_t n = dy.rows, f = w1.rows;
    const index_t ndy = Base::staged_size(dy), nw2 = Base::staged_size(w2), nw1 = Base::staged_size(w1);
    cuda::reserve_bf16_staging(*this->ctx_, ndy + nw2 + nw1 + Base::staged_size(xo));
    std::uint16_t* sdy = this->ctx_->bf16_stage;
    std::uint16_t *sw2 = sdy + ndy, *sw1 = sw2 + nw2, *sx = sw1 + nw1;
    const std::uint16_t *act16 = bits(act.data), *pre16 = bits(pre.data);
    std::uint16_t* dpre16 = bits(dpre.data);
    LtProduct g{int(f), int(n), int(dy.cols), CUBLAS_OP_N, CUBLAS_OP_N, Base::ld(Base::staged_ld(w2)),
                Base::ld(Base::staged_ld(dy)), Base::ld(f)};
    g.epilogue = CUBLASLT_EPILOGUE_DGELU;
    g.ld_aux = Base::ld(f);
    g.ab_type = g.d_type = CUDA_R_16BF;
    LtPlan* p = lt_plan(*this->ctx_, g, sw2, sdy, dpre16, nullptr, pre16);
    const Staged sd = this->stage(sdy, dy, n, dy.cols, db2.empty() ? nullptr : db2.data());
    const Staged sw = this->stage(sw2, w2), sa{act16, n, f, f}, sp{dpre16, n, f, f};
    if (!dw2.empty()) this->gemm_staged(dw2, sd, Trans::T, sa, Trans::N, 1.0f, 1.0f);
    if (!p || !lt_run(*this->ctx_, *p, 1.0f, sw.data, sd.data, dpre16, nullptr, pre16)) {
      this->gemm_staged(dact, sd, Trans::N, sw, Trans::N, 1.0f, 0.0f);  // dL/d(act), fp32
      cuda::dgelu_bf16(*this->ctx_, dpre16, dact.data, pre16, n * f);
    }
    if (!db1.empty()) cuda::bf16_column_sums(*this->ctx_, db1.data(), dpre16, n, f, f);
    this->gemm_staged(dln, sp, Trans::N, this->stage(sw1, w1), Trans::N, 1.0f, 0.0f);
    if (!dw1.empty()) this->gemm_staged(dw1, sp, Trans::T, this->stage(sx, xo), Trans::N, 1.0f, 1.0f);
  }
};

}  // namespace mom::cuda::detail

#pragma once
// The CUDA backend's pre-LayerNorm and the linear that reads it as one op pair (backend_concept.hpp, FusesNormLinear;
// GPT-2's attention input, modules/mha.hpp): ln.out = LN(x), y = ln.out·wᵀ + b, and its backward.
//
// Under Precision::BF16 (float) the LayerNorm writes its output as bf16 only (layernorm_forward_bf16), in the first
// half of ln.out's fp32 buffer, and the linear's two products that read it (the forward, and dW in the backward) take
// it as their operand in place (DenseOps::Operand): no fp32 output written, no staging copy read and written twice.
// The bits are those the staged path makes (the LayerNorm computes the same fp32 values and rounds them as to_bf16
// does), so the pair's results are layernorm_forward + linear_forward's (and their backwards') bit for bit.
// Elsewhere (TF32, FP32, double, a width that is not a multiple of 8, an unaligned or padded ln.out) the pair is those
// ops with ln.out in fp32. Its output y, when the module hands it to the attention pair (OutLayout.attention_heads) and
// that pair's bf16 kernels apply, is written in bf16 too (linear_forward_bf16_out: y = bf16(ln.out·wᵀ + bf16(b))),
// recorded like ln.out and read by attention_ops.hpp. Which layout a forward wrote is recorded per ln.out buffer (LtPlans::bf16_layout), and its
// backward reads that.
//
// NormOps also keeps that record, the bf16 layout and the linear's products reading it in place for the pairs above it:
// the attention and its output linear (attention_ops.hpp) and the FFN (mlp_ops.hpp), whose LayerNorm is laid out the
// same way.
#include <algorithm>
#include <cstdint>
#include <span>
#include <type_traits>

#include "mom/backend/backend_concept.hpp"  // NormSaved
#include "mom/backend/cuda/kernels.hpp"
#include "mom/backend/cuda/lt.hpp"
#include "mom/backend/cuda/ops.hpp"
#include "mom/backend/cuda/staging.hpp"
#include "mom/backend/shape_checks.hpp"
#include "mom/core/tensor.hpp"

namespace mom::cuda::detail {

template <class T>
class NormOps : public DenseOps<T> {
  using Base = DenseOps<T>;

 public:
  using M = MatrixView<T>;
  using CM = MatrixView<const T>;
  using S = std::span<T>;
  using CS = std::span<const T>;

  using Base::Base;

  // ln.out = LN(x) (ln.mean, ln.rstd as layernorm_forward writes them), y = ln.out·wᵀ + b (written); ln.out in the
  // backend's layout until norm_linear_backward reads it. With y_layout.attention_heads (OutLayout), y is the qkv of
  // the attention pair (attention_ops.hpp) and may be written in its bf16 layout (qkv_bf16_fits).
  void norm_linear_forward(M y, NormSaved<T> ln, CM x, CS gamma, CS beta, CM w, CS b, OutLayout y_layout = {}) const {
    checks::layernorm_forward_shapes<T>(ln.out, ln.mean, ln.rstd, x, gamma, beta);
    checks::linear_forward_shapes<T>(y, CM(ln.out), w, b);
    hand_qkv(nullptr);
    if constexpr (std::is_same_v<T, float>) {
      const bool bf16 = bf16_layout_fits(CM(ln.out)) && y.cols > 0;
      record(ln.out.data, bf16);
      if (bf16) {
        const Operand xo(CM(ln.out), norm_forward_bf16(ln, x, gamma, beta));
        if (qkv_bf16_fits(CM(y), b, y_layout.attention_heads) && linear_forward_bf16_out(y, xo, w, b))
          return hand_qkv(y.data);
        return linear_forward_in_place(y, xo, w, b);
      }
    }
    this->layernorm_forward(ln.out, ln.mean, ln.rstd, x, gamma, beta);
    this->linear_forward(y, CM(ln.out), w, b);
  }
  // Its backward from dy = dL/dy, ln as the forward left it: dln = dy·w (scratch, written), dw += dyᵀ·ln.out, db +=
  // Σ_rows dy (dw, db may be empty), then the LayerNorm's: dx += dL/dx, dgamma and dbeta accumulated.
  // With dy_layout GradLayout::backend, dy is read in the layout its producer recorded (attention_ops.hpp: bf16 under
  // BF16; its db then summed from those bf16 values).
  void norm_linear_backward(M dx, S dgamma, S dbeta, M dw, S db, M dln, CM dy, CM x, NormSaved<const T> ln, CS gamma,
                            CM w, GradLayout dy_layout = GradLayout::fp32) const {
    checks::linear_backward_shapes<T>(dln, dw, db, dy, ln.out, w);
    checks::layernorm_backward_shapes<T>(dx, dgamma, dbeta, CM(dln), x, ln.mean, ln.rstd, gamma);
    const Operand xo = recorded_operand(ln.out);
    if (dy_layout == GradLayout::backend && recorded(dy.data)) {
      record(dy.data, false);  // read once: the record does not outlive the hand-over
      linear_backward_from_bf16(dln, dw, db, bf16_rows(dy), xo, w);
    } else if (!linear_backward_in_place(dln, dw, db, dy, xo, w)) {  // (without dw, ln.out is not read)
      this->linear_backward(dln, dw, db, dy, ln.out, w, Store::overwrite);
    }
    this->layernorm_backward(dx, dgamma, dbeta, CM(dln), x, ln.mean, ln.rstd, gamma);
  }

 protected:
  using Staged = typename Base::Staged;
  using Operand = typename Base::Operand;
  static std::uint16_t* bits(T* p) { return reinterpret_cast<std::uint16_t*>(p); }
  static const std::uint16_t* bits(const T* p) { return reinterpret_cast<const std::uint16_t*>(p); }

  // y = x·wᵀ + b (+ residual, where given: linear_forward_residual's) (written) with x a bf16 operand in place (xo.bf16
  // set): linear_forward's BF16 paths without x's staging: cuBLASLt's bias epilogue, or (no bias, no algorithm) the
  // bias broadcast and a bf16 cuBLAS product, then the residual's add.
  void linear_forward_in_place(M y, const Operand& xo, CM w, CS b, CM residual = CM{}) const {
    if (!b.empty() && this->linear_forward_lt(y, xo, w, b, CUBLASLT_EPILOGUE_BIAS, M{}, residual)) return;
    cuda::reserve_bf16_staging(*this->ctx_, Base::staged_size(w));
    const Staged sw = this->stage(this->ctx_->bf16_stage, w);
    if (!b.empty()) Base::K::broadcast_rows(*this->ctx_, y, b.data());
    this->gemm_staged(y, this->stage(nullptr, xo), Trans::N, sw, Trans::T, 1.0f, b.empty() ? 0.0f : 1.0f);
    this->add_residual(y, residual);
  }
  // y = x·wᵀ + b written as bf16 only, in y's bf16 layout (bf16_rows), with x a bf16 operand in place: cuBLASLt's bias
  // epilogue with a bf16 D, the bias staged as bf16 (cuBLASLt's rule for a bf16 D, as mlp_ops.hpp's fc product), so y
  // is bf16(x·wᵀ + bf16(b)). False, with nothing written, where cuBLASLt has no algorithm or refuses the call.
  bool linear_forward_bf16_out(M y, const Operand& xo, CM w, CS b) const {
    const index_t n = y.rows, o = y.cols;
    const CM bias(b.data(), 1, o);
    const index_t nw = Base::staged_size(w);
    cuda::reserve_bf16_staging(*this->ctx_, nw + Base::staged_size(bias));
    std::uint16_t *const sw_at = this->ctx_->bf16_stage, *const sb_at = sw_at + nw, *const y16 = bits(y.data);
    // In cuBLAS's terms (column-major, as linear_forward_lt): D = y [o × n] = wᵀ·x.
    LtProduct g{int(o), int(n), int(w.cols), CUBLAS_OP_T, CUBLAS_OP_N, Base::ld(Base::staged_ld(w)),
                Base::ld(Base::staged_ld(xo)), Base::ld(o)};
    g.epilogue = CUBLASLT_EPILOGUE_BIAS;
    g.ab_type = g.d_type = CUDA_R_16BF;
    LtPlan* p = lt_plan(*this->ctx_, g, sw_at, xo.bf16, y16, sb_at);
    if (!p) return false;
    const Staged sw = this->stage(sw_at, w), sb = this->stage(sb_at, bias);
    return lt_run(*this->ctx_, *p, 1.0f, sw.data, xo.bf16, y16, sb.data);
  }
  // The qkv of the attention pair may be written in bf16 (its kernels then stage Q, K and V from those bits): an
  // attention over `heads` heads (0: y is not a qkv) whose bf16-qkv kernels apply (BF16, head dim 64, launchable:
  // cuda::attention_takes_bf16_qkv), a bias, y dense in the bf16 layout.
  bool qkv_bf16_fits(CM y, CS b, index_t heads) const {
    return heads > 0 && !b.empty() && y.cols % (3 * heads) == 0 && bf16_layout_fits(y) &&
           cuda::attention_takes_bf16_qkv(*this->ctx_, y.cols / 3 / heads);
  }

  // dx = dy·w (written), dw += dyᵀ·x, db += Σ_rows dy with x a bf16 operand in place: linear_backward's BF16 path.
  // False (nothing done) where that path does not apply (no dw, or no rows): x is then not read, linear_backward's.
  bool linear_backward_in_place(M dx, M dw, S db, CM dy, const Operand& xo, CM w) const {
    if constexpr (std::is_same_v<T, float>) {
      if (!xo.bf16 || dw.empty() || dy.rows == 0) return false;
      this->backward_staged(dx, dw, dy, xo, w, dy.cols, 0.0f, db.empty() ? nullptr : db.data());
      return true;
    }
    return false;
  }

  // dx = dy·w (written), dw += dyᵀ·x, db += Σ_rows dy with dy bf16 rows in place (sdy: its producer wrote no fp32
  // copy; only a float backend records one) and x in place or staged: linear_backward's BF16 products without dy's
  // staging; db is summed from dy's bf16 values (as PyTorch's autocast sums its bf16 gradient).
  void linear_backward_from_bf16(M dx, M dw, S db, Staged sdy, const Operand& xo, CM w) const {
    if constexpr (std::is_same_v<T, float>) {
      const index_t nw = Base::staged_size(w);
      cuda::reserve_bf16_staging(*this->ctx_, nw + (dw.empty() ? 0 : Base::staged_size(xo)));
      std::uint16_t* const at = this->ctx_->bf16_stage;
      const Staged sw = this->stage(at, w);
      if (!db.empty()) cuda::bf16_column_sums(*this->ctx_, db.data(), sdy.data, sdy.rows, sdy.cols, sdy.ld);
      this->gemm_staged(dx, sdy, Trans::N, sw, Trans::N, 1.0f, 0.0f);
      if (!dw.empty()) this->gemm_staged(dw, sdy, Trans::T, this->stage(at + nw, xo), Trans::N, 1.0f, 1.0f);
    }
  }

  // The bf16 layout applies to an output (the LayerNorm's here, the attention's in attention_ops.hpp): BF16, and
  // out [rows × d] dense, 16-byte aligned, d a multiple of 8 (its bf16
  // rows, d apart, are then 16-byte aligned for cuBLAS' tensor-core kernels, and fit the first half of the buffer);
  // and the layout can be recorded.
  bool bf16_layout_fits(CM out) const {
    return std::is_same_v<T, float> && this->ctx_->precision == Precision::BF16 && this->ctx_->lt_plans &&
           out.rows > 0 && out.cols > 0 &&
           out.cols % 8 == 0 && out.ld == out.cols && lt_alignment(out.data) >= 16;
  }
  // The bf16 rows of out's layout (d apart, in its first half), as a product's operand.
  static Staged bf16_rows(CM out) { return {bits(out.data), out.rows, out.cols, out.cols}; }
  // ln.out = LN(x) written in the bf16 layout (the statistics in fp32, as layernorm_forward's).
  Staged norm_forward_bf16(const NormSaved<T>& ln, CM x, CS gamma, CS beta) const {
    if constexpr (std::is_same_v<T, float>)
      cuda::layernorm_forward_bf16(*this->ctx_, bits(ln.out.data), ln.out.cols, ln.mean.data(), ln.rstd.data(), x,
                                   gamma.data(), beta.data(), 1e-5f);  // layernorm_forward's eps
    return bf16_rows(CM(ln.out));
  }
  // An output as the operand of the products that read it: in place where its forward wrote the bf16 layout.
  Operand recorded_operand(CM out) const { return recorded(out.data) ? Operand(out, bf16_rows(out)) : Operand(out); }
  // The qkv norm_linear_forward wrote in bf16 for the attention pair (LtPlans::bf16_qkv), handed over by the next
  // attention_linear_forward that reads it (take_qkv), which records it for its backward (recorded_qkv). A qkv that
  // forward does not read straight after its product (nothing in between but that pair's ops) is fp32 to it.
  void hand_qkv(const void* y) const {
    if (this->ctx_->lt_plans) this->ctx_->lt_plans->bf16_qkv = y;
  }
  // attention_linear_forward's qkv: its bf16 rows (qkv.cols apart) where norm_linear_forward just wrote it so, else null.
  const std::uint16_t* take_qkv(CM qkv) const {
    const bool bf16 = this->ctx_->lt_plans && qkv.data && this->ctx_->lt_plans->bf16_qkv == qkv.data;
    if (bf16) check_qkv_rows(qkv);
    hand_qkv(nullptr);
    record(qkv.data, bf16);
    return bf16 ? bits(qkv.data) : nullptr;
  }
  // attention_linear_backward's qkv: as its forward took it.
  const std::uint16_t* recorded_qkv(CM qkv) const {
    if (!recorded(qkv.data)) return nullptr;
    check_qkv_rows(qkv);
    return bits(qkv.data);
  }
  static void check_qkv_rows(CM qkv) {
    MOM_CHECK(qkv.ld == qkv.cols, "attention: the qkv ", shape(qkv),
              " norm_linear_forward wrote in bf16 must be read as the dense matrix it wrote");
  }

  // The layout record (LtPlans::bf16_layout): no allocation once every pair of a model has run a forward.
  void record(const void* buffer, bool bf16) const {
    if (!this->ctx_->lt_plans) return;
    auto& v = this->ctx_->lt_plans->bf16_layout;
    const auto it = std::find(v.begin(), v.end(), buffer);
    if (bf16 && it == v.end()) v.push_back(buffer);
    if (!bf16 && it != v.end()) v.erase(it);
  }
  bool recorded(const void* buffer) const {
    if (!this->ctx_->lt_plans) return false;
    const auto& v = this->ctx_->lt_plans->bf16_layout;
    return std::find(v.begin(), v.end(), buffer) != v.end();
  }
};

}  // namespace mom::cuda::detail

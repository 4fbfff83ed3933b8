#pragma once
// Multi-head causal self-attention module (GPT-2), with its own pre-LayerNorm (paper eq. (4)):
//   f(x) = proj(attention(qkv(LN(x))))
// The residual x + f(x) is added by the assembling function. MHA<N> is a family of N
// such modules inside a ModuleSet (paper eq. (1), m^A_1..m^A_N).
#include <array>

#include "mom/modules/module.hpp"

namespace mom {

namespace modules {

template <Dims D>
struct Attention {
  static constexpr index_t d = D.d_model;

  // Offsets of the tensors inside one module's parameter block, in layout order.
  static constexpr index_t o_ln_w = 0;
  static constexpr index_t o_ln_b = o_ln_w + d;
  static constexpr index_t o_w_qkv = o_ln_b + d;
  static constexpr index_t o_b_qkv = o_w_qkv + 3 * d * d;
  static constexpr index_t o_w_proj = o_b_qkv + 3 * d;
  static constexpr index_t o_b_proj = o_w_proj + d * d;
  static constexpr index_t params = o_b_proj + d;

  static constexpr std::array<TensorSpec, 6> tensors(index_t layer) {
    return {{{"ln_1.w", layer, 1, d, Init::One},
             {"ln_1.b", layer, 1, d, Init::Zero},
             {"attn.w_qkv", layer, 3 * d, d, Init::Normal},
             {"attn.b_qkv", layer, 1, 3 * d, Init::Zero},
             {"attn.w_proj", layer, d, d, Init::ResidualNormal},
             {"attn.b_proj", layer, 1, d, Init::Zero}}};
  }

  // Forward FLOPs per token at sequence length `seq`: the two GEMMs (qkv: 2*d*3d, proj:
  // 2*d*d) plus causal attention. Token t (0-based) scores t+1 keys: QK^T costs 2*hd*(t+1)
  // per head and PV the same, so a sequence costs sum_t 4*d*(t+1) = 2*d*seq*(seq+1) and a
  // token on average 2*d*(seq+1). These are the useful (causal) FLOPs, the usual convention for
  // MFU; the CPU op computes the triangle in 64-row blocks and so also multiplies the masked
  // half of each diagonal block (at most 32*hd extra multiply-adds per row and head).
  static constexpr index_t flops_per_token(index_t seq) { return 2 * d * 3 * d + 2 * d * d + 2 * d * (seq + 1); }
  // Backward: two products per linear (dx and dW); attention recomputes P = softmax(QKᵀ) from
  // the saved lse and forms dP = dO·Vᵀ, dV = Pᵀ·dO, dQ = dS·K, dK = dSᵀ·Q: five causal products
  // of d*(seq+1) FLOPs per token each.
  static constexpr index_t backward_flops_per_token(index_t seq) {
    return 2 * (2 * d * 3 * d + 2 * d * d) + 5 * d * (seq + 1);
  }

  // Activations forward keeps for backward.
  struct Saved {
    index_t ln, mean, rstd, qkv, att, lse;
  };
  static constexpr Saved plan(Arena& a, index_t batch, index_t seq) {
    const index_t n = batch * seq;
    Saved s{};
    s.ln = a.take(n * d);
    s.mean = a.take(n);
    s.rstd = a.take(n);
    s.qkv = a.take(n * 3 * d);
    s.att = a.take(n * d);
    s.lse = a.take(batch * D.heads * seq);
    return s;
  }
  // Backward scratch: d(att) [n x d], d(qkv) [n x 3d], d(ln) [n x d].
  static constexpr index_t scratch(index_t batch, index_t seq) { return batch * seq * 5 * d; }

  // f_out [n x d] = proj(attention(qkv(LN(x)))) for x [n x d], n = batch * seq.
  template <class Be, class T>
  static void forward(Be& be, const T* p, T* ws, const Saved& s, MatrixView<const T> x, MatrixView<T> f_out,
                      index_t batch, index_t seq) {
    using detail::mat, detail::vec;
    const index_t n = batch * seq;
    const auto ln = mat(ws, s.ln, n, d);
    const auto qkv = mat(ws, s.qkv, n, 3 * d);
    const auto att = mat(ws, s.att, n, d);
    be.layernorm_forward(ln, vec(ws, s.mean, n), vec(ws, s.rstd, n), x, vec(p, o_ln_w, d), vec(p, o_ln_b, d));
    be.linear_forward(qkv, MatrixView<const T>(ln), mat(p, o_w_qkv, 3 * d, d), vec(p, o_b_qkv, 3 * d));
    be.attention_forward(att, vec(ws, s.lse, batch * D.heads * seq), MatrixView<const T>(qkv), batch, seq, index_t{D.heads});
    be.linear_forward(f_out, MatrixView<const T>(att), mat(p, o_w_proj, d, d), vec(p, o_b_proj, d));
  }

  // Given df = dL/df_out, accumulate dL/dx into dx and dL/dparams into g (both +=).
  template <class Be, class T>
  static void backward(Be& be, const T* p, T* g, const T* ws, const Saved& s, MatrixView<const T> x, MatrixView<T> dx,
                       MatrixView<const T> df, T* scratch, index_t batch, index_t seq) {
    using detail::mat, detail::vec;
    const index_t n = batch * seq;
    const auto datt = mat(scratch, 0, n, d);
    const auto dqkv = mat(scratch, n * d, n, 3 * d);
    const auto dln = mat(scratch, 4 * n * d, n, d);
    be.zero(vec(scratch, 0, 5 * n * d));
    be.linear_backward(datt, mat(g, o_w_proj, d, d), vec(g, o_b_proj, d), df, mat(ws, s.att, n, d),
                       mat(p, o_w_proj, d, d));
    be.attention_backward(dqkv, MatrixView<const T>(datt), mat(ws, s.att, n, d), vec(ws, s.lse, batch * D.heads * seq),
                          mat(ws, s.qkv, n, 3 * d), batch, seq, index_t{D.heads});
    be.linear_backward(dln, mat(g, o_w_qkv, 3 * d, d), vec(g, o_b_qkv, 3 * d), MatrixView<const T>(dqkv),
                       mat(ws, s.ln, n, d), mat(p, o_w_qkv, 3 * d, d));
    be.layernorm_backward(dx, vec(g, o_ln_w, d), vec(g, o_ln_b, d), MatrixView<const T>(dln), x, vec(ws, s.mean, n),
                          vec(ws, s.rstd, n), vec(p, o_ln_w, d));
  }
};

}  // namespace modules

// MHA<N>: N attention modules in a ModuleSet.
template <int N>
struct MHA {
  static constexpr ModuleKind kind = ModuleKind::Attention;
  static constexpr int count = N;
  template <Dims D>
  using single = modules::Attention<D>;
};

}  // namespace mom

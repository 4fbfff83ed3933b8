#pragma once
// Executor of Assembly<Router<Sequential>, ModuleSet<MHA<L>, FFN<L>>, K<1>, H<L>, phi::MoM>:
// the dense stack. With one module per step and routing weight 1, phi_MoM's attention
// assembly (eq. (5)) and FFN assembly (eq. (6)) reduce to the single module, and eq. (4) gives
//   u_h     = x_h + m^A_h(x_h)
//   x_{h+1} = u_h + m^F_h(u_h)
// where each module applies its own LayerNorm first (pre-norm).
#include <algorithm>
#include <array>

#include "mom/assembly/assembly.hpp"

namespace mom {

template <class A, Dims D>
struct Executor<Sequential, A, D> {
  using Set = typename A::module_set;
  using Attn = modules::Attention<D>;
  using Ffn = modules::FeedForward<D>;
  static constexpr int L = A::h;
  static constexpr index_t d = D.d_model;

  static constexpr std::size_t tensor_count = Set::tensor_count;
  static constexpr index_t params = Set::template params<D>;
  static constexpr void specs(TensorSpec* out, index_t layer_base) { Set::template specs<D>(out, layer_base); }

  // Forward FLOPs per token: every step runs one attention and one FFN module.
  static constexpr index_t flops_per_token(index_t seq) {
    return L * (Attn::flops_per_token(seq) + Ffn::flops_per_token(seq));
  }
  static constexpr index_t backward_flops_per_token(index_t seq) {
    return L * (Attn::backward_flops_per_token(seq) + Ffn::backward_flops_per_token(seq));
  }

  // Saved for backward: each module's activations and the residual stream after each round
  // (u_h and x_{h+1}); the input x_0 belongs to the caller.
  struct Plan {
    std::array<typename Attn::Saved, L> attn{};
    std::array<typename Ffn::Saved, L> ffn{};
    std::array<index_t, L> u{};
    std::array<index_t, L> x_next{};
  };
  static constexpr Plan plan(Arena& a, index_t batch, index_t seq) {
    Plan p{};
    for (int h = 0; h < L; ++h) {
      p.attn[h] = Attn::plan(a, batch, seq);
      p.u[h] = a.take(batch * seq * d);
      p.ffn[h] = Ffn::plan(a, batch, seq);
      p.x_next[h] = a.take(batch * seq * d);
    }
    return p;
  }
  // Scratch shared with the other parts: a module's output f(x) [n x d] in forward, the
  // modules' backward scratch in backward.
  static constexpr index_t scratch(index_t batch, index_t seq) {
    return std::max({batch * seq * d, Attn::scratch(batch, seq), Ffn::scratch(batch, seq)});
  }

  // p: this part's parameter block. Returns the residual stream after the last step.
  template <class Be, class T>
  static MatrixView<const T> forward(Be& be, const T* p, T* ws, const Plan& plan, MatrixView<const T> x, T* scratch,
                                     index_t batch, index_t seq) {
    const index_t n = batch * seq;
    const MatrixView<T> f{scratch, n, d};
    const std::span<const T> f_flat{scratch, static_cast<std::size_t>(n * d)};
    for (int h = 0; h < L; ++h) {
      const MatrixView<T> u{ws + plan.u[h], n, d}, x_next{ws + plan.x_next[h], n, d};
      Attn::forward(be, p + Set::template attention_offset<D>(h), ws, plan.attn[h], x, f, batch, seq);
      be.add_forward(u.flat(), std::span<const T>(x.data, static_cast<std::size_t>(n * d)), f_flat);  // eq. (4)
      Ffn::forward(be, p + Set::template ffn_offset<D>(h), ws, plan.ffn[h], MatrixView<const T>(u), f, batch, seq);
      be.add_forward(x_next.flat(), std::span<const T>(u.flat()), f_flat);  // eq. (4)
      x = x_next;
    }
    return x;
  }

  // dres holds dL/dx_H on entry and dL/dx_0 on exit. The residual path is the identity, so
  // each module's backward reads dres as dL/df and accumulates its input gradient into
  // dres itself (a module reads df only in its first op, before it writes dx).
  template <class Be, class T>
  static void backward(Be& be, const T* p, T* g, const T* ws, const Plan& plan, MatrixView<const T> x0,
                       MatrixView<T> dres, T* scratch, index_t batch, index_t seq) {
    const index_t n = batch * seq;
    for (int h = L - 1; h >= 0; --h) {
      const MatrixView<const T> u{ws + plan.u[h], n, d};
      const MatrixView<const T> x = h == 0 ? x0 : MatrixView<const T>{ws + plan.x_next[h - 1], n, d};
      Ffn::backward(be, p + Set::template ffn_offset<D>(h), g + Set::template ffn_offset<D>(h), ws, plan.ffn[h], u,
                    dres, MatrixView<const T>(dres), scratch, batch, seq);
      Attn::backward(be, p + Set::template attention_offset<D>(h), g + Set::template attention_offset<D>(h), ws,
                     plan.attn[h], x, dres, MatrixView<const T>(dres), scratch, batch, seq);
    }
  }
};

}  // namespace mom

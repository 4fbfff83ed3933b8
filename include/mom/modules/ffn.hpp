#pragma once
// Feed-forward module (GPT-2), with its own pre-LayerNorm (paper eq. (4)):
//   f(x) = proj(GELU(fc(LN(x))))      fc: d -> d_ff, proj: d_ff -> d
// The residual is added by the assembling function. FFN<N> is a family of N such modules
// inside a ModuleSet (paper eq. (1), m^F_1..m^F_N).
#include <array>
#include <string_view>

#include "mom/backend/backend_concept.hpp"  // FusesMlp, NormSaved
#include "mom/modules/module.hpp"

namespace mom {

namespace modules {

template <Dims D>
struct FeedForward {
  static constexpr ModuleRole single_role = ModuleRole::TokenMixer;  // FFN<N>'s (modules/module.hpp)
  static constexpr index_t d = D.d_model;
  static constexpr index_t f = D.ff();

  static constexpr index_t o_ln_w = 0;
  static constexpr index_t o_ln_b = o_ln_w + d;
  static constexpr index_t o_w_fc = o_ln_b + d;
  static constexpr index_t o_b_fc = o_w_fc + f * d;
  static constexpr index_t o_w_proj = o_b_fc + f;
  static constexpr index_t o_b_proj = o_w_proj + d * f;
  static constexpr index_t params = o_b_proj + d;

  static constexpr std::array<TensorSpec, 6> tensors(index_t layer) {
    return {{{"ln_2.w", layer, 1, d, Init::One},
             {"ln_2.b", layer, 1, d, Init::Zero},
             {"mlp.w_fc", layer, f, d, Init::Normal},
             {"mlp.b_fc", layer, 1, f, Init::Zero},
             {"mlp.w_proj", layer, d, f, Init::ResidualNormal},
             {"mlp.b_proj", layer, 1, d, Init::Zero}}};
  }

  // Forward FLOPs per token: fc 2*d*d_ff + proj 2*d_ff*d (independent of seq).
  static constexpr index_t flops_per_token(index_t /*seq*/) { return 4 * d * f; }
  // Backward: two products (dx and dW) per linear.
  static constexpr index_t backward_flops_per_token(index_t /*seq*/) { return 8 * d * f; }

  struct Saved {
    index_t ln, mean, rstd, pre, act;
  };
  static constexpr Saved plan(Arena& a, index_t batch, index_t seq) {
    const index_t n = batch * seq;
    Saved s{};
    s.ln = a.take(n * d);
    s.mean = a.take(n);
    s.rstd = a.take(n);
    s.pre = a.take(n * f);  // fc output, GELU input
    s.act = a.take(n * f);  // GELU output
    return s;
  }
  // Backward scratch: d(act) [n x d_ff], d(pre) [n x d_ff], d(ln) [n x d].
  static constexpr index_t scratch(index_t batch, index_t seq) { return batch * seq * (2 * f + d); }

  template <class Be, class T>
  static void forward(Be& be, const T* p, T* ws, const Saved& s, MatrixView<const T> x, MatrixView<T> f_out,
                      index_t batch, index_t seq) {
    forward_into(be, p, ws, s, x, f_out, batch, seq, MatrixView<const T>{});
  }
  // out = x + f(x) (AddsResidualOn): the residual added in the proj product's epilogue by the FFN pair.
  template <class Be, class T>
    requires FusesMlp<Be, T>
  static void forward_residual(Be& be, const T* p, T* ws, const Saved& s, MatrixView<const T> x, MatrixView<T> out,
                               index_t batch, index_t seq) {
    forward_into(be, p, ws, s, x, out, batch, seq, x);
  }

 private:
  // forward's body: f_out = f(x), plus residual where given (forward_residual's: only on a backend with the FFN pair,
  // which adds it).
  template <class Be, class T>
  static void forward_into(Be& be, const T* p, T* ws, const Saved& s, MatrixView<const T> x, MatrixView<T> f_out,
                           index_t batch, index_t seq, MatrixView<const T> residual) {
    using detail::mat, detail::vec;
    const index_t n = batch * seq;
    const auto ln = mat(ws, s.ln, n, d);
    const auto pre = mat(ws, s.pre, n, f);
    if constexpr (FusesMlp<Be, T>) {  // LN and MLP as one op pair: ln, pre and act in the backend's layout
      be.mlp_forward(f_out, NormSaved<T>(ln, vec(ws, s.mean, n), vec(ws, s.rstd, n)), pre, mat(ws, s.act, n, f), x,
                     vec(p, o_ln_w, d), vec(p, o_ln_b, d), mat(p, o_w_fc, f, d), vec(p, o_b_fc, f),
                     mat(p, o_w_proj, d, f), vec(p, o_b_proj, d), residual);
    } else {
      be.layernorm_forward(ln, vec(ws, s.mean, n), vec(ws, s.rstd, n), x, vec(p, o_ln_w, d), vec(p, o_ln_b, d));
      be.linear_forward(pre, MatrixView<const T>(ln), mat(p, o_w_fc, f, d), vec(p, o_b_fc, f));
      be.gelu_forward(vec(ws, s.act, n * f), vec(static_cast<const T*>(ws), s.pre, n * f));
      be.linear_forward(f_out, mat(static_cast<const T*>(ws), s.act, n, f), mat(p, o_w_proj, d, f), vec(p, o_b_proj, d));
    }
  }

 public:
  template <class Be, class T>
  static void backward(Be& be, const T* p, T* g, const T* ws, const Saved& s, MatrixView<const T> x, MatrixView<T> dx,
                       MatrixView<const T> df, T* scratch, index_t batch, index_t seq) {
    using detail::mat, detail::vec;
    const index_t n = batch * seq;
    const auto dact = mat(scratch, 0, n, f);
    const auto dpre = mat(scratch, n * f, n, f);
    const auto dln = mat(scratch, 2 * n * f, n, d);
    // The scratch gradients are written (Store::overwrite), not accumulated: nothing to zero first.
    if constexpr (FusesMlp<Be, T>) {
      be.mlp_backward(dx, vec(g, o_ln_w, d), vec(g, o_ln_b, d), mat(g, o_w_fc, f, d), vec(g, o_b_fc, f),
                      mat(g, o_w_proj, d, f), vec(g, o_b_proj, d), dln, dact, dpre, df, x,
                      NormSaved<const T>(mat(ws, s.ln, n, d), vec(ws, s.mean, n), vec(ws, s.rstd, n)),
                      vec(p, o_ln_w, d), mat(ws, s.pre, n, f), mat(ws, s.act, n, f), mat(p, o_w_fc, f, d),
                      mat(p, o_w_proj, d, f));
    } else {
      be.linear_backward(dact, mat(g, o_w_proj, d, f), vec(g, o_b_proj, d), df, mat(ws, s.act, n, f),
                         mat(p, o_w_proj, d, f), Store::overwrite);
      be.gelu_backward(dpre.flat(), vec(ws, s.pre, n * f), std::span<const T>(dact.flat()), Store::overwrite);
      be.linear_backward(dln, mat(g, o_w_fc, f, d), vec(g, o_b_fc, f), MatrixView<const T>(dpre), mat(ws, s.ln, n, d),
                         mat(p, o_w_fc, f, d), Store::overwrite);
      be.layernorm_backward(dx, vec(g, o_ln_w, d), vec(g, o_ln_b, d), MatrixView<const T>(dln), x, vec(ws, s.mean, n),
                            vec(ws, s.rstd, n), vec(p, o_ln_w, d));
    }
  }

  // The same module over row groups (core/groups.hpp): the rows of group i of x run module i,
  // whose parameters start at p[i] (gradients at g[i]). Saved and scratch are planned for all the
  // packed rows (plan(a, 1, rows)); rows outside the groups are neither read nor written. Used by
  // the routed executors, whose group sizes stay in backend memory.
  template <class Be, class T>
  static void forward_grouped(Be& be, PerGroup<const T> p, T* ws, const Saved& s, MatrixView<const T> x,
                              MatrixView<T> f_out, RowGroups gr) {
    forward_grouped(be, p, ws, s, x, std::span<const token_t>{}, f_out, gr);
  }
  // dx += dL/dx over the groups' rows (Store::overwrite: dx = it). The scratch gradients are written, not
  // accumulated, so nothing is zeroed first.
  template <class Be, class T>
  static void backward_grouped(Be& be, PerGroup<const T> p, PerGroup<T> g, const T* ws, const Saved& s,
                               MatrixView<const T> x, MatrixView<T> dx, MatrixView<const T> df, T* scratch,
                               RowGroups gr, Store dx_store = Store::add) {
    backward_grouped(be, p, g, ws, s, x, std::span<const token_t>{}, dx, df, scratch, gr, dx_store);
  }

  // The same with packed row r reading x's row x_idx[r] (modules/module.hpp, ReadsRowsInPlace): only the
  // LayerNorm reads x, through the index, so a routed executor never gathers the rows (empty x_idx: x's own rows).
  static constexpr bool reads_rows_in_place = true;
  template <class Be, class T>
  static void forward_grouped(Be& be, PerGroup<const T> p, T* ws, const Saved& s, MatrixView<const T> x,
                              std::span<const token_t> x_idx, MatrixView<T> f_out, RowGroups gr) {
    using detail::mat, detail::vec;
    const index_t n = f_out.rows;
    const auto ln = mat(ws, s.ln, n, d);
    const auto pre = mat(ws, s.pre, n, f), act = mat(ws, s.act, n, f);
    be.grouped_layernorm_forward(ln, vec(ws, s.mean, n), vec(ws, s.rstd, n), x, x_idx, p.plus(o_ln_w), p.plus(o_ln_b),
                                 gr);
    be.grouped_linear_forward(pre, MatrixView<const T>(ln), p.plus(o_w_fc), p.plus(o_b_fc), gr);
    be.gelu_forward(act, MatrixView<const T>(pre), gr);
    be.grouped_linear_forward(f_out, MatrixView<const T>(act), p.plus(o_w_proj), p.plus(o_b_proj), gr);
  }
  template <class Be, class T>
  static void backward_grouped(Be& be, PerGroup<const T> p, PerGroup<T> g, const T* ws, const Saved& s,
                               MatrixView<const T> x, std::span<const token_t> x_idx, MatrixView<T> dx,
                               MatrixView<const T> df, T* scratch, RowGroups gr, Store dx_store) {
    using detail::mat, detail::vec;
    const index_t n = df.rows;
    const auto dact = mat(scratch, 0, n, f);
    const auto dpre = mat(scratch, n * f, n, f);
    const auto dln = mat(scratch, 2 * n * f, n, d);
    be.grouped_linear_backward(dact, g.plus(o_w_proj), g.plus(o_b_proj), df, mat(ws, s.act, n, f), p.plus(o_w_proj), gr,
                               Store::overwrite);
    be.gelu_backward(dpre, mat(ws, s.pre, n, f), MatrixView<const T>(dact), gr, Store::overwrite);
    be.grouped_linear_backward(dln, g.plus(o_w_fc), g.plus(o_b_fc), MatrixView<const T>(dpre), mat(ws, s.ln, n, d),
                               p.plus(o_w_fc), gr, Store::overwrite);
    be.grouped_layernorm_backward(dx, g.plus(o_ln_w), g.plus(o_ln_b), MatrixView<const T>(dln), x, x_idx,
                                  vec(ws, s.mean, n), vec(ws, s.rstd, n), p.plus(o_ln_w), gr, dx_store);
  }
};

}  // namespace modules

// FFN<N, Impl>: N feed-forward modules in a ModuleSet, each an Impl<D> (a TokenMixer;
// modules::FeedForward, GPT-2's, by default).
template <int N, template <Dims> class Impl = modules::FeedForward>
struct FFN {
  static constexpr ModuleRole role = ModuleRole::TokenMixer;
  static constexpr int count = N;
  template <Dims D>
  using single = typename checked_token_mixer<Impl<D>>::type;
};

// Fine-grained expert segmentation (DeepSeekMoE, arXiv 2401.06066 §3.1): an FFN of hidden width d_ff / m, so
// m of them hold the parameters and FLOPs of one GPT-2 FFN. Segmented<m>::ffn<D> is the module,
// Segmented<m>::family<N> the family: Experts<Segmented<4>::family, 32, PerStep> is 32 experts of width d_ff/4.
template <int m>
struct Segmented {
  static_assert(m >= 1, "mom::Segmented<m>: the segmentation factor m must be >= 1");
  template <Dims D>
  static constexpr Dims narrowed() {
    static_assert(D.ff() % m == 0, "mom::Segmented<m>: m must divide the model's d_ff");
    Dims e = D;
    e.d_ff = D.ff() / m;
    return e;
  }
  static constexpr std::array<char, 24> spelling = [] {  // "Segmented<m>"
    std::array<char, 24> a{};
    const char head[] = "Segmented<";
    std::size_t at = 0;
    for (char c : head)
      if (c) a[at++] = c;
    char digits[12]{};
    int n = 0;
    for (int v = m; v > 0; v /= 10) digits[n++] = char('0' + v % 10);
    while (n > 0) a[at++] = digits[--n];
    a[at] = '>';
    return a;
  }();
  template <Dims D>
  struct ffn : modules::FeedForward<narrowed<D>()> {
    static constexpr std::string_view name{spelling.data()};  // models/describe.hpp
  };
  template <int N>
  using family = FFN<N, ffn>;
};

}  // namespace mom

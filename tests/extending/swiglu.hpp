#pragma once
// (a) A new token mixer, defined outside the library: the SwiGLU feed-forward (Shazeer 2020,
// arXiv 2002.05202), f(x) = W_out (SiLU(a) ⊙ b), [a | b] = W_in LN(x), with its own pre-LayerNorm like
// the library's modules and no biases (as in LLaMA). It meets mom::TokenMixer (modules/module.hpp):
// tensors, params, cost, Saved / plan / scratch, forward / backward, dense and over row groups. Use it
// as FFN<N, ext::SwiGLU> in any ModuleSet (docs/extending.md, step 1).
//
// The matrix products are backend ops; the gating SiLU(a) ⊙ b is a loop over host memory, so this
// module runs on CPU backends (cpu::Backend and backends derived from it). A CUDA version would give
// the loop a kernel.
#include <mom/mom.hpp>

#include <array>
#include <cmath>
#include <type_traits>

namespace ext {

using mom::index_t;
using mom::MatrixView;
using mom::PerGroup;
using mom::RowGroups;

template <mom::Dims D>
struct SwiGLU {
  static constexpr const char* name = "SwiGLU";  // describe<> prints FFN<N, SwiGLU>
  static constexpr mom::ModuleRole single_role = mom::ModuleRole::TokenMixer;  // FFN<N, SwiGLU> only
  static constexpr index_t d = D.d_model, f = D.ff();

  // Parameters: LN gain and bias, W_in [2f × d] (a rows then b rows), W_out [d × f].
  static constexpr index_t o_ln_w = 0, o_ln_b = d, o_w_in = 2 * d, o_w_out = o_w_in + 2 * f * d;
  static constexpr index_t params = o_w_out + d * f;
  static constexpr std::array<mom::TensorSpec, 4> tensors(index_t layer) {
    return {{{"ln_2.w", layer, 1, d, mom::Init::One},
             {"ln_2.b", layer, 1, d, mom::Init::Zero},
             {"swiglu.w_in", layer, 2 * f, d, mom::Init::Normal},
             {"swiglu.w_out", layer, d, f, mom::Init::ResidualNormal}}};
  }
  // 2·d·2f for W_in, 2·f·d for W_out; backward two products each.
  static constexpr index_t flops_per_token(index_t) { return 6 * d * f; }
  static constexpr index_t backward_flops_per_token(index_t) { return 12 * d * f; }

  struct Saved {
    index_t ln, mean, rstd, ab, h;  // LN(x) [n×d], stats, [a|b] [n×2f], SiLU(a)⊙b [n×f]
  };
  static constexpr Saved plan(mom::Arena& a, index_t batch, index_t seq) {
    const index_t n = batch * seq;
    Saved s{};
    s.ln = a.take(n * d);
    s.mean = a.take(n);
    s.rstd = a.take(n);
    s.ab = a.take(n * 2 * f);
    s.h = a.take(n * f);
    return s;
  }
  // d(h) [n×f], d[a|b] [n×2f], d(LN) [n×d].
  static constexpr index_t scratch(index_t batch, index_t seq) { return batch * seq * (3 * f + d); }

  // ---- dense ------------------------------------------------------------------------------
  template <class Be, class T>
  static void forward(Be& be, const T* p, T* ws, const Saved& s, MatrixView<const T> x, MatrixView<T> out, index_t,
                      index_t) {
    const index_t n = x.rows;
    be.layernorm_forward(mv(ws + s.ln, n, d), sp(ws + s.mean, n), sp(ws + s.rstd, n), x, csp(p + o_ln_w, d),
                         csp(p + o_ln_b, d));
    be.linear_forward(mv(ws + s.ab, n, 2 * f), cmv(ws + s.ln, n, d), cmv(p + o_w_in, 2 * f, d), std::span<const T>{});
    gate_forward<Be>(ws + s.h, ws + s.ab, 0, n);
    be.linear_forward(out, cmv(ws + s.h, n, f), cmv(p + o_w_out, d, f), std::span<const T>{});
  }
  template <class Be, class T>
  static void backward(Be& be, const T* p, T* g, const T* ws, const Saved& s, MatrixView<const T> x, MatrixView<T> dx,
                       MatrixView<const T> dout, T* sc, index_t, index_t) {
    const index_t n = x.rows;
    T *dh = sc, *dab = sc + n * f, *dln = sc + 3 * n * f;
    be.zero(sp(sc, n * (3 * f + d)));
    be.linear_backward(mv(dh, n, f), mv(g + o_w_out, d, f), std::span<T>{}, dout, cmv(ws + s.h, n, f),
                       cmv(p + o_w_out, d, f));
    gate_backward<Be>(dab, dh, ws + s.ab, 0, n);
    be.linear_backward(mv(dln, n, d), mv(g + o_w_in, 2 * f, d), std::span<T>{}, cmv(dab, n, 2 * f), cmv(ws + s.ln, n, d),
                       cmv(p + o_w_in, 2 * f, d));
    be.layernorm_backward(dx, sp(g + o_ln_w, d), sp(g + o_ln_b, d), cmv(dln, n, d), x, csp(ws + s.mean, n),
                          csp(ws + s.rstd, n), csp(p + o_ln_w, d));
  }

  // ---- over row groups (group i's rows run the module whose parameters start at p[i]) ---------
  template <class Be, class T>
  static void forward_grouped(Be& be, PerGroup<const T> p, T* ws, const Saved& s, MatrixView<const T> x,
                              MatrixView<T> out, RowGroups gr) {
    const index_t n = x.rows;
    be.grouped_layernorm_forward(mv(ws + s.ln, n, d), sp(ws + s.mean, n), sp(ws + s.rstd, n), x, p.plus(o_ln_w),
                                 p.plus(o_ln_b), gr);
    be.grouped_linear_forward(mv(ws + s.ab, n, 2 * f), cmv(ws + s.ln, n, d), p.plus(o_w_in), PerGroup<const T>{}, gr);
    gate_forward<Be>(ws + s.h, ws + s.ab, gr.offsets[0], gr.offsets[gr.count]);  // host memory (CPU)
    be.grouped_linear_forward(out, cmv(ws + s.h, n, f), p.plus(o_w_out), PerGroup<const T>{}, gr);
  }
  template <class Be, class T>
  static void backward_grouped(Be& be, PerGroup<const T> p, PerGroup<T> g, const T* ws, const Saved& s,
                               MatrixView<const T> x, MatrixView<T> dx, MatrixView<const T> dout, T* sc, RowGroups gr) {
    const index_t n = x.rows;
    const MatrixView<T> dh = mv(sc, n, f), dab = mv(sc + n * f, n, 2 * f), dln = mv(sc + 3 * n * f, n, d);
    be.zero_rows(dh, gr);
    be.zero_rows(dab, gr);
    be.zero_rows(dln, gr);
    be.grouped_linear_backward(dh, g.plus(o_w_out), PerGroup<T>{}, dout, cmv(ws + s.h, n, f), p.plus(o_w_out), gr);
    gate_backward<Be>(dab.data, dh.data, ws + s.ab, gr.offsets[0], gr.offsets[gr.count]);
    be.grouped_linear_backward(dln, g.plus(o_w_in), PerGroup<T>{}, MatrixView<const T>(dab), cmv(ws + s.ln, n, d),
                               p.plus(o_w_in), gr);
    be.grouped_layernorm_backward(dx, g.plus(o_ln_w), g.plus(o_ln_b), MatrixView<const T>(dln), x, csp(ws + s.mean, n),
                                  csp(ws + s.rstd, n), p.plus(o_ln_w), gr);
  }

 private:
  template <class Be>
  static constexpr void require_host_memory() {
    static_assert(std::is_base_of_v<mom::cpu::Backend<typename Be::scalar>, Be>,
                  "ext::SwiGLU: the gating loop reads host memory: use a CPU backend");
  }
  static double sigmoid(double a) { return 1.0 / (1.0 + std::exp(-a)); }
  // h = SiLU(a) ⊙ b for rows [r0, r1).
  template <class Be, class T>
  static void gate_forward(T* h, const T* ab, index_t r0, index_t r1) {
    require_host_memory<Be>();
    for (index_t r = r0; r < r1; ++r)
      for (index_t j = 0; j < f; ++j) {
        const double a = ab[r * 2 * f + j], b = ab[r * 2 * f + f + j];
        h[r * f + j] = T(a * sigmoid(a) * b);
      }
  }
  // d[a|b] += from dh: dL/da = dh·b·SiLU'(a), dL/db = dh·SiLU(a); SiLU'(a) = σ(a)(1 + a(1 − σ(a))).
  template <class Be, class T>
  static void gate_backward(T* dab, const T* dh, const T* ab, index_t r0, index_t r1) {
    require_host_memory<Be>();
    for (index_t r = r0; r < r1; ++r)
      for (index_t j = 0; j < f; ++j) {
        const double a = ab[r * 2 * f + j], b = ab[r * 2 * f + f + j], g = dh[r * f + j], s = sigmoid(a);
        dab[r * 2 * f + j] += T(g * b * s * (1 + a * (1 - s)));
        dab[r * 2 * f + f + j] += T(g * a * s);
      }
  }
  template <class T>
  static MatrixView<T> mv(T* p, index_t r, index_t c) { return {p, r, c}; }
  template <class T>
  static MatrixView<const T> cmv(const T* p, index_t r, index_t c) { return {p, r, c}; }
  template <class T>
  static std::span<T> sp(T* p, index_t n) { return {p, std::size_t(n)}; }
  template <class T>
  static std::span<const T> csp(const T* p, index_t n) { return {p, std::size_t(n)}; }
};

}  // namespace ext

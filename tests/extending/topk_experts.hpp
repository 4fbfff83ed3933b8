#pragma once
// (d) A token mixer that routes inside itself, defined outside the library from the routing layer
// (include/mom/routing/, docs/extending.md "A module that routes rows itself"): E small GELU experts of width W
// behind a softmax top-K router with its own pre-LayerNorm,
//   x̂ = LN(x),  (w, E_t) = top-K(softmax(x̂ W_rᵀ)) renormalised,  y_t = Σ_{e ∈ E_t} w_e · W₂ᵉ GELU(W₁ᵉ x̂_t)
// with the router's balance loss as its auxiliary loss (ModuleWithAuxLoss). The selection is
// dispatch::select_forward (routing/select.hpp), the experts dispatch::ExpertMlp (routing/expert_mlp.hpp):
// gather, run per expert group, weighted scatter; the backward mirrors them. Every op is a backend op, so
// the module runs on the CPU and the CUDA backend alike. Use it as FFN<N, ext::TopKExperts<E, K, W>::type>.
#include <mom/mom.hpp>

#include <array>

namespace ext {

using mom::index_t;
using mom::MatrixView;

template <int E, int K, int W, class Balance = std::ratio<1, 100>>
struct TopKExperts {
  template <mom::Dims D>
  struct type {
    static constexpr const char* name = "TopKExperts";
    static constexpr bool has_aux_loss = true;
    static constexpr index_t d = D.d_model;
    static constexpr mom::RoutedChoices routed{E, K};  // ModuleWithRouting: read_picks below
    using Mlp = mom::dispatch::ExpertMlp<mom::dispatch::Gelu, E, d, W>;

    static constexpr index_t o_ln_w = 0, o_ln_b = d, o_r = 2 * d, o_w1 = o_r + E * d, o_w2 = o_w1 + Mlp::w1_size;
    static constexpr index_t params = o_w2 + Mlp::w2_size;
    static constexpr std::array<mom::TensorSpec, 5> tensors(index_t layer) {
      return {{{"ln_2.w", layer, 1, d, mom::Init::One},
               {"ln_2.b", layer, 1, d, mom::Init::Zero},
               {"experts.w_r", layer, E, d, mom::Init::Normal},
               {"experts.w1", layer, E * W, d, mom::Init::Normal},
               {"experts.w2", layer, E * d, W, mom::Init::ResidualNormal}}};
    }
    static constexpr index_t flops_per_token(index_t) { return 2 * d * E + K * 4 * d * W; }
    static constexpr index_t backward_flops_per_token(index_t seq) { return 2 * flops_per_token(seq); }

    struct Saved {
      index_t ln, mean, rstd;
      mom::dispatch::Selection sel;  // the router's logits → probabilities, picks, weights, groups, balance loss
      typename Mlp::Saved mlp;       // the experts' packed rows
      index_t aux;                   // = sel.loss
    };
    static constexpr Saved plan(mom::Arena& a, index_t batch, index_t seq) {
      const index_t n = batch * seq;
      Saved s{};
      s.ln = a.take(n * d);
      s.mean = a.take(n);
      s.rstd = a.take(n);
      s.sel = mom::dispatch::plan_selection(a, n, K, E);
      s.mlp = Mlp::plan(a, n * K);
      s.aux = s.sel.loss;
      return s;
    }
    struct Scratch {
      typename Mlp::Scratch mlp;
      index_t dwp, dws, dlogits, dln, total;
    };
    static constexpr Scratch scratch_plan(index_t n) {
      mom::Arena a;
      Scratch s{};
      s.mlp = Mlp::scratch_plan(a, n * K);
      s.dwp = a.take(n * K);
      s.dws = a.take(n * K);
      s.dlogits = a.take(n * E);
      s.dln = a.take(n * d);
      s.total = a.used;
      return s;
    }
    static constexpr index_t scratch(index_t batch, index_t seq) { return scratch_plan(batch * seq).total; }
    static constexpr double coef = double(Balance::num) / double(Balance::den);

    template <class Be, class T>
    static void forward(Be& be, const T* p, T* ws, const Saved& s, MatrixView<const T> x, MatrixView<T> out,
                        index_t batch, index_t seq) {
      const index_t n = batch * seq;
      const MatrixView<T> ln{ws + s.ln, n, d};
      be.layernorm_forward(ln, sp(ws + s.mean, n), sp(ws + s.rstd, n), x, csp(p + o_ln_w, d), csp(p + o_ln_b, d));
      be.linear_forward(MatrixView<T>{ws + s.sel.probs, n, E}, MatrixView<const T>(ln), MatrixView<const T>{p + o_r, E, d},
                        std::span<const T>{});
      mom::dispatch::select_forward(be, ws, s.sel, n, K, E, T(1), true, T(coef));
      be.zero(out);
      Mlp::forward(be, p + o_w1, p + o_w2, ws, s.mlp, mom::dispatch::routed_rows(static_cast<const T*>(ws), s.sel, E, n, K),
                   MatrixView<const T>(ln), out);
    }

    template <class Be, class T>
    static void backward(Be& be, const T* p, T* g, const T* ws, const Saved& s, MatrixView<const T> x, MatrixView<T> dx,
                         MatrixView<const T> dout, T* sc, index_t batch, index_t seq) {
      const index_t n = batch * seq, rows = n * K;
      const Scratch c = scratch_plan(n);
      const auto rr = mom::dispatch::routed_rows(ws, s.sel, E, n, K);
      const MatrixView<T> dln{sc + c.dln, n, d}, dlogits{sc + c.dlogits, n, E};
      const MatrixView<const T> ln{ws + s.ln, n, d};
      // The experts (dout read first; ln: the rows W₁'s gradient reads again), then their input gradient into dLN(x).
      const MatrixView<T> dxg = Mlp::backward(be, p + o_w1, p + o_w2, g + o_w1, g + o_w2, ws, s.mlp, rr, ln, dout, sc,
                                              c.mlp, sp(sc + c.dwp, rows));
      be.zero(dln);
      mom::dispatch::gather_backward(be, rr, MatrixView<const T>(dxg), dln);
      // The router: dL/d(weight) → dL/d(logits) (the balance loss's gradient included) → W_r and dLN(x).
      mom::dispatch::select_backward(be, ws, s.sel, n, K, E, T(1), true, csp(sc + c.dwp, rows), sp(sc + c.dws, rows),
                                     dlogits);
      be.linear_backward(dln, MatrixView<T>{g + o_r, E, d}, std::span<T>{}, MatrixView<const T>(dlogits), ln,
                         MatrixView<const T>{p + o_r, E, d});
      be.layernorm_backward(dx, sp(g + o_ln_w, d), sp(g + o_ln_b, d), MatrixView<const T>(dln), x, csp(ws + s.mean, n),
                            csp(ws + s.rstd, n), csp(p + o_ln_w, d));
    }

    template <class Be, class T>
    static void read_picks(Be& be, const T* ws, const Saved& s, index_t n, std::span<mom::token_t> out) {
      be.to_host(out, std::span<const mom::token_t>(mom::dispatch::toks(ws, s.sel.picks), std::size_t(n * K)));
    }

   private:
    template <class T>
    static std::span<T> sp(T* p, index_t n) { return {p, std::size_t(n)}; }
    template <class T>
    static std::span<const T> csp(const T* p, index_t n) { return {p, std::size_t(n)}; }
  };
};

}  // namespace ext

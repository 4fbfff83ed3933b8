#pragma once
// σ-MoE feed-forward (Csordás et al. 2023, arXiv 2310.10837), as MoEUT uses it (arXiv 2405.16039, §2.1):
// N_E small experts of width d_expert, each W₁ᵉ [d_expert × d] and W₂ᵉ [d × d_expert] (no biases), and
//   s_t  = σ(LN(x_t) · W_Sᵀ)                                   eq. (1): sigmoid expert scores
//   E_t  = top-K(s_t)                                          eq. (2)
//   y_t  = Σ_{e ∈ E_t} s_t[e] · ReLU(x̂_t W₁ᵉᵀ) W₂ᵉᵀ             eq. (3): sigmoid weights, not renormalised
// with x̂ = x under peri-LayerNorm (§2.4: LayerNorm only before the selection, none on the value path)
// and x̂ = LN(x) under pre-LayerNorm; under post-LayerNorm there is no LN before the selection either
// (s_t = σ(x_t W_Sᵀ), x̂ = x) and the module returns LN(x + y) − x (modules/norm_scheme.hpp). The regulariser within each sequence, eq. (4):
//   L = γ · (1/B) Σ_b Σ_e p_b[e] log p_b[e],   p_b = (1/T) Σ_t softmax(LN(x_{b,t}) · W_Sᵀ)
// is this module's auxiliary loss (ModuleWithAuxLoss, modules/module.hpp): added to the model's objective
// once per use of the module; its gradient is added in backward. No expert dropout.
//
// The experts run over exactly the chosen (token, expert) pairs: the n·K pairs are grouped by expert
// (routing/select.hpp, the same grouping as the MoE step), the expert MLP (routing/expert_mlp.hpp) runs
// expert e over its group only, one weighted scatter-add forms y (routing/dispatch.hpp). The group sizes stay in backend memory.
//
//   FFN<L, SigmaMoE<32, 4>::type>                      L σ-MoE modules (32 experts of 128, top-4)
//   SigmaMoE<N_E, K, d_expert, PeriNorm | PreNorm | PostNorm, std::ratio<γ>>
// It is a token mixer over (batch, seq) (the dense stack, parameter sharing, decoding); it has no
// row-group members, so it cannot be a MoM chunk's routed FFN (a compile error names the member).
#include <array>
#include <ratio>
#include <span>

#include "mom/routing/dispatch.hpp"
#include "mom/routing/expert_mlp.hpp"
#include "mom/routing/select.hpp"
#include "mom/modules/module.hpp"
#include "mom/modules/norm_scheme.hpp"

namespace mom {

template <int NE, int K, int DE = 128, class Norm = PeriNorm, class Gamma = std::ratio<1, 100>>
struct SigmaMoE {
  static_assert(NE >= 1 && NE <= max_row_groups, "mom::SigmaMoE<N_E, K>: N_E (experts) must be in 1..256");
  static_assert(K >= 1 && K <= NE, "mom::SigmaMoE<N_E, K>: K (active experts) must be in 1..N_E");
  static_assert(DE >= 1, "mom::SigmaMoE<N_E, K, d_expert>: d_expert must be >= 1");
  static_assert(is_norm_scheme<Norm>, "mom::SigmaMoE: the norm scheme must be PeriNorm, PreNorm or PostNorm");
  static_assert(Gamma::num >= 0, "mom::SigmaMoE: the entropy coefficient gamma must be >= 0");
  static constexpr int experts = NE, top_k = K, d_expert = DE;

  template <Dims D>
  struct type {
    static constexpr const char* name = "SigmaMoE";
    static constexpr bool has_aux_loss = true;
    static constexpr bool peri = std::is_same_v<Norm, PeriNorm>, post = std::is_same_v<Norm, PostNorm>;
    static constexpr index_t d = D.d_model, de = DE;
    static constexpr double gamma = double(Gamma::num) / double(Gamma::den);
    static constexpr RoutedChoices routed{NE, K};  // ModuleWithRouting: read_picks below
    using Mlp = dispatch::ExpertMlp<dispatch::Relu, NE, d, de>;  // eq. (3): the experts, routed

    static constexpr index_t o_ln_w = 0, o_ln_b = d, o_sel = 2 * d, o_w1 = o_sel + NE * d, o_w2 = o_w1 + Mlp::w1_size;
    static constexpr index_t params = o_w2 + Mlp::w2_size;
    static constexpr std::array<TensorSpec, 5> tensors(index_t layer) {
      return {{{"ln_2.w", layer, 1, d, Init::One},
               {"ln_2.b", layer, 1, d, Init::Zero},
               {"moe.w_sel", layer, NE, d, Init::Normal},
               {"moe.w1", layer, NE * de, d, Init::Normal},  // expert e: rows e·d_expert ..
               {"moe.w2", layer, NE * d, de, Init::ResidualNormal}}};  // expert e: rows e·d ..
    }
    // Forward FLOPs per token: the selection (2·d·N_E) and K experts (2·d·d_expert each way); MACs are
    // half of these (the paper's measure). The softmax of the regulariser and the LayerNorm are not counted.
    static constexpr index_t flops_per_token(index_t /*seq*/) { return 2 * d * NE + K * 4 * d * de; }
    static constexpr index_t backward_flops_per_token(index_t seq) { return 2 * flops_per_token(seq); }

    // Packed rows are the n·K (token, pick) pairs in expert order.
    struct Saved {
      index_t ln, mean, rstd;   // LN(x) [n × d] and its statistics (PostNorm: z = x + y and LN(z)'s)
      dispatch::Selection sel;  // logits (in sel.probs), sigmoid weights, picks, groups, the loss
      index_t dreg;             // d(regulariser)/d(logits) [n × N_E], written by forward
      typename Mlp::Saved mlp;  // packed: x̂ [rows × d], W₁ output and ReLU [rows × d_expert], W₂ output
      index_t aux;              // = sel.loss: γ·L (ModuleWithAuxLoss)
    };
    static constexpr Saved plan(Arena& a, index_t batch, index_t seq) {
      const index_t n = batch * seq, rows = n * K;
      Saved s{};
      s.ln = a.take(n * d);
      s.mean = a.take(n);
      s.rstd = a.take(n);
      s.sel = dispatch::plan_selection(a, n, K, NE);
      s.dreg = a.take(n * NE);
      s.mlp = Mlp::plan(a, rows);
      s.aux = s.sel.loss;
      return s;
    }
    struct Scratch {
      typename Mlp::Scratch mlp;
      index_t dwp, dws, dv, dlogits, dln, dz, total;
    };
    static constexpr Scratch scratch_plan(index_t n) {
      const index_t rows = n * K;
      Arena a;
      Scratch s{};
      s.mlp = Mlp::scratch_plan(a, rows);
      s.dwp = a.take(rows);
      s.dws = a.take(rows);
      s.dv = a.take(rows);
      s.dlogits = a.take(n * NE);
      s.dln = a.take(n * d);
      s.dz = post ? a.take(n * d) : 0;
      s.total = a.used;
      return s;
    }
    static constexpr index_t scratch(index_t batch, index_t seq) { return scratch_plan(batch * seq).total; }

    template <class Be, class T>
    static void forward(Be& be, const T* p, T* ws, const Saved& s, MatrixView<const T> x, MatrixView<T> f_out,
                        index_t batch, index_t seq) {
      using detail::mat, detail::vec;
      const index_t n = batch * seq;
      const auto ln = mat(ws, s.ln, n, d);
      const auto logits = mat(ws, s.sel.probs, n, NE);
      const MatrixView<const T> sel_in = post ? x : MatrixView<const T>(ln);  // what the selection reads
      if constexpr (!post)
        be.layernorm_forward(ln, vec(ws, s.mean, n), vec(ws, s.rstd, n), x, vec(p, o_ln_w, d), vec(p, o_ln_b, d));
      be.linear_forward(logits, sel_in, mat(p, o_sel, NE, d), std::span<const T>{});  // x·W_S
      dispatch::sigmoid_select_forward(be, ws, s.sel, ws + s.dreg, batch, seq, K, NE, T(gamma));  // eqs. (1), (2), (4)
      Mlp::forward(be, p + o_w1, p + o_w2, ws, s.mlp, dispatch::routed_rows(static_cast<const T*>(ws), s.sel, NE, n, K),
                   peri || post ? x : MatrixView<const T>(ln), f_out, Store::overwrite);  // eq. (3)
      if constexpr (post)
        detail::post_norm_forward(be, f_out, ln, vec(ws, s.mean, n), vec(ws, s.rstd, n), x, vec(p, o_ln_w, d),
                                  vec(p, o_ln_b, d));
    }

    // df may alias dx (the dense stack passes its residual gradient as both): df is read only by the
    // first op, the weighted scatter's backward (PostNorm: the post-norm's backward, which then hands
    // the experts dL/dz).
    template <class Be, class T>
    static void backward(Be& be, const T* p, T* g, const T* ws, const Saved& s, MatrixView<const T> x,
                         MatrixView<T> dx, MatrixView<const T> df, T* scratch, index_t batch, index_t seq) {
      using detail::mat, detail::vec;
      const index_t n = batch * seq, rows = n * K;
      const Scratch c = scratch_plan(n);
      const auto rr = dispatch::routed_rows(ws, s.sel, NE, n, K);
      const auto dlogits = mat(scratch, c.dlogits, n, NE), dln = mat(scratch, c.dln, n, d);
      MatrixView<const T> dy_out = df;  // dL/dy
      if constexpr (post) {
        const auto dz = mat(scratch, c.dz, n, d);
        detail::post_norm_backward(be, dz, vec(g, o_ln_w, d), vec(g, o_ln_b, d), df, mat(ws, s.ln, n, d),
                                   vec(ws, s.mean, n), vec(ws, s.rstd, n), vec(p, o_ln_w, d), dx);
        dy_out = dz;
      }
      // The experts: the weighted scatter, W₂, ReLU, W₁ over their groups.
      const MatrixView<const T> mlp_in = peri || post ? x : mat(ws, s.ln, n, d);  // what the forward's experts read
      const auto dxg = Mlp::backward(be, p + o_w1, p + o_w2, g + o_w1, g + o_w2, ws, s.mlp, rr, mlp_in, dy_out, scratch, c.mlp,
                                     vec(scratch, c.dwp, rows));
      // The selection: d weight → d σ → the picked logits, plus the regulariser's gradient.
      dispatch::sigmoid_select_backward(be, ws, s.sel, ws + s.dreg, n, K, NE, vec(static_cast<const T*>(scratch), c.dwp, rows),
                                        vec(scratch, c.dws, rows), vec(scratch, c.dv, rows), dlogits);
      // dL/dLN(x) starts here (written, not added); PostNorm: added to dx, which holds the post-norm's gradient.
      be.linear_backward(post ? dx : dln, mat(g, o_sel, NE, d), std::span<T>{}, MatrixView<const T>(dlogits),
                         post ? x : mat(ws, s.ln, n, d), mat(p, o_sel, NE, d), post ? Store::add : Store::overwrite);
      // The experts' input: x itself (peri, post) or LN(x) (pre).
      dispatch::gather_backward(be, rr, MatrixView<const T>(dxg), peri || post ? dx : dln);
      if constexpr (!post)
        be.layernorm_backward(dx, vec(g, o_ln_w, d), vec(g, o_ln_b, d), MatrixView<const T>(dln), x, vec(ws, s.mean, n),
                              vec(ws, s.rstd, n), vec(p, o_ln_w, d));
    }

    template <class Be, class T>
    static void read_picks(Be& be, const T* ws, const Saved& s, index_t n, std::span<token_t> out) {
      be.to_host(out, std::span<const token_t>(dispatch::toks(ws, s.sel.picks), std::size_t(n * K)));
    }
  };
};

}  // namespace mom

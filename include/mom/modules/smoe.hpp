#pragma once
// ModuleFormer's sparse mixture-of-experts feed-forward (Shen et al., arXiv 2306.04640, §3.1): N_ffd
// experts of width D_ffd, each W₁ᵉ [D_ffd × d] and W₂ᵉ [d × D_ffd] (no biases, GELU), and the MLP router
// of modules/mlp_gate.hpp:
//   g(·|x) = Top-k(softmax([A; A'] ReLU(B x̂)))                 eqs. (1)-(2) (gates not renormalised)
//   y      = Σ_{m ∈ top-k} g(m|x) · W₂ᵐ GELU(W₁ᵐ x̂)              x̂ = LN(x) (pre-LayerNorm)
// The router's loss (MutualInformation, eq. (7), by default) is this module's auxiliary loss
// (ModuleWithAuxLoss); it reports its picks (ModuleWithRouting) for usage statistics and pruning.
//
//   FFN<L, SMoE<16, 2, 256>::type>        L layers of 16 experts of 256, top-2
//   SMoE<N_ffd, k, D_ffd, D_rtr = 64, Loss = MutualInformation<>, N_new = 0, RoutReg = std::ratio<0>>
// N_new > 0 is the model after inserting N_new modules per layer (§4.3): their experts and router rows A'
// are separate tensors (smoe.w1_new, smoe.w2_new, smoe.router.w_a_new), so that a freeze pattern can
// train them alone (models/module_surgery.hpp); RoutReg λ adds λ‖A'‖² (eq. (10)).
//
// The experts run over exactly the chosen (token, expert) pairs, grouped by expert as in σ-MoE: the same
// expert MLP (routing/expert_mlp.hpp, here with GELU) and the same gather / weighted scatter (routing/dispatch.hpp). A token
// mixer over (batch, seq) (the dense stack, parameter sharing, decoding); it has no row-group members.
#include <array>
#include <ratio>
#include <span>

#include "mom/modules/mlp_gate.hpp"
#include "mom/routing/dispatch.hpp"
#include "mom/routing/expert_mlp.hpp"

namespace mom {

template <int N, int K, int DF, int Drtr = 64, class Loss = MutualInformation<>, int NNew = 0,
          class RoutReg = std::ratio<0>>
struct SMoE {
  static_assert(N >= 1 && NNew >= 0 && N + NNew <= max_row_groups,
                "mom::SMoE<N_ffd, k>: N_ffd (+ N_new) experts must be in 1..256");
  static_assert(K >= 1 && K <= N + NNew, "mom::SMoE<N_ffd, k>: k (active experts) must be in 1..N_ffd");
  static_assert(DF >= 1 && Drtr >= 1, "mom::SMoE<N_ffd, k, D_ffd, D_rtr>: D_ffd and D_rtr must be >= 1");
  static_assert(RoutReg::num >= 0, "mom::SMoE: the routing regularisation lambda must be >= 0");
  static constexpr int experts = N + NNew, top_k = K, d_ffd = DF, d_rtr = Drtr, inserted = NNew;
  // The same module with M experts inserted (§4.3; new experts and A' rows start fresh), another router
  // loss, or a set of `count` experts (pruning's compaction; models/module_surgery.hpp).
  template <int M, class Reg = std::ratio<0>>
  using with_inserted = SMoE<N, K, DF, Drtr, Loss, NNew + M, Reg>;
  template <class L2>
  using with_loss = SMoE<N, K, DF, Drtr, L2, NNew, RoutReg>;
  template <int count>
  using with_count = SMoE<count, K, DF, Drtr, Loss>;

  template <Dims D>
  struct type {
    static constexpr const char* name = "SMoE";
    static constexpr bool has_aux_loss = true;
    static constexpr index_t d = D.d_model, df = DF;
    static constexpr int C = N + NNew;
    using Gate = detail::MLPGate<D.d_model, N, NNew, K, Drtr, Loss, RoutReg>;
    static constexpr RoutedChoices routed{C, K};
    using Mlp = dispatch::ExpertMlp<dispatch::Gelu, C, d, df>;  // the experts, routed

    static constexpr index_t o_ln_w = 0, o_ln_b = d, o_gate = 2 * d, o_w1 = o_gate + Gate::params,
                             o_w2 = o_w1 + Mlp::w1_size;
    static constexpr index_t params = o_w2 + Mlp::w2_size;
    // Expert e's own parameters, for moving an expert between module types (models/module_surgery.hpp): its
    // router row of [A; A'], its W₁ᵉ and its W₂ᵉ (each block holds the C experts back to back); the mask.
    static constexpr std::array<ModuleSlice, 3> module_slices{{{o_gate + Gate::o_a, Drtr}, {o_w1, df * d}, {o_w2, d * df}}};
    static constexpr index_t o_prune = o_gate + Gate::o_prune;
    // The parameters one token uses (the cost model's "active parameters", arXiv 2306.04640 Table 1): all but
    // the experts it did not pick.
    static constexpr index_t active_params = params - (C - K) * (module_slices[0].size + module_slices[1].size + module_slices[2].size);
    static constexpr std::array<std::string_view, 4> gate_names{"smoe.router.w_b", "smoe.router.w_a",
                                                                "smoe.router.w_a_new", "smoe.router.prune"};
    static constexpr auto tensors(index_t layer) {
      constexpr std::size_t n = 2 + Gate::tensor_count + (NNew > 0 ? 4 : 2);
      std::array<TensorSpec, n> t{};
      std::size_t at = 0;
      t[at++] = {"ln_2.w", layer, 1, d, Init::One};
      t[at++] = {"ln_2.b", layer, 1, d, Init::Zero};
      for (const TensorSpec& s : Gate::tensors(gate_names, layer)) t[at++] = s;
      t[at++] = {"smoe.w1", layer, N * df, d, Init::Normal};  // expert e: rows e·D_ffd ..
      if constexpr (NNew > 0) t[at++] = {"smoe.w1_new", layer, NNew * df, d, Init::Normal};
      t[at++] = {"smoe.w2", layer, N * d, df, Init::ResidualNormal};  // expert e: rows e·d ..
      if constexpr (NNew > 0) t[at++] = {"smoe.w2_new", layer, NNew * d, df, Init::ResidualNormal};
      return t;
    }
    // Forward FLOPs per token: the router and k experts (2·d·D_ffd each way); GELU and LN not counted.
    static constexpr index_t flops_per_token(index_t /*seq*/) { return Gate::flops_per_token + K * 4 * d * df; }
    static constexpr index_t backward_flops_per_token(index_t seq) { return 2 * flops_per_token(seq); }

    // Packed rows are the n·k (token, pick) pairs in expert order.
    struct Saved {
      index_t ln, mean, rstd;   // LN(x) [n × d] and its statistics
      typename Gate::Saved gate;
      typename Mlp::Saved mlp;  // packed: LN(x) rows [rows × d], W₁ output and GELU [rows × D_ffd], W₂ output
      index_t aux;              // = the router's loss (ModuleWithAuxLoss)
    };
    static constexpr Saved plan(Arena& a, index_t batch, index_t seq) {
      const index_t n = batch * seq, rows = n * K;
      Saved s{};
      s.ln = a.take(n * d);
      s.mean = a.take(n);
      s.rstd = a.take(n);
      s.gate = Gate::plan(a, n);
      s.mlp = Mlp::plan(a, rows);
      s.aux = s.gate.sel.loss;
      return s;
    }
    struct Scratch {
      typename Mlp::Scratch mlp;
      index_t dwp, dln, gate, total;
    };
    static constexpr Scratch scratch_plan(index_t n) {
      const index_t rows = n * K;
      Arena a;
      Scratch s{};
      s.mlp = Mlp::scratch_plan(a, rows);
      s.dwp = a.take(rows);
      s.dln = a.take(n * d);
      s.gate = a.take(Gate::scratch_plan(n).total);
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
      be.layernorm_forward(ln, vec(ws, s.mean, n), vec(ws, s.rstd, n), x, vec(p, o_ln_w, d), vec(p, o_ln_b, d));
      Gate::forward(be, p + o_gate, ws, s.gate, MatrixView<const T>(ln));  // eqs. (1), (2), (7)
      Mlp::forward(be, p + o_w1, p + o_w2, ws, s.mlp, dispatch::routed_rows(static_cast<const T*>(ws), s.gate.sel, C, n, K),
                   MatrixView<const T>(ln), f_out, Store::overwrite);
    }

    // df may alias dx: df is read only by the first op, the weighted scatter's backward.
    template <class Be, class T>
    static void backward(Be& be, const T* p, T* g, const T* ws, const Saved& s, MatrixView<const T> x,
                         MatrixView<T> dx, MatrixView<const T> df_, T* sc, index_t batch, index_t seq) {
      using detail::mat, detail::vec;
      const index_t n = batch * seq, rows = n * K;
      const Scratch c = scratch_plan(n);
      const auto rr = dispatch::routed_rows(ws, s.gate.sel, C, n, K);
      const auto dln = mat(sc, c.dln, n, d);
      const auto dxg = Mlp::backward(be, p + o_w1, p + o_w2, g + o_w1, g + o_w2, ws, s.mlp, rr, mat(ws, s.ln, n, d), df_,
                                     sc, c.mlp,
                                     vec(sc, c.dwp, rows));
      dispatch::gather_backward(be, rr, MatrixView<const T>(dxg), dln, Store::overwrite);
      Gate::backward(be, p + o_gate, g + o_gate, ws, s.gate, mat(ws, s.ln, n, d), dln,
                     vec(static_cast<const T*>(sc), c.dwp, rows), sc + c.gate);
      be.layernorm_backward(dx, vec(g, o_ln_w, d), vec(g, o_ln_b, d), MatrixView<const T>(dln), x, vec(ws, s.mean, n),
                            vec(ws, s.rstd, n), vec(p, o_ln_w, d));
    }

    template <class Be, class T>
    static void read_picks(Be& be, const T* ws, const Saved& s, index_t n, std::span<token_t> out) {
      Gate::read_picks(be, ws, s.gate, n, out);
    }
  };
};

}  // namespace mom

#pragma once
// ModuleFormer's mixture of stick-breaking attention heads (MoA; Shen et al., arXiv 2306.04640, §3.2, after
// Zhang et al. 2022, arXiv 2210.05144): N_att expert heads of width D_att, each with its own W_qᵉ [D_att × d]
// and W_oᵉ [d × D_att]; W_k and W_v [D_att × d] shared by all heads of the layer; the MLP router of
// modules/mlp_gate.hpp picks k heads per token:
//   x̂ = LN(x),  k_i = W_k x̂_i,  v_i = W_v x̂_i                          (shared keys and values)
//   g(·|x_t) = Top-k(softmax([A; A'] ReLU(B x̂_t)))                     eqs. (1)-(2), not renormalised
//   q_t^e = W_qᵉ x̂_t,  o_t^e = Σ_{i<=t} p_{i,t}(q_t^e) v_i              eqs. (3)-(4): stick-breaking
//   y_t = Σ_{e ∈ top-k} g(e|x_t) · W_oᵉ o_t^e                             eq. (5), summed over the chosen heads
// No position embedding (dims: without_positions): the stick-breaking weights encode order.
//
// Because K/V are shared, a token's k chosen heads are k query heads of one multi-query attention: the
// queries are laid out per (token, slot) — slot j of token t holds q_t^{e_j(t)} — and the backend's
// stick_breaking op runs over [Q (k·D_att) | K | V] with k query heads and one key/value head. The query
// and output projections run over exactly the n·k chosen (token, head) pairs, grouped by head
// (routing/dispatch.hpp: gather, to_pairs / from_pairs, combine), as σ-MoE's experts do.
//
//   MHA<L, MoA<8, 2, 64>::type>      L layers of 8 heads of 64, 2 active per token
//   MoA<N_att, k, D_att, D_rtr = 64, Loss = MutualInformation<>, N_new = 0, RoutReg = std::ratio<0>>
// N_new > 0: N_new inserted heads (§4.3) in separate tensors moa.w_q_new, moa.w_o_new, moa.router.w_a_new.
// The router's loss is the module's auxiliary loss; it reports its picks (ModuleWithRouting). A sequence
// mixer over (batch, seq) with KV-cache decoding (DecodingSequenceMixerOn): the cache holds the shared
// k and v (D_att wide) of every position.
#include <array>
#include <ratio>
#include <span>

#include "mom/modules/mlp_gate.hpp"
#include "mom/routing/dispatch.hpp"

namespace mom {

template <int N, int K, int DA, int Drtr = 64, class Loss = MutualInformation<>, int NNew = 0,
          class RoutReg = std::ratio<0>>
struct MoA {
  static_assert(N >= 1 && NNew >= 0 && N + NNew <= max_row_groups, "mom::MoA<N_att, k>: N_att (+ N_new) heads must be in 1..256");
  static_assert(K >= 1 && K <= N + NNew, "mom::MoA<N_att, k>: k (active heads) must be in 1..N_att");
  static_assert(DA >= 1 && Drtr >= 1, "mom::MoA<N_att, k, D_att, D_rtr>: D_att and D_rtr must be >= 1");
  static_assert(RoutReg::num >= 0, "mom::MoA: the routing regularisation lambda must be >= 0");
  static constexpr int experts = N + NNew, top_k = K, d_att = DA, d_rtr = Drtr, inserted = NNew;
  // The same module with M modules inserted (§4.3; new heads and A' rows start fresh), another router loss,
  // or a set of `count` heads (pruning's compaction; models/module_surgery.hpp).
  template <int M, class Reg = std::ratio<0>>
  using with_inserted = MoA<N, K, DA, Drtr, Loss, NNew + M, Reg>;
  template <class L2>
  using with_loss = MoA<N, K, DA, Drtr, L2, NNew, RoutReg>;
  template <int count>
  using with_count = MoA<count, K, DA, Drtr, Loss>;

  template <Dims D>
  struct type {
    static constexpr const char* name = "MoA";
    static constexpr bool has_aux_loss = true;
    static_assert(!D.rope() && !D.learned_positions(),
                  "mom::MoA: stick-breaking attention encodes order itself: use dims without positions "
                  "(without_positions(dims), Positions::None)");
    static constexpr index_t d = D.d_model, da = DA, qw = K * DA;  // qw: the query slots' width
    static constexpr int C = N + NNew;
    using Gate = detail::MLPGate<D.d_model, N, NNew, K, Drtr, Loss, RoutReg>;
    static constexpr RoutedChoices routed{C, K};

    static constexpr index_t o_ln_w = 0, o_ln_b = d, o_gate = 2 * d, o_kv = o_gate + Gate::params,
                             o_q = o_kv + 2 * da * d, o_o = o_q + C * da * d;
    static constexpr index_t params = o_o + C * d * da;
    // Head e's own parameters, for moving a head between module types (models/module_surgery.hpp): its
    // router row of [A; A'], its W_qᵉ and its W_oᵉ (each block holds the C heads back to back); the mask.
    static constexpr std::array<ModuleSlice, 3> module_slices{{{o_gate + Gate::o_a, Drtr}, {o_q, da * d}, {o_o, d * da}}};
    static constexpr index_t o_prune = o_gate + Gate::o_prune;
    // The parameters one token uses (the cost model's "active parameters", arXiv 2306.04640 Table 1): all but
    // the heads it did not pick.
    static constexpr index_t active_params = params - (C - K) * (module_slices[0].size + module_slices[1].size + module_slices[2].size);
    static constexpr std::array<std::string_view, 4> gate_names{"moa.router.w_b", "moa.router.w_a",
                                                                "moa.router.w_a_new", "moa.router.prune"};
    static constexpr auto tensors(index_t layer) {
      constexpr std::size_t n = 3 + Gate::tensor_count + (NNew > 0 ? 4 : 2);
      std::array<TensorSpec, n> t{};
      std::size_t at = 0;
      t[at++] = {"ln_1.w", layer, 1, d, Init::One};
      t[at++] = {"ln_1.b", layer, 1, d, Init::Zero};
      for (const TensorSpec& s : Gate::tensors(gate_names, layer)) t[at++] = s;
      t[at++] = {"moa.w_kv", layer, 2 * da, d, Init::Normal};  // W_k rows 0 .., then W_v
      t[at++] = {"moa.w_q", layer, N * da, d, Init::Normal};   // head e: rows e·D_att ..
      if constexpr (NNew > 0) t[at++] = {"moa.w_q_new", layer, NNew * da, d, Init::Normal};
      t[at++] = {"moa.w_o", layer, N * d, da, Init::ResidualNormal};  // head e: rows e·d ..
      if constexpr (NNew > 0) t[at++] = {"moa.w_o_new", layer, NNew * d, da, Init::ResidualNormal};
      return t;
    }
    // Forward FLOPs per token: the router, K and V (2·d·2·D_att), k query and k output projections
    // (2·d·D_att each), the k heads' causal attention as modules::Attention counts it (2·k·D_att·(seq+1)).
    static constexpr index_t linear_flops = Gate::flops_per_token + 2 * d * 2 * da + K * 4 * d * da;
    static constexpr index_t flops_per_token(index_t seq) { return linear_flops + 2 * qw * (seq + 1); }
    static constexpr index_t backward_flops_per_token(index_t seq) { return 2 * linear_flops + 5 * qw * (seq + 1); }

    // Packed rows are the n·k (token, head) pairs in head order; "pair order" is token-major (t·k + slot).
    struct Saved {
      index_t ln, mean, rstd;  // LN(x) [n × d] and its statistics
      typename Gate::Saved gate;
      index_t qp;              // packed queries [rows × D_att] (W_q reads LN(x)'s rows through the picks)
      index_t qkv, att;        // [Q (k·D_att) | K | V] [n × (k+2)·D_att]; attention output [n × k·D_att]
      index_t og, yg;          // packed attention outputs [rows × D_att] and head outputs [rows × d]
      index_t aux;             // = the router's loss (ModuleWithAuxLoss)
    };
    static constexpr Saved plan(Arena& a, index_t batch, index_t seq) {
      const index_t n = batch * seq, rows = n * K;
      Saved s{};
      s.ln = a.take(n * d);
      s.mean = a.take(n);
      s.rstd = a.take(n);
      s.gate = Gate::plan(a, n);
      s.qp = a.take(rows * da);
      s.qkv = a.take(n * (qw + 2 * da));
      s.att = a.take(n * qw);
      s.og = a.take(rows * da);
      s.yg = a.take(rows * d);
      s.aux = s.gate.sel.loss;
      return s;
    }
    struct Scratch {
      index_t dy, dwp, dog, datt, dqkv, dln, gate, total;
    };
    static constexpr Scratch scratch_plan(index_t n) {
      const index_t rows = n * K;
      Arena a;
      Scratch s{};
      s.dy = a.take(rows * d);      // dL/d(head outputs), then dL/d(gathered LN(x))
      s.dwp = a.take(rows);
      s.dog = a.take(rows * da);    // dL/d(packed attention outputs), then dL/d(packed queries)
      s.datt = a.take(n * qw);      // dL/d(attention output), then dL/dQ in pair order
      s.dqkv = a.take(n * (qw + 2 * da));
      s.dln = a.take(n * d);
      s.gate = a.take(Gate::scratch_plan(n).total);
      s.total = a.used;
      return s;
    }
    static constexpr index_t scratch(index_t batch, index_t seq) { return scratch_plan(batch * seq).total; }

    template <class T>
    static PerGroup<T> w_q(T* p) {
      return uniform_groups(p + o_q, C, da * d);
    }
    template <class T>
    static PerGroup<T> w_o(T* p) {
      return uniform_groups(p + o_o, C, d * da);
    }

    template <class Be, class T>
    static void forward(Be& be, const T* p, T* ws, const Saved& s, MatrixView<const T> x, MatrixView<T> f_out,
                        index_t batch, index_t seq) {
      run(be, p, ws, s, x, f_out, batch * seq, [&](MatrixView<T> qkv, MatrixView<T> att) {
        be.stick_breaking_forward(att, MatrixView<const T>(qkv), batch, seq, K, 1);
      });
    }

    // ---- incremental decoding (infer/decoder.hpp; DecodingSequenceMixer) ------------------------------
    // One new token per active sequence: forward's body over the step's rows (the router's loss is computed
    // and unused); row r's shared k and v are written at (slot[r], pos[r]) of the caches' first D_att
    // columns, then its k query heads attend to positions 0..pos[r] of its sequence.
    using DecodeSaved = Saved;
    static constexpr DecodeSaved plan_decode(Arena& a, index_t rows) { return plan(a, rows, 1); }
    template <class Be, class T>
    static void decode(Be& be, const T* p, T* ws, const DecodeSaved& s, MatrixView<const T> x, MatrixView<T> f_out,
                       MatrixView<T> k_cache, MatrixView<T> v_cache, std::span<const index_t> slot,
                       std::span<const index_t> pos, index_t max_len) {
      MOM_CHECK(k_cache.cols >= da && v_cache.cols >= da, "MoA::decode: caches ", k_cache.cols, " wide for D_att = ", da);
      const MatrixView<T> kc = k_cache.col_block(0, da), vc = v_cache.col_block(0, da);
      run(be, p, ws, s, x, f_out, x.rows, [&](MatrixView<T> qkv, MatrixView<T> att) {
        be.kv_write(kc, vc, MatrixView<const T>(qkv.col_block(qw - da, 3 * da)), slot, pos, max_len);  // [q_last|k|v]
        be.stick_breaking_decode(att, MatrixView<const T>(qkv), MatrixView<const T>(kc), MatrixView<const T>(vc), slot,
                                 pos, max_len, K, 1);
      });
    }

    // forward's body: LN, the router, the chosen heads' queries in pair order, the shared K and V,
    // attend(qkv, att) (the causal op in forward, the cache in decode), the chosen heads' outputs.
    template <class Be, class T, class Attend>
    static void run(Be& be, const T* p, T* ws, const Saved& s, MatrixView<const T> x, MatrixView<T> f_out, index_t n,
                    Attend&& attend) {
      using detail::mat, detail::vec;
      const index_t rows = n * K;
      const auto ln = mat(ws, s.ln, n, d);
      const auto qkv = mat(ws, s.qkv, n, qw + 2 * da), att = mat(ws, s.att, n, qw);
      const auto qp = mat(ws, s.qp, rows, da);
      const auto qc = mat(ws, s.att, rows, da);  // the queries in pair order, staged in att before attend writes it
      const auto og = mat(ws, s.og, rows, da), yg = mat(ws, s.yg, rows, d);
      be.layernorm_forward(ln, vec(ws, s.mean, n), vec(ws, s.rstd, n), x, vec(p, o_ln_w, d), vec(p, o_ln_b, d));
      Gate::forward(be, p + o_gate, ws, s.gate, MatrixView<const T>(ln));  // eqs. (1), (2), (7)
      const auto rr = dispatch::routed_rows(static_cast<const T*>(ws), s.gate.sel, C, n, K);
      be.grouped_linear_forward(qp, MatrixView<const T>(ln), rr.token, w_q(p), PerGroup<const T>{}, rr.groups);  // q_t^e
      dispatch::to_pairs(be, rr, MatrixView<const T>(qp), qc);
      be.copy(qkv.col_block(0, qw), MatrixView<const T>(qc.data, n, qw));
      be.linear_forward(qkv.col_block(qw, 2 * da), MatrixView<const T>(ln), mat(p, o_kv, 2 * da, d), std::span<const T>{});
      attend(qkv, att);  // eqs. (3)-(4)
      dispatch::from_pairs(be, rr, MatrixView<const T>(att.data, rows, da), og);  // back to head order
      be.grouped_linear_forward(yg, MatrixView<const T>(og), w_o(p), PerGroup<const T>{}, rr.groups);
      dispatch::combine(be, rr, MatrixView<const T>(yg), f_out, Store::overwrite);  // eq. (5)
    }

    // df may alias dx: df is read only by the first op, the weighted scatter's backward.
    template <class Be, class T>
    static void backward(Be& be, const T* p, T* g, const T* ws, const Saved& s, MatrixView<const T> x,
                         MatrixView<T> dx, MatrixView<const T> df, T* sc, index_t batch, index_t seq) {
      using detail::mat, detail::vec;
      const index_t n = batch * seq, rows = n * K;
      const Scratch c = scratch_plan(n);
      const auto rr = dispatch::routed_rows(ws, s.gate.sel, C, n, K);
      const RowGroups gr = rr.groups;
      const auto dy = mat(sc, c.dy, rows, d), dog = mat(sc, c.dog, rows, da), datt = mat(sc, c.datt, rows, da);
      const auto dqkv = mat(sc, c.dqkv, n, qw + 2 * da), dln = mat(sc, c.dln, n, d);
      const auto ln = mat(ws, s.ln, n, d);
      // eq. (5): the heads' outputs and gates.
      // dog's and (below) dy's group rows are overwritten; to_pairs and gather_backward read no others.
      dispatch::combine_linear_backward(be, rr, mat(ws, s.yg, rows, d), df, dy, vec(sc, c.dwp, rows), dog, w_o(g),
                                        mat(ws, s.og, rows, da), std::span<const token_t>{}, w_o(p), Store::overwrite);
      dispatch::to_pairs(be, rr, MatrixView<const T>(dog), datt);
      // eqs. (3)-(4): the attention, then K and V.
      be.zero(dqkv);
      be.stick_breaking_backward(dqkv, MatrixView<const T>(datt.data, n, qw), mat(ws, s.att, n, qw),
                                 mat(ws, s.qkv, n, qw + 2 * da), batch, seq, K, 1);
      be.linear_backward(dln, mat(g, o_kv, 2 * da, d), std::span<T>{}, MatrixView<const T>(dqkv.col_block(qw, 2 * da)), ln,
                         mat(p, o_kv, 2 * da, d), Store::overwrite);
      // The queries: pair order → head order → W_q.
      be.copy(MatrixView<T>(datt.data, n, qw), MatrixView<const T>(dqkv.col_block(0, qw)));
      dispatch::from_pairs(be, rr, MatrixView<const T>(datt), dog);
      be.grouped_linear_backward(dy, w_q(g), PerGroup<T>{}, MatrixView<const T>(dog), ln, rr.token, w_q(p), gr,
                                 Store::overwrite);
      dispatch::gather_backward(be, rr, MatrixView<const T>(dy), dln);
      Gate::backward(be, p + o_gate, g + o_gate, ws, s.gate, ln, dln, vec(static_cast<const T*>(sc), c.dwp, rows),
                     sc + c.gate);
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

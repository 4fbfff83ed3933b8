#pragma once
// Executor of Assembly<Router<GRU, ...>, ModuleSet<MHA<N_A>, FFN<N_F>[, Skip]>, K<k>, H<h>, phi::MoM>:
// the Mixture-of-Modules assembling function φ_MoM (paper §3.2) driven by GRU routers (§3.3).
// docs/mom.md maps every line to the paper and lists where we follow the authors' code.
//
// Round h = 0..H-1 of a chunk, for every token t (x_0 = the chunk's input):
//   s^A_h = GRU^A(x_h, s^A_{h-1}),  r^A = top-K(softmax(W_A s^A_h / tau)), renormalised   eqs. (7)-(8)
//   u_h     = x_h + Σ_{m ∈ K_A, m ≠ S} r^A_m · m^A_m(x_h)                                  eqs. (4), (5)
//   s^F_h = GRU^F(u_h, s^F_{h-1}),  r^F likewise
//   x_{h+1} = u_h + Σ_{m ∈ K_F, m ≠ S} r^F_m · m^F_m(u_h)                                  eqs. (4), (6)
// with s_{-1} = 0. A module m(x) = W_O(...LN_m(x)...) + b_O keeps its own LayerNorm; the
// routing weight multiplies only its output (the module's projection and bias), which is where
// the router's gradient comes from. SKIP gives no update.
//
// Attention keys/values (eq. (5) sums the picked modules' projections; the authors' code runs
// every picked module over the whole sequence and masks its output by the routing weight):
//   phi::MoM          (default, the authors' semantics) module m's query for token t attends to
//                     the keys/values that module m computes from LN_m(x_s) for EVERY token s ≤ t
//                     of t's sequence, whether or not s was routed to m, and also when s picked
//                     SKIP. Cost of a used module: its K/V projection over all tokens + per routed
//                     token Q, attention, output projection.
//   phi::MoMRoutedKV  module m's keys/values come only from the tokens routed to m in this round:
//                     skipped tokens (and tokens sent to other modules) are masked out of other
//                     tokens' attention. Every cost is then per routed token (MoD-style).
//
// Dispatch (docs/design.md "Data and the hot path"; assembly/grouped_dispatch.hpp, shared with the
// MoE executor): the router's n×K (token, module) picks are grouped by module with a stable
// counting sort (group_by_choice: causal order kept inside a group); per module one gather, its
// GEMMs over exactly its tokens, one weighted scatter-add. Modules no token picked cost nothing;
// SKIP's group is never touched.
#include <algorithm>
#include <array>
#include <type_traits>

#include "mom/assembly/assembly.hpp"
#include "mom/assembly/decode_rounds.hpp"
#include "mom/assembly/grouped_dispatch.hpp"
#include "mom/assembly/phi.hpp"
#include "mom/routers/gru.hpp"
#include "mom/modules/checked.hpp"

namespace mom {


template <class A, Dims D>
struct Executor<GRU, A, D> : WorkspaceViews {
  using Set = typename A::module_set;
  using Cfg = GRUConfig<typename A::router::options>;
  static_assert(sizeof(GRU::VerifyOptions<typename A::router::options>) > 0);  // runs the option checks
  static_assert(std::is_same_v<typename A::phi_type, phi::MoM> || std::is_same_v<typename A::phi_type, phi::MoMRoutedKV>,
                "mom::Router<GRU> assembles with phi::MoM or phi::MoMRoutedKV");
  // MoM runs attention over row groups: the set's sequence mixer must be a RoutedSequenceMixer.
  static_assert(sizeof(VerifyRoutedSequenceMixer<typename Set::template attention<D>>) > 0);
  using Attn = typename Set::template routed_attention<D>;
  using Ffn = typename Set::template ffn<D>;

  static constexpr int NA = Set::n_attention, NF = Set::n_ffn, Hn = A::h, Kp = A::k;
  static_assert(NA <= max_row_groups && NF <= max_row_groups,
                "mom::phi::MoM: at most 256 modules of each kind (mom::max_row_groups: the grouped ops pass one "
                "parameter offset per module to their kernels)");
  static constexpr int EA = Set::selectable_attention, EF = Set::selectable_ffn;  // SKIP is class N (last)
  static constexpr int Emax = EA > EF ? EA : EF;
  static constexpr index_t d = D.d_model, W = Cfg::width_for(D.d_model);
  static constexpr bool routed_kv = std::is_same_v<typename A::phi_type, phi::MoMRoutedKV>;
  static constexpr KeySource keys = routed_kv ? KeySource::Routed : KeySource::AllTokens;
  // Picks that can land on a computing module (K = N + 1 with SKIP always includes SKIP).
  static constexpr int real_a = Kp < NA ? Kp : NA, real_f = Kp < NF ? Kp : NF;

  // ---- parameters: the module set (names h.<base+i>.*), then the two routers (GRU::tensors) ----
  using RouterOffsets = GRU::Offsets;
  static constexpr RouterOffsets ra = GRU::offsets(Set::template params<D>, d, W, EA);
  static constexpr RouterOffsets rf = GRU::offsets(ra.end, d, W, EF);
  static constexpr std::size_t tensor_count = Set::template tensor_count<D> + GRU::router_tensor_count;
  static constexpr index_t params = rf.end;
  static constexpr index_t router_params = rf.end - ra.w_ih;

  static constexpr void specs(TensorSpec* out, index_t layer_base) {
    Set::template specs<D>(out, layer_base);
    out += Set::template tensor_count<D>;
    for (const auto& t : GRU::tensors(layer_base, d, W, EA, EF)) *out++ = t;
  }

  // ---- cost model -------------------------------------------------------------------------
  // One router step per token: GRU (x·w_ihᵀ, s·w_hhᵀ) and the head W_X s.
  static constexpr index_t router_flops_per_token(index_t E) { return 2 * d * 3 * W + 2 * W * 3 * W + 2 * W * E; }
  // Worst case per token at sequence length seq (an upper bound, reached when no token picks
  // SKIP and every module is used): per round both routers, K attention queries (Q and output
  // projections, causal attention averaging 2d(seq+1)), the K/V projections (phi::MoM: every
  // attention module over every token; phi::MoMRoutedKV: per routed token), K FFN passes.
  static constexpr index_t flops_per_token(index_t seq) {
    const index_t kv = (routed_kv ? real_a : NA) * Attn::kv_flops;
    const index_t attn = real_a * (Attn::query_flops + Attn::pair_flops * (seq + 1) / 2);
    const index_t ffn = real_f * Ffn::flops_per_token(seq);
    return Hn * (router_flops_per_token(EA) + router_flops_per_token(EF) + kv + attn + ffn);
  }

  // Backward, the same worst case: two products per forward product (the GRU cells' and heads' dx and
  // dW; the modules' backward as they count it).
  static constexpr index_t backward_flops_per_token(index_t seq) {
    const index_t kv = (routed_kv ? real_a : NA) * Attn::kv_backward_flops;
    const index_t attn = real_a * (Attn::query_backward_flops + Attn::pair_backward_flops * (seq + 1) / 2);
    const index_t ffn = real_f * Ffn::backward_flops_per_token(seq);
    return Hn * (2 * router_flops_per_token(EA) + 2 * router_flops_per_token(EF) + kv + attn + ffn);
  }

  // Forward (backward: the mirrored products) FLOPs of one chunk for a realised routing: picks(h, router) gives
  // round h's picks of the attention (0) or FFN (1) router, n×K module ids row-major on the host.
  template <bool backward = false, class Picks>
  static index_t routed_flops(index_t batch, index_t seq, Picks&& picks) {
    const index_t n = batch * seq;
    constexpr index_t kv_flops = backward ? Attn::kv_backward_flops : Attn::kv_flops;
    constexpr index_t query_flops = backward ? Attn::query_backward_flops : Attn::query_flops;
    constexpr index_t pair_flops = backward ? Attn::pair_backward_flops : Attn::pair_flops;
    const index_t ffn_flops = backward ? Ffn::backward_flops_per_token(seq) : Ffn::flops_per_token(seq);
    index_t total = 0;
    for (int h = 0; h < Hn; ++h) {
      total += n * (backward ? 2 : 1) * (router_flops_per_token(EA) + router_flops_per_token(EF));
      const auto pa = picks(h, 0);
      for (int m = 0; m < NA; ++m) {
        index_t n_m = 0, keys = 0, last_seq = -1, rank = 0;
        for (index_t t = 0; t < n; ++t)
          for (int j = 0; j < Kp; ++j)
            if (pa[std::size_t(t * Kp + j)] == m) {
              ++n_m;
              if (t / seq != last_seq) last_seq = t / seq, rank = 0;
              keys += routed_kv ? ++rank : t % seq + 1;  // keys visible to this query
            }
        // phi::MoM: module m's K/V over every token, whether or not a query picked it (the host
        // does not know the group sizes; see attention_forward).
        if (!routed_kv) total += n * kv_flops;
        if (n_m == 0) continue;
        total += (routed_kv ? n_m * kv_flops : 0) + n_m * query_flops + pair_flops * keys;
      }
      const auto pf = picks(h, 1);
      for (index_t s = 0; s < n * Kp; ++s)
        if (pf[std::size_t(s)] < NF) total += ffn_flops;
    }
    return total;
  }

  // ---- workspace --------------------------------------------------------------------------
  using RoutedFfn = dispatch::RoutedFfn<Ffn, D>;
  // A router's GRU gates and state, then its selection (probs .. offsets).
  struct RouterSaved : dispatch::Selection {
    index_t gates = 0, state = 0;  // T
  };
  struct Round {
    RouterSaved ra{}, rf{};
    // attention: the modules' grouped workspace (KeySource: every token's K/V or the routed rows'),
    // the gathered inputs (Routed keys) and the outputs y, over the n·K packed rows.
    typename Attn::template GroupedSaved<NA> attn{};
    index_t xg = 0, ya = 0;
    index_t u = 0;
    typename RoutedFfn::Saved ffn{};  // FFN: outputs, activations (packed; gathered inputs for a module that needs them)
    index_t x_next = 0;
  };
  struct Plan {
    std::array<Round, Hn> round{};
    index_t zero_state = 0;  // s_{-1} = 0
    index_t aux = 0;         // the balance loss of this chunk (written by forward)
  };
  static constexpr bool has_aux_loss = true;

  static constexpr RouterSaved plan_router(Arena& a, index_t n, index_t E) {
    RouterSaved r{};
    r.gates = a.take(n * 6 * W);
    r.state = a.take(n * W);
    static_cast<dispatch::Selection&>(r) = dispatch::plan_selection(a, n, Kp, E, Cfg::z_loss > 0);
    return r;
  }
  static constexpr Plan plan(Arena& a, index_t batch, index_t seq) {
    const index_t n = batch * seq, P = n * Kp;
    Plan p{};
    for (int h = 0; h < Hn; ++h) {
      Round& r = p.round[h];
      r.ra = plan_router(a, n, EA);
      if constexpr (routed_kv) r.xg = a.take(P * d);
      r.attn = Attn::template plan_grouped<NA, keys>(a, n, P);
      r.ya = a.take(P * d);
      r.u = a.take(n * d);
      r.rf = plan_router(a, n, EF);
      r.ffn = RoutedFfn::plan(a, P);
      r.x_next = a.take(n * d);
    }
    p.zero_state = a.take(n * W);
    p.aux = a.take(1);
    return p;
  }

  // Backward scratch (all blocks live at once; see backward()).
  struct Scratch {
    index_t dy, dwp, dws, dlogits, gru, dsa0, dsa1, dsf0, dsf1, attn, dxg, total;
  };
  static constexpr Scratch scratch_plan(index_t batch, index_t seq) {
    const index_t n = batch * seq, P = n * Kp;
    Arena a;
    Scratch s{};
    s.dy = a.take(P * d);
    s.dwp = a.take(P);
    s.dws = a.take(P);
    s.dlogits = a.take(n * Emax);
    s.gru = a.take(n * 6 * W);
    s.dsa0 = a.take(n * W);
    s.dsa1 = a.take(n * W);
    s.dsf0 = a.take(n * W);
    s.dsf1 = a.take(n * W);
    s.attn = a.take(Attn::template scratch_grouped<NA, keys>(n, P));
    // FFN: dL/d(gathered rows) then the module's scratch; attention (Routed keys): dL/d(gathered rows)
    s.dxg = a.take(std::max(RoutedFfn::scratch(P), P * d));
    s.total = a.used;
    return s;
  }
  static constexpr index_t scratch(index_t batch, index_t seq) { return scratch_plan(batch, seq).total; }

  static constexpr index_t ffn_offset(int m) { return Set::template ffn_offset<D>(m); }
  static constexpr index_t attention_offset(int m) { return Set::template attention_offset<D>(m); }
  // The attention modules' parameters (or gradients) as one tensor per group.
  template <class T>
  static PerGroup<T> attention_params(T* p) {
    return PerGroup<T>(p, NA, attention_offset);
  }

  // eqs. (7)-(8): state, probabilities, top-K picks, renormalised weights, groups, balance loss.
  template <class Be, class T>
  static void route_forward(Be& be, const T* p, T* ws, const RouterSaved& r, const RouterOffsets& o, index_t E,
                            MatrixView<const T> in, const T* state_prev, index_t n) {
    using detail::mat, detail::vec;
    be.gru_cell_forward(mv(ws + r.state, n, W), mv(ws + r.gates, n, 6 * W), in, cmv(state_prev, n, W),
                        mat(p, o.w_ih, 3 * W, d), mat(p, o.w_hh, 3 * W, W), vec(p, o.b_ih, 3 * W),
                        vec(p, o.b_hh, 3 * W));
    const MatrixView<T> probs = mv(ws + r.probs, n, E);
    be.linear_forward(probs, cmv<T>(ws + r.state, n, W), mat(p, o.w_out, E, W), std::span<const T>{});  // logits
    dispatch::select_forward(be, ws, r, n, Kp, E, T(1.0 / Cfg::temperature), Cfg::renormalise, T(Cfg::balance_coef),
                             T(Cfg::z_loss));
  }

  template <class Be, class T>
  static void route_backward(Be& be, const T* p, T* g, const T* ws, const RouterSaved& r, const RouterOffsets& o,
                             index_t E, MatrixView<const T> in, const T* state_prev, MatrixView<T> din, T* ds_cur,
                             T* ds_prev, const Scratch& s, T* sc, index_t n) {
    using detail::mat, detail::vec;
    // Packed dweights back to (token, pick) slots, then through top-K / softmax / head.
    const MatrixView<T> dlogits = mv(sc + s.dlogits, n, E);
    dispatch::select_backward(be, ws, r, n, Kp, E, T(1.0 / Cfg::temperature), Cfg::renormalise,
                              sp<const T>(sc + s.dwp, n * Kp), sp(sc + s.dws, n * Kp), dlogits, T(Cfg::z_loss));
    be.linear_backward(mv(ds_cur, n, W), mat(g, o.w_out, E, W), std::span<T>{}, MatrixView<const T>(dlogits),
                       cmv(ws + r.state, n, W), mat(p, o.w_out, E, W));
    if (ds_prev) be.zero(sp(ds_prev, n * W));
    be.gru_cell_backward(din, ds_prev ? mv(ds_prev, n, W) : MatrixView<T>{}, mat(g, o.w_ih, 3 * W, d),
                         mat(g, o.w_hh, 3 * W, W), vec(g, o.b_ih, 3 * W), vec(g, o.b_hh, 3 * W),
                         mv(sc + s.gru, n, 6 * W), cmv<T>(ds_cur, n, W), cmv(ws + r.gates, n, 6 * W), in,
                         cmv(state_prev, n, W), mat(p, o.w_ih, 3 * W, d), mat(p, o.w_hh, 3 * W, W));
  }

  // ---- forward ----------------------------------------------------------------------------
  template <class Be, class T>
  static MatrixView<const T> forward(Be& be, const T* p, T* ws, const Plan& plan, MatrixView<const T> x, T* /*scratch*/,
                                     index_t batch, index_t seq, std::span<const token_t> /*tokens*/) {
    using detail::mat, detail::vec;
    const index_t n = batch * seq;
    be.zero(sp(ws + plan.zero_state, n * W));
    const std::span<T> aux = sp(ws + plan.aux, 1);  // summed on the device: the host never waits
    be.zero(aux);
    for (int h = 0; h < Hn; ++h) {
      const Round& r = plan.round[h];
      const T* sa_prev = h == 0 ? ws + plan.zero_state : ws + plan.round[h - 1].ra.state;
      const T* sf_prev = h == 0 ? ws + plan.zero_state : ws + plan.round[h - 1].rf.state;

      // Attention round: u_h = x_h + Σ r^A_m m^A_m(x_h), eqs. (4), (5), (7), (8).
      route_forward(be, p, ws, r.ra, ra, EA, x, sa_prev, n);
      const MatrixView<T> u = mv(ws + r.u, n, d);
      be.copy(u.flat(), sp(x.data, n * d));
      attention_forward(be, p, ws, r, x, u, n, seq);

      // FFN round: x_{h+1} = u_h + Σ r^F_m m^F_m(u_h), eqs. (4), (6), (7), (8).
      route_forward(be, p, ws, r.rf, rf, EF, MatrixView<const T>(u), sf_prev, n);
      const MatrixView<T> x_next = mv(ws + r.x_next, n, d);
      be.copy(x_next.flat(), sp<const T>(u.data, n * d));
      RoutedFfn::forward(be, p, ws, r.ffn, r.rf, NF, ffn_offset, MatrixView<const T>(u), x_next, Kp);
      be.axpy(aux, T(1), sp<const T>(ws + r.ra.loss, 1));
      be.axpy(aux, T(1), sp<const T>(ws + r.rf.loss, 1));
      x = x_next;
    }
    return x;
  }

  // The attention modules over their groups of the n·K packed rows (group order; the module's
  // forward_grouped, modules/module.hpp); adds w · y into u (eq. (5)). The group sizes stay in backend
  // memory: every op is a grouped op, except phi::MoM's K/V projections over every token.
  template <class Be, class T>
  static void attention_forward(Be& be, const T* p, T* ws, const Round& r, MatrixView<const T> x, MatrixView<T> u,
                                index_t n, index_t seq) {
    const index_t P = n * Kp;
    const auto rr = dispatch::routed_rows(static_cast<const T*>(ws), r.ra, NA, n, Kp);
    const MatrixView<T> xg = mv(ws + r.xg, routed_kv ? P : 0, d), y = mv(ws + r.ya, P, d);
    if constexpr (routed_kv) dispatch::gather(be, rr, x, xg);
    checked<Attn>::template forward_routed<keys>(be, attention_params(p), ws, r.attn, x, MatrixView<const T>(xg), y,
                                                 rr.token, rr.groups, seq);
    dispatch::combine(be, rr, MatrixView<const T>(y), u);  // eq. (5)
  }

  // ---- backward ---------------------------------------------------------------------------
  // dres holds dL/dx_H on entry and dL/dx_0 on exit. In each half-round the residual gradient is
  // first read by every module's weighted scatter (dL/dy, dL/dweight), and only then do the
  // modules and the router accumulate their input gradients into it.
  template <class Be, class T>
  static void backward(Be& be, const T* p, T* g, const T* ws, const Plan& plan, MatrixView<const T> x0,
                       MatrixView<T> dres, T* sc, index_t batch, index_t seq) {
    using detail::mat, detail::vec;
    const index_t n = batch * seq;
    const Scratch s = scratch_plan(batch, seq);
    T* dsa[2] = {sc + s.dsa0, sc + s.dsa1};
    T* dsf[2] = {sc + s.dsf0, sc + s.dsf1};
    be.zero(sp(dsa[(Hn - 1) % 2], n * W));
    be.zero(sp(dsf[(Hn - 1) % 2], n * W));
    for (int h = Hn - 1; h >= 0; --h) {
      const Round& r = plan.round[h];
      const MatrixView<const T> x = h == 0 ? x0 : cmv(ws + plan.round[h - 1].x_next, n, d);
      const MatrixView<const T> u = cmv(ws + r.u, n, d);
      const T* sa_prev = h == 0 ? ws + plan.zero_state : ws + plan.round[h - 1].ra.state;
      const T* sf_prev = h == 0 ? ws + plan.zero_state : ws + plan.round[h - 1].rf.state;

      // FFN half-round.
      weighted_scatter_backward(be, ws, r.rf, r.ffn.y, NF, dres, s, sc, n);
      route_backward(be, p, g, ws, r.rf, rf, EF, u, sf_prev, dres, dsf[h % 2], h > 0 ? dsf[(h + 1) % 2] : nullptr, s, sc,
                     n);
      RoutedFfn::backward(be, p, g, ws, r.ffn, r.rf, NF, ffn_offset, u, sc + s.dy, dres, sc + s.dxg, Kp);

      // Attention half-round.
      weighted_scatter_backward(be, ws, r.ra, r.ya, NA, dres, s, sc, n);
      route_backward(be, p, g, ws, r.ra, ra, EA, x, sa_prev, dres, dsa[h % 2], h > 0 ? dsa[(h + 1) % 2] : nullptr, s, sc,
                     n);
      attention_backward(be, p, g, ws, r, x, dres, n, seq, s, sc);
    }
  }

  // Backward of one half-round's weighted scatter-adds (eq. (5) or (6)), read from dres before
  // anything accumulates into it: dL/dy into scratch dy and dL/d(routing weight) into scratch dwp.
  template <class Be, class T>
  static void weighted_scatter_backward(Be& be, const T* ws, const RouterSaved& r, index_t y_off, int modules,
                                        MatrixView<T> dres, const Scratch& s, T* sc, index_t n) {
    const index_t P = n * Kp;
    dispatch::combine_backward(be, dispatch::routed_rows(ws, r, modules, n, Kp), cmv(ws + y_off, P, d),
                               MatrixView<const T>(dres), mv(sc + s.dy, P, d), sp(sc + s.dwp, P));
  }

  // Backward of attention_forward, after weighted_scatter_backward put dL/dy in scratch dy: the
  // modules' parameter gradients, their input gradients accumulated into dres.
  template <class Be, class T>
  static void attention_backward(Be& be, const T* p, T* g, const T* ws, const Round& r, MatrixView<const T> x,
                                 MatrixView<T> dres, index_t n, index_t seq, const Scratch& s, T* sc) {
    const index_t P = n * Kp;
    const auto rr = dispatch::routed_rows(ws, r.ra, NA, n, Kp);
    const MatrixView<T> dxg = mv(sc + s.dxg, routed_kv ? P : 0, d);
    if constexpr (routed_kv) be.zero_rows(dxg, rr.groups);
    checked<Attn>::template backward_routed<keys>(be, attention_params(p), attention_params(g), ws, r.attn, x,
                                          cmv(ws + r.xg, routed_kv ? P : 0, d), dres, dxg, cmv<T>(sc + s.dy, P, d),
                                          rr.token, rr.groups, seq, sc + s.attn);
    if constexpr (routed_kv) dispatch::gather_backward(be, rr, MatrixView<const T>(dxg), dres);
  }

  // ---- incremental decoding (infer/decoder.hpp; AssemblyDecoderOn) --------------------------------
  // A router's GRU state runs over one token's own rounds (s_{-1} = 0 for every token), so routing is per
  // token and causal: a new token's round h is its row of forward's round h, computed from its x_h alone.
  // Keys and values: one cache per (round, attention module) (docs/inference.md, "MoM"):
  //   phi::MoM          every new token writes module m's key and value of LN_m(x_h) in round h, whatever
  //                     it picked (SKIP included), at its position: forward's AllTokens keys.
  //   phi::MoMRoutedKV  only the tokens routed to m in round h write there, one cache row after another;
  //                     a token that picked SKIP or other modules leaves nothing in m's cache (forward masks
  //                     it out of m's attention). A token's row is the number of its sequence's earlier
  //                     tokens routed to m in round h: counts per (round, module, slot) in the decoder's
  //                     workspace, restarted when a slot starts again at position 0.
  // The queries run per module over its packed rows (the picks and group offsets are read back to the
  // host: a module's rows need their sequences and positions there); then one weighted scatter-add.
  template <class Be>
  static constexpr bool decodes_on = RoutedDecodingSequenceMixerOn<Attn, Be>;
  // Its decode reads the step's rows to the host (DecodeRows): infer::Decoder runs it op by op, not as a CUDA graph.
  static constexpr bool decode_reads_host = true;
  struct DecodeRound {
    RouterSaved ra{}, rf{};
    std::array<index_t, NA> k{}, v{};  // caches [slots·max_len × d], one pair per attention module
    index_t xg = 0, ya = 0, u = 0, x_next = 0;
    typename RoutedFfn::Saved ffn{};
  };
  struct DecodePlan {
    std::array<DecodeRound, Hn> round{};
    typename Attn::DecodeSaved attn{};
    index_t zero_state = 0;
    index_t counts = 0;  // token_t [Hn × NA × slots]: phi::MoMRoutedKV's cache fill per (round, module, slot)
    index_t staged = 0;  // a module's rows' slots, positions and cache rows (detail::DecodeRows::stage)
  };
  static constexpr DecodePlan plan_decode(Arena& a, index_t slots, index_t max_len, index_t rows) {
    const index_t P = rows * Kp;
    DecodePlan p{};
    for (int h = 0; h < Hn; ++h) {
      DecodeRound& r = p.round[h];
      for (int m = 0; m < NA; ++m) {
        r.k[m] = a.take(slots * max_len * d);
        r.v[m] = a.take(slots * max_len * d);
      }
      r.ra = plan_router(a, rows, EA);
      r.xg = a.take(P * d);
      r.ya = a.take(P * d);
      r.u = a.take(rows * d);
      r.rf = plan_router(a, rows, EF);
      r.ffn = RoutedFfn::plan(a, P);
      r.x_next = a.take(rows * d);
    }
    p.attn = Attn::plan_decode(a, rows);  // a module's group has at most `rows` rows (K distinct picks)
    p.zero_state = a.take(rows * W);
    if constexpr (routed_kv) p.counts = a.take(tok_elems(Hn * NA * slots));
    p.staged = detail::DecodeRows::take(a, rows);
    return p;
  }

  template <class Be, class T>
  static MatrixView<const T> decode(Be& be, const T* p, T* ws, const DecodePlan& plan, MatrixView<const T> x,
                                    std::span<const index_t> slot, std::span<const index_t> pos, index_t slots,
                                    index_t max_len, std::span<const token_t> /*tokens*/) {
    const index_t rows = x.rows;
    detail::DecodeRows& host = detail::DecodeRows::begin(be, slot, pos, rows * Kp);
    if constexpr (routed_kv) host.load_counts(be, ws, plan.counts, Hn * NA, slots);
    be.zero(sp(ws + plan.zero_state, rows * W));
    for (int h = 0; h < Hn; ++h) {
      const DecodeRound& r = plan.round[h];
      const T* sa_prev = h == 0 ? ws + plan.zero_state : ws + plan.round[h - 1].ra.state;
      const T* sf_prev = h == 0 ? ws + plan.zero_state : ws + plan.round[h - 1].rf.state;
      route_forward(be, p, ws, r.ra, ra, EA, x, sa_prev, rows);  // eqs. (7)-(8)
      const MatrixView<T> u = mv(ws + r.u, rows, d);
      be.copy(u.flat(), sp(x.data, rows * d));
      decode_attention(be, p, ws, plan, h, x, u, slot, pos, slots, max_len, host);  // eqs. (4), (5)
      route_forward(be, p, ws, r.rf, rf, EF, MatrixView<const T>(u), sf_prev, rows);
      const MatrixView<T> x_next = mv(ws + r.x_next, rows, d);
      be.copy(x_next.flat(), sp<const T>(u.data, rows * d));
      RoutedFfn::forward(be, p, ws, r.ffn, r.rf, NF, ffn_offset, MatrixView<const T>(u), x_next, Kp);  // eq. (6)
      x = x_next;
    }
    if constexpr (routed_kv) host.store_counts(be, ws, plan.counts);
    return x;
  }

 private:
  // Round h's attention half: keys (phi::MoM: every row, every module), then each module's queries over its
  // packed rows, u += Σ r^A_m · m^A_m(x_h) (eq. (5)).
  template <class Be, class T>
  static void decode_attention(Be& be, const T* p, T* ws, const DecodePlan& plan, int h, MatrixView<const T> x,
                               MatrixView<T> u, std::span<const index_t> slot, std::span<const index_t> pos,
                               index_t slots, index_t max_len, detail::DecodeRows& host) {
    const DecodeRound& r = plan.round[h];
    const index_t rows = x.rows, P = rows * Kp;
    const auto cache = [&](int m, bool v) { return mv(ws + (v ? r.v[m] : r.k[m]), slots * max_len, d); };
    if constexpr (!routed_kv)
      for (int m = 0; m < NA; ++m)
        Attn::decode_keys(be, p + attention_offset(m), ws, plan.attn, x, cache(m, false), cache(m, true), slot, pos, pos,
                          max_len);
    const auto rr = dispatch::routed_rows(static_cast<const T*>(ws), r.ra, NA, rows, Kp);
    const std::span<const token_t> idx = rr.token;
    std::array<token_t, EA + 1> off{};
    be.to_host(std::span<token_t>(off), std::span<const token_t>(toks(ws, r.ra.offsets), off.size()));
    be.to_host(std::span<token_t>(host.idx.data(), std::size_t(P)), idx);
    const MatrixView<T> xg = mv(ws + r.xg, P, d), y = mv(ws + r.ya, P, d);
    dispatch::gather(be, rr, x, xg);
    for (int m = 0; m < NA; ++m) {
      const index_t o = off[std::size_t(m)], cnt = off[std::size_t(m) + 1] - o;
      if (cnt <= 0) continue;  // no token picked module m: its queries cost nothing
      host.place(o, cnt, routed_kv ? h * NA + m : -1, slots);
      const auto rm = host.stage(be, ws, plan.staged, cnt);
      const MatrixView<const T> xm(xg.row_block(o, cnt));
      if constexpr (routed_kv)
        Attn::decode_keys(be, p + attention_offset(m), ws, plan.attn, xm, cache(m, false), cache(m, true), rm.slot,
                          rm.pos, rm.at, max_len);
      Attn::decode_queries(be, p + attention_offset(m), ws, plan.attn, xm, y.row_block(o, cnt),
                           MatrixView<const T>(cache(m, false)), MatrixView<const T>(cache(m, true)), rm.slot, rm.pos,
                           rm.at, max_len);
    }
    dispatch::combine(be, rr, MatrixView<const T>(y), u);  // eq. (5)
  }

 public:
  // ---- routing read-back (statistics, realised FLOPs; ReportsRouting) ---------------------
  // Two router families: 0 attention, 1 FFN.
  static constexpr int routing_routers = 2;
  static constexpr RoutingInfo routing_info(int router) {
    return router == 0 ? RoutingInfo{"attn", EA, Hn, Kp, Set::has_skip} : RoutingInfo{"ffn", EF, Hn, Kp, Set::has_skip};
  }
  // Round h's picks of the attention (router 0) or FFN (router 1) router: n×K module ids, SKIP = N.
  template <class Be, class T>
  static void read_picks(Be& be, const T* ws, const Plan& plan, int h, int router, index_t n, std::span<token_t> out) {
    const RouterSaved& r = router == 1 ? plan.round[h].rf : plan.round[h].ra;
    be.to_host(out, std::span<const token_t>(toks(ws, r.picks), std::size_t(n * Kp)));
  }
};

}  // namespace mom

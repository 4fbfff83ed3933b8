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
// Dispatch (DESIGN.md "Data and the hot path"; assembly/grouped_dispatch.hpp, shared with the
// MoE executor): the router's n×K (token, module) picks are grouped by module with a stable
// counting sort (group_by_choice: causal order kept inside a group); per module one gather, its
// GEMMs over exactly its tokens, one weighted scatter-add. Modules no token picked cost nothing;
// SKIP's group is never touched.
#include <algorithm>
#include <array>
#include <type_traits>

#include "mom/assembly/assembly.hpp"
#include "mom/assembly/grouped_dispatch.hpp"
#include "mom/assembly/phi.hpp"
#include "mom/modules/ffn.hpp"
#include "mom/modules/mha.hpp"
#include "mom/routers/gru.hpp"

namespace mom {

namespace phi {
// φ_MoM with each attention module's keys/values restricted to the tokens routed to it.
struct MoMRoutedKV : MoM {};
}  // namespace phi

template <class A, Dims D>
struct Executor<GRU, A, D> {
  using Set = typename A::module_set;
  using Cfg = GRUConfig<typename A::router::options>;
  // Reading ok instantiates the option checks (their static_asserts carry the messages).
  static constexpr bool options_ok = GRU::VerifyOptions<typename A::router::options>::ok;
  static_assert(std::is_same_v<typename A::phi_type, phi::MoM> || std::is_same_v<typename A::phi_type, phi::MoMRoutedKV>,
                "mom::Router<GRU> assembles with phi::MoM or phi::MoMRoutedKV");
  using Attn = modules::Attention<D>;
  using Ffn = modules::FeedForward<D>;

  static constexpr int NA = Set::n_attention, NF = Set::n_ffn, Hn = A::h, Kp = A::k;
  static constexpr int EA = Set::selectable_attention, EF = Set::selectable_ffn;  // SKIP is class N (last)
  static constexpr int Emax = EA > EF ? EA : EF;
  static constexpr index_t d = D.d_model, f = D.ff(), heads = D.heads, W = Cfg::width;
  static constexpr bool routed_kv = std::is_same_v<typename A::phi_type, phi::MoMRoutedKV>;
  // Picks that can land on a computing module (K = N + 1 with SKIP always includes SKIP).
  static constexpr int real_a = Kp < NA ? Kp : NA, real_f = Kp < NF ? Kp : NF;

  // ---- parameters: the module set (names h.<base+i>.*), then the two routers -------------
  struct RouterOffsets {
    index_t w_ih, w_hh, b_ih, b_hh, w_out, end;
  };
  static constexpr RouterOffsets router_offsets(index_t at, index_t E) {
    RouterOffsets r{};
    r.w_ih = at;
    r.w_hh = r.w_ih + 3 * W * d;
    r.b_ih = r.w_hh + 3 * W * W;
    r.b_hh = r.b_ih + 3 * W;
    r.w_out = r.b_hh + 3 * W;
    r.end = r.w_out + E * W;
    return r;
  }
  static constexpr RouterOffsets ra = router_offsets(Set::template params<D>, EA);
  static constexpr RouterOffsets rf = router_offsets(ra.end, EF);
  // (reading options_ok here makes every use of the model type run the option checks)
  static constexpr std::size_t tensor_count = Set::tensor_count + (options_ok ? 10 : 10);
  static constexpr index_t params = rf.end;
  static constexpr index_t router_params = rf.end - ra.w_ih;

  // Router tensors are named under the chunk's first layer: h.<base>.router_attn.w_ih, ...
  static constexpr void specs(TensorSpec* out, index_t layer_base) {
    Set::template specs<D>(out, layer_base);
    out += Set::tensor_count;
    *out++ = {"router_attn.w_ih", layer_base, 3 * W, d, Init::Normal};
    *out++ = {"router_attn.w_hh", layer_base, 3 * W, W, Init::Normal};
    *out++ = {"router_attn.b_ih", layer_base, 1, 3 * W, Init::Zero};
    *out++ = {"router_attn.b_hh", layer_base, 1, 3 * W, Init::Zero};
    *out++ = {"router_attn.w_out", layer_base, EA, W, Init::Normal};
    *out++ = {"router_ffn.w_ih", layer_base, 3 * W, d, Init::Normal};
    *out++ = {"router_ffn.w_hh", layer_base, 3 * W, W, Init::Normal};
    *out++ = {"router_ffn.b_ih", layer_base, 1, 3 * W, Init::Zero};
    *out++ = {"router_ffn.b_hh", layer_base, 1, 3 * W, Init::Zero};
    *out++ = {"router_ffn.w_out", layer_base, EF, W, Init::Normal};
  }

  // ---- cost model -------------------------------------------------------------------------
  // One router step per token: GRU (x·w_ihᵀ, s·w_hhᵀ) and the head W_X s.
  static constexpr index_t router_flops_per_token(index_t E) { return 2 * d * 3 * W + 2 * W * 3 * W + 2 * W * E; }
  // Worst case per token at sequence length seq (an upper bound, reached when no token picks
  // SKIP and every module is used): per round both routers, K attention queries (Q and output
  // projections, causal attention averaging 2d(seq+1)), the K/V projections (phi::MoM: every
  // attention module over every token; phi::MoMRoutedKV: per routed token), K FFN passes.
  static constexpr index_t flops_per_token(index_t seq) {
    const index_t kv = routed_kv ? real_a * 4 * d * d : NA * 4 * d * d;
    const index_t attn = real_a * (2 * d * d + 2 * d * d + 2 * d * (seq + 1));
    const index_t ffn = real_f * 4 * d * f;
    return Hn * (router_flops_per_token(EA) + router_flops_per_token(EF) + kv + attn + ffn);
  }

  // Forward FLOPs of one chunk for a realised routing: picks(h, router) gives round h's picks
  // of the attention (0) or FFN (1) router, n×K module ids row-major on the host.
  template <class Picks>
  static index_t routed_flops(index_t batch, index_t seq, Picks&& picks) {
    const index_t n = batch * seq;
    index_t total = 0;
    for (int h = 0; h < Hn; ++h) {
      total += n * (router_flops_per_token(EA) + router_flops_per_token(EF));
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
        if (n_m == 0) continue;
        total += (routed_kv ? n_m : n) * 2 * d * 2 * d + n_m * 4 * d * d + 4 * d * keys;
      }
      const auto pf = picks(h, 1);
      for (index_t s = 0; s < n * Kp; ++s)
        if (pf[std::size_t(s)] < NF) total += 4 * d * f;
    }
    return total;
  }

  // ---- workspace --------------------------------------------------------------------------
  using RoutedFfn = dispatch::RoutedFfn<D>;
  // A router's GRU gates and state, then its selection (probs .. offsets).
  struct RouterSaved : dispatch::Selection {
    index_t gates = 0, state = 0;  // T
  };
  struct Round {
    RouterSaved ra{}, rf{};
    // attention: phi::MoM keeps LN_m(x), mean, rstd, [K|V] per module over all n tokens;
    // phi::MoMRoutedKV keeps them packed (module m's routed rows). Packed rows: n·K.
    std::array<index_t, NA> ln{}, mean{}, rstd{}, kv{};
    index_t xg = 0, xq = 0, q = 0, att = 0, lse = 0, ya = 0;
    index_t u = 0;
    typename RoutedFfn::Saved ffn{};  // FFN: gathered inputs, outputs, activations (packed)
    index_t x_next = 0;
  };
  struct Plan {
    std::array<Round, Hn> round{};
    index_t zero_state = 0;  // s_{-1} = 0
    index_t aux = 0;         // the balance loss of this chunk (written by forward)
  };
  static constexpr bool has_aux_loss = true;
  // read_picks / routed_flops: module picks per round (routing statistics, realised FLOPs).
  static constexpr bool has_module_picks = true;

  static constexpr RouterSaved plan_router(Arena& a, index_t n, index_t E) {
    RouterSaved r{};
    r.gates = a.take(n * 6 * W);
    r.state = a.take(n * W);
    static_cast<dispatch::Selection&>(r) = dispatch::plan_selection(a, n, Kp, E);
    return r;
  }
  static constexpr Plan plan(Arena& a, index_t batch, index_t seq) {
    const index_t n = batch * seq, P = n * Kp;
    Plan p{};
    for (int h = 0; h < Hn; ++h) {
      Round& r = p.round[h];
      r.ra = plan_router(a, n, EA);
      if constexpr (routed_kv) {
        r.xg = a.take(P * d);
        const index_t ln = a.take(P * d), mean = a.take(P), rstd = a.take(P), kv = a.take(P * 2 * d);
        for (int m = 0; m < NA; ++m) r.ln[m] = ln, r.mean[m] = mean, r.rstd[m] = rstd, r.kv[m] = kv;
        r.xq = ln;
      } else {
        for (int m = 0; m < NA; ++m) {
          r.ln[m] = a.take(n * d);
          r.mean[m] = a.take(n);
          r.rstd[m] = a.take(n);
          r.kv[m] = a.take(n * 2 * d);
        }
        r.xq = a.take(P * d);
      }
      r.q = a.take(P * d);
      r.att = a.take(P * d);
      r.lse = a.take(P * heads);
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
    index_t dy, dwp, dws, dlogits, gru, dsa0, dsa1, dsf0, dsf1, datt, dq, dkv, dln, dxg, total;
  };
  static constexpr Scratch scratch_plan(index_t batch, index_t seq) {
    const index_t n = batch * seq, P = n * Kp, rows = routed_kv ? P : n;
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
    s.datt = a.take(P * d);
    s.dq = a.take(P * d);
    s.dkv = a.take(rows * 2 * d);
    s.dln = a.take(rows * d);
    s.dxg = a.take(RoutedFfn::scratch(P));  // FFN: dL/d(gathered rows) then the module's scratch
    s.total = a.used;
    return s;
  }
  static constexpr index_t scratch(index_t batch, index_t seq) { return scratch_plan(batch, seq).total; }

  // ---- views ------------------------------------------------------------------------------
  template <class U>
  static auto toks(U* ws, index_t off) {
    return dispatch::toks(ws, off);
  }
  template <class U>
  static std::span<U> sp(U* p, index_t n) {
    return {p, static_cast<std::size_t>(n)};
  }
  template <class U>
  static MatrixView<U> mv(U* p, index_t r, index_t c) {
    return {p, r, c};
  }
  template <class T>
  static MatrixView<const T> cmv(const T* p, index_t r, index_t c) {
    return {p, r, c};
  }

  // Group offsets of a router's last forward, on the host (E + 1 <= 17 entries).
  template <class Be, class T>
  static std::array<token_t, Emax + 1> host_offsets(Be& be, const T* ws, const RouterSaved& r, index_t E) {
    return dispatch::host_offsets<Emax>(be, ws, r, E);
  }
  static constexpr index_t ffn_offset(int m) { return Set::template ffn_offset<D>(m); }

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
    dispatch::select_forward(be, ws, r, n, Kp, E, T(1.0 / Cfg::temperature), Cfg::renormalise, T(Cfg::balance_coef));
  }

  template <class Be, class T>
  static void route_backward(Be& be, const T* p, T* g, const T* ws, const RouterSaved& r, const RouterOffsets& o,
                             index_t E, MatrixView<const T> in, const T* state_prev, MatrixView<T> din, T* ds_cur,
                             T* ds_prev, const Scratch& s, T* sc, index_t n) {
    using detail::mat, detail::vec;
    // Packed dweights back to (token, pick) slots, then through top-K / softmax / head.
    const MatrixView<T> dlogits = mv(sc + s.dlogits, n, E);
    dispatch::select_backward(be, ws, r, n, Kp, E, T(1.0 / Cfg::temperature), Cfg::renormalise,
                              sp<const T>(sc + s.dwp, n * Kp), sp(sc + s.dws, n * Kp), dlogits);
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
                                     index_t batch, index_t seq) {
    using detail::mat, detail::vec;
    const index_t n = batch * seq;
    be.zero(sp(ws + plan.zero_state, n * W));
    T aux = T(0);
    for (int h = 0; h < Hn; ++h) {
      const Round& r = plan.round[h];
      const T* sa_prev = h == 0 ? ws + plan.zero_state : ws + plan.round[h - 1].ra.state;
      const T* sf_prev = h == 0 ? ws + plan.zero_state : ws + plan.round[h - 1].rf.state;

      // Attention round: u_h = x_h + Σ r^A_m m^A_m(x_h), eqs. (4), (5), (7), (8).
      route_forward(be, p, ws, r.ra, ra, EA, x, sa_prev, n);
      const auto oa = host_offsets(be, ws, r.ra, EA);
      const MatrixView<T> u = mv(ws + r.u, n, d);
      be.copy(u.flat(), sp(x.data, n * d));
      for (int m = 0; m < NA; ++m) {
        const index_t o = oa[m], nm = oa[m + 1] - oa[m];
        if (nm == 0) continue;  // an unchosen module costs nothing
        attention_forward(be, p + Set::template attention_offset<D>(m), ws, r, m, x, u,
                          sp<const token_t>(toks(ws, r.ra.row_token) + o, nm), o, nm, n, seq);
      }

      // FFN round: x_{h+1} = u_h + Σ r^F_m m^F_m(u_h), eqs. (4), (6), (7), (8).
      route_forward(be, p, ws, r.rf, rf, EF, MatrixView<const T>(u), sf_prev, n);
      const auto of = host_offsets(be, ws, r.rf, EF);
      const MatrixView<T> x_next = mv(ws + r.x_next, n, d);
      be.copy(x_next.flat(), sp<const T>(u.data, n * d));
      RoutedFfn::forward(be, p, ws, r.ffn, r.rf, of, NF, ffn_offset, MatrixView<const T>(u), x_next);
      aux += be.read(ws + r.ra.loss) + be.read(ws + r.rf.loss);
      x = x_next;
    }
    be.from_host(sp(ws + plan.aux, 1), std::span<const T>(&aux, 1));
    return x;
  }

  // Attention module m over its nm routed tokens (packed rows o .. o+nm-1); adds w · y into u.
  template <class Be, class T>
  static void attention_forward(Be& be, const T* pm, T* ws, const Round& r, int m, MatrixView<const T> x,
                                MatrixView<T> u, std::span<const token_t> idx, index_t o, index_t nm, index_t n,
                                index_t seq) {
    using detail::mat, detail::vec;
    const auto Wq = mat(pm, Attn::o_w_qkv, d, d), Wkv = mat(pm, Attn::o_w_qkv + d * d, 2 * d, d);
    const auto bq = vec(pm, Attn::o_b_qkv, d), bkv = vec(pm, Attn::o_b_qkv + d, 2 * d);
    const auto gamma = vec(pm, Attn::o_ln_w, d), beta = vec(pm, Attn::o_ln_b, d);
    const MatrixView<T> xq = mv(ws + r.xq + o * d, nm, d), q = mv(ws + r.q + o * d, nm, d);
    MatrixView<const T> keys, values;
    std::span<const token_t> key_tok;  // empty: every token
    if constexpr (routed_kv) {
      const MatrixView<T> xg = mv(ws + r.xg + o * d, nm, d), kv = mv(ws + r.kv[m] + o * 2 * d, nm, 2 * d);
      be.gather_rows(xg, x, idx);
      be.layernorm_forward(xq, sp(ws + r.mean[m] + o, nm), sp(ws + r.rstd[m] + o, nm), MatrixView<const T>(xg), gamma,
                           beta);
      be.linear_forward(kv, MatrixView<const T>(xq), Wkv, bkv);
      keys = MatrixView<const T>(kv).col_block(0, d);
      values = MatrixView<const T>(kv).col_block(d, d);
      key_tok = idx;
    } else {
      const MatrixView<T> ln = mv(ws + r.ln[m], n, d), kv = mv(ws + r.kv[m], n, 2 * d);
      be.layernorm_forward(ln, sp(ws + r.mean[m], n), sp(ws + r.rstd[m], n), x, gamma, beta);
      be.linear_forward(kv, MatrixView<const T>(ln), Wkv, bkv);
      be.gather_rows(xq, MatrixView<const T>(ln), idx);
      keys = MatrixView<const T>(kv).col_block(0, d);
      values = MatrixView<const T>(kv).col_block(d, d);
    }
    be.linear_forward(q, MatrixView<const T>(xq), Wq, bq);
    const MatrixView<T> att = mv(ws + r.att + o * d, nm, d), y = mv(ws + r.ya + o * d, nm, d);
    be.attention_packed_forward(att, sp(ws + r.lse + o * heads, nm * heads), MatrixView<const T>(q), keys, values, idx,
                                key_tok, seq, heads);
    be.linear_forward(y, MatrixView<const T>(att), mat(pm, Attn::o_w_proj, d, d), vec(pm, Attn::o_b_proj, d));
    be.scatter_add_rows(u, MatrixView<const T>(y), idx, sp<const T>(ws + r.ra.wpacked + o, nm));  // eq. (5)
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
      const auto of = weighted_scatter_backward(be, ws, r.rf, r.ffn.y, NF, EF, dres, s, sc, n);
      route_backward(be, p, g, ws, r.rf, rf, EF, u, sf_prev, dres, dsf[h % 2], h > 0 ? dsf[(h + 1) % 2] : nullptr, s, sc,
                     n);
      RoutedFfn::backward(be, p, g, ws, r.ffn, r.rf, of, NF, ffn_offset, sc + s.dy, dres, sc + s.dxg);

      // Attention half-round.
      const auto oa = weighted_scatter_backward(be, ws, r.ra, r.ya, NA, EA, dres, s, sc, n);
      route_backward(be, p, g, ws, r.ra, ra, EA, x, sa_prev, dres, dsa[h % 2], h > 0 ? dsa[(h + 1) % 2] : nullptr, s, sc,
                     n);
      for (int m = 0; m < NA; ++m) {
        const index_t o = oa[m], nm = oa[m + 1] - oa[m];
        if (nm == 0) continue;
        const index_t off = Set::template attention_offset<D>(m);
        attention_backward(be, p + off, g + off, ws, r, m, x, dres, sp<const token_t>(toks(ws, r.ra.row_token) + o, nm),
                           o, nm, n, seq, s, sc);
      }
    }
  }

  // Backward of one half-round's weighted scatter-adds (eq. (5) or (6)), read from dres before
  // anything accumulates into it: per module m with outputs y (group order, at y_off), dL/dy into
  // scratch dy and dL/d(routing weight) into scratch dwp. Returns the group offsets.
  template <class Be, class T>
  static std::array<token_t, Emax + 1> weighted_scatter_backward(Be& be, const T* ws, const RouterSaved& r,
                                                                 index_t y_off, int modules, index_t E,
                                                                 MatrixView<T> dres, const Scratch& s, T* sc,
                                                                 index_t n) {
    const auto offsets = host_offsets(be, ws, r, E);
    dispatch::weighted_scatter_backward(be, ws, r, y_off, offsets, modules, MatrixView<const T>(dres), sc + s.dy,
                                              sc + s.dwp, n, Kp);
    return offsets;
  }

  template <class Be, class T>
  static void attention_backward(Be& be, const T* pm, T* gm, const T* ws, const Round& r, int m, MatrixView<const T> x,
                                 MatrixView<T> dres, std::span<const token_t> idx, index_t o, index_t nm, index_t n,
                                 index_t seq, const Scratch& s, T* sc) {
    using detail::mat, detail::vec;
    const auto Wq = mat(pm, Attn::o_w_qkv, d, d), Wkv = mat(pm, Attn::o_w_qkv + d * d, 2 * d, d);
    const auto dWq = mat(gm, Attn::o_w_qkv, d, d), dWkv = mat(gm, Attn::o_w_qkv + d * d, 2 * d, d);
    const auto dbq = vec(gm, Attn::o_b_qkv, d), dbkv = vec(gm, Attn::o_b_qkv + d, 2 * d);
    const MatrixView<T> datt = mv(sc + s.datt, nm, d), dq = mv(sc + s.dq, nm, d);
    be.zero(datt.flat());
    be.zero(dq.flat());
    const MatrixView<const T> att = cmv(ws + r.att + o * d, nm, d), q = cmv(ws + r.q + o * d, nm, d);
    const MatrixView<const T> xq = cmv(ws + r.xq + o * d, nm, d);
    be.linear_backward(datt, mat(gm, Attn::o_w_proj, d, d), vec(gm, Attn::o_b_proj, d), cmv<T>(sc + s.dy + o * d, nm, d),
                       att, mat(pm, Attn::o_w_proj, d, d));
    const index_t rows = routed_kv ? nm : n;  // key/value rows of this module
    const MatrixView<const T> kv = routed_kv ? cmv(ws + r.kv[m] + o * 2 * d, nm, 2 * d) : cmv(ws + r.kv[m], n, 2 * d);
    const MatrixView<T> dkv = mv(sc + s.dkv, rows, 2 * d), dln = mv(sc + s.dln, rows, d);
    be.zero(dkv.flat());
    be.zero(dln.flat());
    be.attention_packed_backward(dq, dkv.col_block(0, d), dkv.col_block(d, d), MatrixView<const T>(datt), att,
                                 sp(ws + r.lse + o * heads, nm * heads), q, kv.col_block(0, d), kv.col_block(d, d), idx,
                                 routed_kv ? idx : std::span<const token_t>{}, seq, heads);
    const auto gamma = vec(pm, Attn::o_ln_w, d);
    const auto dgamma = vec(gm, Attn::o_ln_w, d), dbeta = vec(gm, Attn::o_ln_b, d);
    if constexpr (routed_kv) {
      // Q and K/V both read the routed tokens' LN rows.
      be.linear_backward(dln, dWq, dbq, MatrixView<const T>(dq), xq, Wq);
      be.linear_backward(dln, dWkv, dbkv, MatrixView<const T>(dkv), xq, Wkv);
      const MatrixView<T> dxg = mv(sc + s.dxg, nm, d);
      be.zero(dxg.flat());
      be.layernorm_backward(dxg, dgamma, dbeta, MatrixView<const T>(dln), cmv(ws + r.xg + o * d, nm, d),
                            sp(ws + r.mean[m] + o, nm), sp(ws + r.rstd[m] + o, nm), gamma);
      be.scatter_add_rows(dres, MatrixView<const T>(dxg), idx);
    } else {
      // Q reads the gathered LN rows, K/V every token's LN row.
      const MatrixView<T> dxq = mv(sc + s.dxg, nm, d);
      be.zero(dxq.flat());
      be.linear_backward(dxq, dWq, dbq, MatrixView<const T>(dq), xq, Wq);
      be.linear_backward(dln, dWkv, dbkv, MatrixView<const T>(dkv), cmv(ws + r.ln[m], n, d), Wkv);
      be.scatter_add_rows(dln, MatrixView<const T>(dxq), idx);
      be.layernorm_backward(dres, dgamma, dbeta, MatrixView<const T>(dln), x, sp(ws + r.mean[m], n),
                            sp(ws + r.rstd[m], n), gamma);
    }
  }

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

#pragma once
// SwitchHead attention (Csordás et al. 2024, arXiv 2312.07987), as MoEUT uses it (arXiv 2405.16039, §2.2):
// H heads of width d_head, each with its own query and key projection and N_A value and N_A output
// experts, chosen per token by independent sigmoid selections (K_A active each):
//   s_V^h = σ(LN(x) W_SV^h),  E_V^h = top-K_A(s_V^h)                       eqs. (5)-(6)
//   s_O^h = σ(LN(x) W_SO^h),  E_O^h = top-K_A(s_O^h)
//   v_t^h = Σ_{e ∈ E_V^h} s_V^h[e] · x̂_t W_V^{h,e}                           eq. (7)
//   a^h   = softmax(q^h K^hᵀ / √d_head) causal, q^h = LN(x) W_Q^h, k^h = LN(x) W_K^h   eq. (8)
//   y_t   = Σ_h Σ_{e ∈ E_O^h} s_O^h[e] · (a^h V^h)_t W_O^{h,e}                  eq. (9)
// x̂ = x under peri-LayerNorm (§2.4: no LayerNorm on the value path), x̂ = LN(x) under pre-LayerNorm;
// under post-LayerNorm nothing inside is normalised (LN(x) above reads x) and the module returns
// LN(x + y) − x (modules/norm_scheme.hpp).
// Rotary positions (Dims::positions) rotate q and k as in the library's attention.
// Auxiliary loss (ModuleWithAuxLoss): the within-sequence entropy regulariser of eq. (4) on every head's
// value and output selection, each weighted by δ, summed over heads and the two selections.
//
// Each head's value and output experts run over exactly their chosen (token, expert) pairs, grouped by
// expert as in σ-MoE (routing/dispatch.hpp); the attention itself is the library's fused causal op over
// a [Q | K | V] matrix of H heads of d_head. The 2·H selections all read LN(x) and their weights W_SV, W_SO
// are one [2·H·N_A × d] block, so their logits are one product in forward and their weight gradient one
// product in backward (instead of 2·H products of N_A columns, each packing all of LN(x)); the input
// gradient stays one product per selection, in the order the selections are taken back.
//
//   MHA<L, SwitchHead<2, 5, 2, 64>::type>     L SwitchHead modules: 2 heads of 64, 5 experts, 2 active
// A sequence mixer over (batch, seq): the dense stack, parameter sharing, MoE's attention, and incremental
// decoding (DecodingSequenceMixerOn). It has no row-group members (a MoM chunk over it is a compile error
// naming the member).
#include <array>
#include <ratio>
#include <span>

#include "mom/routing/dispatch.hpp"
#include "mom/routing/select.hpp"
#include "mom/modules/module.hpp"
#include "mom/modules/norm_scheme.hpp"

namespace mom {

template <int Heads, int NA, int KA = 2, int DH = 64, class Norm = PeriNorm, class Delta = std::ratio<1, 1000>>
struct SwitchHead {
  static_assert(Heads >= 1, "mom::SwitchHead<H, N_A>: H (heads) must be >= 1");
  static_assert(NA >= 1 && NA <= max_row_groups, "mom::SwitchHead<H, N_A>: N_A (experts per head) must be in 1..256");
  static_assert(KA >= 1 && KA <= NA, "mom::SwitchHead<H, N_A, K_A>: K_A (active experts per head) must be in 1..N_A");
  static_assert(DH >= 1, "mom::SwitchHead<H, N_A, K_A, d_head>: d_head must be >= 1");
  static_assert(is_norm_scheme<Norm>, "mom::SwitchHead: the norm scheme must be PeriNorm, PreNorm or PostNorm");
  static_assert(Delta::num >= 0, "mom::SwitchHead: the entropy coefficient delta must be >= 0");
  static constexpr int heads = Heads, experts = NA, top_k = KA, d_head = DH;

  template <Dims D>
  struct type {
    static constexpr const char* name = "SwitchHead";
    static constexpr bool has_aux_loss = true;
    static constexpr bool peri = std::is_same_v<Norm, PeriNorm>, post = std::is_same_v<Norm, PostNorm>;
    static constexpr index_t d = D.d_model, dh = DH, H = Heads, hd = H * DH;  // hd: Q, K and V widths
    static constexpr double delta = double(Delta::num) / double(Delta::den);
    static_assert(!D.rope() || DH % 2 == 0, "mom::SwitchHead<H, N_A, K_A, d_head>: rotary positions need an even d_head");

    static constexpr index_t o_ln_w = 0, o_ln_b = d, o_qk = 2 * d, o_sv = o_qk + 2 * hd * d, o_so = o_sv + H * NA * d,
                             o_v = o_so + H * NA * d, o_o = o_v + H * NA * dh * d;
    static constexpr index_t params = o_o + H * NA * d * dh;
    static constexpr std::array<TensorSpec, 7> tensors(index_t layer) {
      return {{{"ln_1.w", layer, 1, d, Init::One},
               {"ln_1.b", layer, 1, d, Init::Zero},
               {"attn.w_qk", layer, 2 * hd, d, Init::Normal},    // W_Q^h rows h·d_head .., then W_K^h
               {"attn.w_sel_v", layer, H * NA, d, Init::Normal},  // W_SV^h rows h·N_A ..
               {"attn.w_sel_o", layer, H * NA, d, Init::Normal},
               {"attn.w_v", layer, H * NA * dh, d, Init::Normal},             // W_V^{h,e} [d_head × d]
               {"attn.w_o", layer, H * NA * d, dh, Init::ResidualNormal}}};  // W_O^{h,e} [d × d_head]
    }
    // Forward FLOPs per token: Q and K (2·d·2·H·d_head), the 2·H selections (2·d·N_A each), K_A value and
    // K_A output experts per head (2·d·d_head each), causal attention as modules::Attention counts it
    // (2·H·d_head·(seq+1)). MACs are half (the paper's measure); LayerNorm and softmaxes are not counted.
    static constexpr index_t linear_flops = 2 * d * 2 * hd + 2 * 2 * H * NA * d + 2 * KA * H * 2 * d * dh;
    static constexpr index_t flops_per_token(index_t seq) { return linear_flops + 2 * hd * (seq + 1); }
    static constexpr index_t backward_flops_per_token(index_t seq) { return 2 * linear_flops + 5 * hd * (seq + 1); }

    // One head's selection (value or output side) and its packed rows.
    struct Side {
      dispatch::Selection sel;  // sigmoid weights, picks, groups, γ·L in sel.loss (the logits: Saved::logits' columns)
      index_t dreg = 0;         // d(regulariser)/d(logits) [n × N_A]
      index_t yg = 0;           // expert outputs, packed: [rows × d_head] (value), [rows × d] (output); their
                                // inputs (x̂, a^h V^h) are read through the picks inside the GEMMs, not copied
    };
    static constexpr index_t n_sel = 2 * H * NA;  // the selections' logit columns: V^0 .. V^{H-1}, O^0 .. O^{H-1}
    struct Saved {
      index_t ln = 0, mean = 0, rstd = 0;  // LN(x) [n × d] (PostNorm: z = x + y and LN(z)'s statistics)
      index_t logits = 0;                  // every selection's logits [n × 2·H·N_A] (side j: columns j·N_A ..)
      index_t qkv = 0, att = 0, lse = 0;   // [Q|K|V] [n × 3·H·d_head], attention output [n × H·d_head], lse
      std::array<Side, Heads> v{}, o{};
      index_t aux = 0;                     // δ·Σ L over the 2·H selections (ModuleWithAuxLoss)
    };
    static constexpr Saved plan(Arena& a, index_t batch, index_t seq) {
      const index_t n = batch * seq, rows = n * KA;
      Saved s{};
      s.ln = a.take(n * d);
      s.mean = a.take(n);
      s.rstd = a.take(n);
      s.qkv = a.take(n * 3 * hd);
      s.att = a.take(n * hd);
      s.lse = a.take(batch * H * seq);
      s.logits = a.take(n * n_sel);
      for (int h = 0; h < Heads; ++h) {
        for (Side* side : {&s.v[h], &s.o[h]}) {
          side->sel = dispatch::plan_selection(a, n, KA, NA);
          side->dreg = a.take(n * NA);
        }
        s.v[h].yg = a.take(rows * dh);
        s.o[h].yg = a.take(rows * d);
      }
      s.aux = a.take(1);
      return s;
    }
    struct Scratch {
      index_t datt, dqkv, dln, dy, dwp, dws, dv, dg, dlogits_all, dz, total;
    };
    static constexpr Scratch scratch_plan(index_t n) {
      const index_t rows = n * KA;
      Arena a;
      Scratch s{};
      s.datt = a.take(n * hd);
      s.dqkv = a.take(n * 3 * hd);
      s.dln = a.take(n * d);
      s.dy = a.take(rows * d);   // dL/d(expert output), group order (output side: d; value side: d_head)
      s.dwp = a.take(rows);
      s.dws = a.take(rows);
      s.dv = a.take(rows);
      s.dg = a.take(rows * d);   // dL/d(expert input), group order
      s.dlogits_all = a.take(n * n_sel);  // every selection's dL/dlogits, for the one weight-gradient product
      s.dz = post ? a.take(n * d) : 0;
      s.total = a.used;
      return s;
    }
    static constexpr index_t scratch(index_t batch, index_t seq) { return scratch_plan(batch * seq).total; }

    // Expert (h, e)'s weights: W_V^{h,e} [d_head × d], W_O^{h,e} [d × d_head].
    template <class T>
    static PerGroup<T> w_v(T* p, int h) {
      return uniform_groups(p + o_v + index_t(h) * NA * dh * d, NA, dh * d);
    }
    template <class T>
    static PerGroup<T> w_o(T* p, int h) {
      return uniform_groups(p + o_o + index_t(h) * NA * d * dh, NA, d * dh);
    }

    // Selection j's logit columns (j < H: the value selection of head j; else the output selection of head j − H).
    template <class T>
    static MatrixView<T> sel_columns(T* base, index_t at, index_t n, int j) {
      return detail::mat(base, at, n, n_sel).col_block(index_t(j) * NA, NA);
    }
    // Side j's selection (eqs. (5)-(6)): its logits LN(x) W_Sᵀ (computed for all sides in run, read in place as
    // side j's columns), the regulariser, top-K_A, σ, the groups.
    template <class Be, class T>
    static void select(Be& be, T* ws, const Saved& s, const Side& side, int j, index_t batch, index_t seq) {
      dispatch::sigmoid_select_forward(be, ws, side.sel, ws + side.dreg, batch, seq, KA, NA, T(delta),
                                       MatrixView<const T>(sel_columns(ws, s.logits, batch * seq, j)));
    }
    // Backward of select: dL/d(weight) in group order (dwp) → dL/dlogits written into side j's columns of
    // dlogits_all (backward turns all 2·H sides' into dL/dLN(x) and dW_S in one product).
    template <class Be, class T>
    static void select_backward(Be& be, const T* ws, const Side& side, int j, T* sc, const Scratch& c, index_t n) {
      using detail::vec;
      const index_t rows = n * KA;
      dispatch::sigmoid_select_backward(be, ws, side.sel, ws + side.dreg, n, KA, NA, vec(static_cast<const T*>(sc), c.dwp, rows),
                                        vec(sc, c.dws, rows), vec(sc, c.dv, rows), sel_columns(sc, c.dlogits_all, n, j));
    }

    // Selection j's experts (eq. (7): a head's values, in = x̂, out = its V columns; eq. (9): its
    // outputs, in = a^h V^h, out = y): the selection from its logits (its regulariser added to aux), then
    // out += Σ_{e picked} s[e] · in_t W^{h,e}ᵀ over exactly the (token, expert) pairs (st = Store::overwrite: out =).
    template <class Be, class T>
    static void experts_forward(Be& be, PerGroup<const T> w, T* ws, const Saved& s, const Side& side, int j,
                                MatrixView<const T> in, MatrixView<T> out, Store st, std::span<T> aux, index_t batch,
                                index_t seq) {
      using detail::mat, detail::vec;
      const index_t rows = batch * seq * KA;
      select(be, ws, s, side, j, batch, seq);
      be.axpy(aux, T(1), vec(static_cast<const T*>(ws), side.sel.loss, 1));
      const auto rr = dispatch::routed_rows(static_cast<const T*>(ws), side.sel, NA, batch * seq, KA);
      const auto yg = mat(ws, side.yg, rows, out.cols);
      be.grouped_linear_forward(yg, in, rr.token, w, PerGroup<const T>{}, rr.groups);  // in's rows read via the picks
      dispatch::combine(be, rr, MatrixView<const T>(yg), out, st);
    }
    // Its backward: dout (read first) → the experts' dW (gw), din += the experts' input gradient (din_store =
    // Store::overwrite: =, not +=), and the selection's logit gradient into its columns of dlogits_all.
    template <class Be, class T>
    static void experts_backward(Be& be, PerGroup<const T> w, PerGroup<T> gw, const T* ws, const Side& side, int j,
                                 MatrixView<const T> in, MatrixView<const T> dout, MatrixView<T> din, Store din_store, T* sc,
                                 const Scratch& c, index_t n) {
      using detail::mat, detail::vec;
      const index_t rows = n * KA;
      const auto rr = dispatch::routed_rows(ws, side.sel, NA, n, KA);
      const auto dy = mat(sc, c.dy, rows, dout.cols), dxg = mat(sc, c.dg, rows, din.cols);
      // dxg's group rows overwritten (gather_backward reads no others): no zeroing.
      dispatch::combine_linear_backward(be, rr, mat(ws, side.yg, rows, dout.cols), dout, dy, vec(sc, c.dwp, rows), dxg, gw,
                                        in, rr.token, w, Store::overwrite);
      dispatch::gather_backward(be, rr, MatrixView<const T>(dxg), din, din_store);
      select_backward(be, ws, side, j, sc, c, n);
    }

    template <class Be, class T>
    static void forward(Be& be, const T* p, T* ws, const Saved& s, MatrixView<const T> x, MatrixView<T> f_out,
                        index_t batch, index_t seq) {
      run(be, p, ws, s, x, f_out, batch, seq, [&](MatrixView<T> qkv, MatrixView<T> att) {
        rope(be, qkv, batch, seq, false);
        be.attention_forward(att, detail::vec(ws, s.lse, batch * H * seq), MatrixView<const T>(qkv), batch, seq, H);
      });
    }

    // ---- incremental decoding (infer/decoder.hpp; modules/module.hpp, DecodingSequenceMixer) -------
    // One new token per active sequence (rows of x). The step's workspace is forward's for `rows`
    // sequences of one token (each row's selections and regulariser over itself; the loss is unused).
    // The round's caches are d wide (assembly/decode_rounds.hpp): q, k and v of H·d_head <= d columns use
    // their first H·d_head. Row r's rotated key and its value are written at (slot[r], pos[r]), then it
    // attends to positions 0..pos[r] of its sequence, as forward's causal attention does.
    using DecodeSaved = Saved;
    static constexpr DecodeSaved plan_decode(Arena& a, index_t rows) { return plan(a, rows, 1); }
    template <class Be, class T>
    static void decode(Be& be, const T* p, T* ws, const DecodeSaved& s, MatrixView<const T> x, MatrixView<T> f_out,
                       MatrixView<T> k_cache, MatrixView<T> v_cache, std::span<const index_t> slot,
                       std::span<const index_t> pos, index_t max_len) {
      MOM_CHECK(k_cache.cols >= hd && v_cache.cols >= hd, "SwitchHead::decode: caches ", k_cache.cols,
                " wide for H·d_head = ", hd);
      const MatrixView<T> kc = k_cache.col_block(0, hd), vc = v_cache.col_block(0, hd);
      run(be, p, ws, s, x, f_out, x.rows, 1, [&](MatrixView<T> qkv, MatrixView<T> att) {
        if constexpr (D.rope()) be.rope_forward(qkv.col_block(0, 2 * hd), pos, max_len, dh, T(D.rope_base));
        be.kv_write(kc, vc, MatrixView<const T>(qkv), slot, pos, max_len);
        be.attention_decode(att, MatrixView<const T>(qkv), MatrixView<const T>(kc), MatrixView<const T>(vc), slot, pos,
                            max_len, H);
      });
    }

    // forward's body: LN, q | k, the value experts (eq. (7)), attend(qkv, att) (eq. (8): the causal op over
    // the sequence in forward, the cache in decode), the output experts (eq. (9)), the post-norm.
    template <class Be, class T, class Attend>
    static void run(Be& be, const T* p, T* ws, const Saved& s, MatrixView<const T> x, MatrixView<T> f_out,
                    index_t batch, index_t seq, Attend&& attend) {
      using detail::mat, detail::vec;
      const index_t n = batch * seq;
      const auto ln = mat(ws, s.ln, n, d);
      const auto qkv = mat(ws, s.qkv, n, 3 * hd), att = mat(ws, s.att, n, hd);
      const MatrixView<const T> cln = post ? x : MatrixView<const T>(ln), xin = peri || post ? x : cln;
      if constexpr (!post)
        be.layernorm_forward(ln, vec(ws, s.mean, n), vec(ws, s.rstd, n), x, vec(p, o_ln_w, d), vec(p, o_ln_b, d));
      be.linear_forward(qkv.col_block(0, 2 * hd), cln, mat(p, o_qk, 2 * hd, d), std::span<const T>{});  // q, k
      be.linear_forward(mat(ws, s.logits, n, n_sel), cln, mat(p, o_sv, n_sel, d), std::span<const T>{});  // eqs. (5)-(6)
      const std::span<T> aux = vec(ws, s.aux, 1);
      be.zero(aux);
      for (int h = 0; h < Heads; ++h)  // v^h, eq. (7): each head writes its own V columns
        experts_forward(be, w_v(p, h), ws, s, s.v[h], h, xin, qkv.col_block(2 * hd + h * dh, dh), Store::overwrite, aux,
                        batch, seq);
      attend(qkv, att);  // eq. (8)
      for (int h = 0; h < Heads; ++h)  // y, eq. (9): the first head writes f_out, the others add
        experts_forward(be, w_o(p, h), ws, s, s.o[h], Heads + h, MatrixView<const T>(att.col_block(h * dh, dh)), f_out,
                        h == 0 ? Store::overwrite : Store::add, aux, batch, seq);
      if constexpr (post)
        detail::post_norm_forward(be, f_out, ln, vec(ws, s.mean, n), vec(ws, s.rstd, n), x, vec(p, o_ln_w, d),
                                  vec(p, o_ln_b, d));
    }

    // df may alias dx: df is read only by the output experts' scatter backward (PostNorm: by the
    // post-norm's backward, which hands the rest dL/dz), before dx is written.
    template <class Be, class T>
    static void backward(Be& be, const T* p, T* g, const T* ws, const Saved& s, MatrixView<const T> x,
                         MatrixView<T> dx, MatrixView<const T> df, T* sc, index_t batch, index_t seq) {
      using detail::mat, detail::vec;
      const index_t n = batch * seq;
      const Scratch c = scratch_plan(n);
      const MatrixView<const T> ln = post ? x : mat(ws, s.ln, n, d);  // what Q, K and the selections read
      const auto datt = mat(sc, c.datt, n, hd), dqkv = mat(sc, c.dqkv, n, 3 * hd);
      const MatrixView<T> dln = post ? dx : mat(sc, c.dln, n, d);      // their input gradient
      MatrixView<const T> dy_out = df;                                 // dL/dy
      if constexpr (post) {
        const auto dz = mat(sc, c.dz, n, d);
        detail::post_norm_backward(be, dz, vec(g, o_ln_w, d), vec(g, o_ln_b, d), df, mat(ws, s.ln, n, d),
                                   vec(ws, s.mean, n), vec(ws, s.rstd, n), vec(p, o_ln_w, d), dx);
        dy_out = dz;
      }
      be.zero(dqkv);
      // eq. (9) backward: dL/d(a^h V^h) (each head writes its own columns of datt), dW_O, the output selections'
      // logit gradients.
      for (int h = 0; h < Heads; ++h)
        experts_backward(be, w_o(p, h), w_o(g, h), ws, s.o[h], Heads + h, mat(ws, s.att, n, hd).col_block(h * dh, dh),
                         dy_out, datt.col_block(h * dh, dh), Store::overwrite, sc, c, n);
      be.attention_backward(dqkv, MatrixView<const T>(datt), mat(ws, s.att, n, hd), vec(ws, s.lse, batch * H * seq),
                            mat(ws, s.qkv, n, 3 * hd), batch, seq, H);
      rope(be, dqkv, batch, seq, true);
      // dL/dLN(x), first from Q and K (written; PostNorm: added to dx, which holds the post-norm's gradient)
      be.linear_backward(dln, mat(g, o_qk, 2 * hd, d), std::span<T>{}, MatrixView<const T>(dqkv.col_block(0, 2 * hd)), ln,
                         mat(p, o_qk, 2 * hd, d), post ? Store::add : Store::overwrite);
      const MatrixView<T> dxin = peri || post ? dx : dln;
      const MatrixView<const T> xin = peri || post ? x : ln;  // the value experts' input, as in forward
      for (int h = 0; h < Heads; ++h)  // eq. (7) backward: dW_V, dx̂, the value selections' logit gradients
        experts_backward(be, w_v(p, h), w_v(g, h), ws, s.v[h], h, xin,
                         MatrixView<const T>(dqkv.col_block(2 * hd + h * dh, dh)), dxin, Store::add, sc, c, n);
      // dL/dLN(x) and dW_S of all 2·H selections in one product (eqs. (5)-(6) backward).
      be.linear_backward(dln, mat(g, o_sv, n_sel, d), std::span<T>{}, MatrixView<const T>(mat(sc, c.dlogits_all, n, n_sel)),
                         ln, mat(p, o_sv, n_sel, d));
      if constexpr (!post)
        be.layernorm_backward(dx, vec(g, o_ln_w, d), vec(g, o_ln_b, d), MatrixView<const T>(dln), x, vec(ws, s.mean, n),
                              vec(ws, s.rstd, n), vec(p, o_ln_w, d));
    }

    // Rotary positions on the q and k blocks of a [Q|K|V] matrix (their gradients when inverse).
    // Position t = row % seq (backend/cpu/rope.hpp); nothing under learned positions (the LM adds wpe).
    template <class Be, class T>
    static void rope(Be& be, MatrixView<T> qkv, index_t /*batch*/, index_t seq, bool inverse) {
      if constexpr (D.rope()) {
        const MatrixView<T> qk = qkv.col_block(0, 2 * hd);
        if (inverse) be.rope_backward(qk, std::span<const index_t>{}, seq, dh, T(D.rope_base));
        else be.rope_forward(qk, std::span<const index_t>{}, seq, dh, T(D.rope_base));
      }
    }
  };
};

}  // namespace mom

#pragma once
// Multi-head causal self-attention module (GPT-2), with its own pre-LayerNorm (paper eq. (4)):
//   f(x) = proj(attention(qkv(LN(x))))
// The residual x + f(x) is added by the assembling function. MHA<N> is a family of N
// such modules inside a ModuleSet (paper eq. (1), m^A_1..m^A_N).
// With D.positions = RoPE the queries and keys are rotated by their positions right after the qkv
// projection (RoFormer, arXiv 2104.09864, eq. (34); backend op rope_forward, in place on the q | k
// columns), and dQ, dK rotated back (rope_backward) before the projection's backward. The positions:
// t = row mod seq densely, idx[r] mod seq for routed rows (their flat token index), pos[r] in decode.
#include <array>
#include <span>

#include "mom/backend/backend_concept.hpp"  // FusesNormLinear, FusesAttentionLinear, GradLayout, NormSaved
#include "mom/modules/module.hpp"

namespace mom {

namespace modules {

template <Dims D>
struct Attention {
  static constexpr ModuleRole single_role = ModuleRole::SequenceMixer;  // MHA<N>'s (modules/module.hpp)
  static constexpr index_t d = D.d_model;

  // Offsets of the tensors inside one module's parameter block, in layout order.
  static constexpr index_t o_ln_w = 0;
  static constexpr index_t o_ln_b = o_ln_w + d;
  static constexpr index_t o_w_qkv = o_ln_b + d;
  static constexpr index_t o_b_qkv = o_w_qkv + 3 * d * d;
  static constexpr index_t o_w_proj = o_b_qkv + 3 * d;
  static constexpr index_t o_b_proj = o_w_proj + d * d;
  static constexpr index_t params = o_b_proj + d;

  // Rotary position embedding (Dims::positions): rotate the q and k columns in place.
  static constexpr bool rope = D.rope();
  static constexpr index_t hd = D.head_dim();
  template <class T>
  static constexpr T rope_base = T(D.rope_base);

  static constexpr std::array<TensorSpec, 6> tensors(index_t layer) {
    return {{{"ln_1.w", layer, 1, d, Init::One},
             {"ln_1.b", layer, 1, d, Init::Zero},
             {"attn.w_qkv", layer, 3 * d, d, Init::Normal},
             {"attn.b_qkv", layer, 1, 3 * d, Init::Zero},
             {"attn.w_proj", layer, d, d, Init::ResidualNormal},
             {"attn.b_proj", layer, 1, d, Init::Zero}}};
  }

  // Forward FLOPs per token at sequence length `seq`: the two GEMMs (qkv: 2*d*3d, proj:
  // 2*d*d) plus causal attention. Token t (0-based) scores t+1 keys: QK^T costs 2*hd*(t+1)
  // per head and PV the same, so a sequence costs sum_t 4*d*(t+1) = 2*d*seq*(seq+1) and a
  // token on average 2*d*(seq+1). These are the useful (causal) FLOPs, the usual convention for
  // MFU; the CPU op computes the triangle in 64-row blocks and so also multiplies the masked
  // half of each diagonal block (at most 32*hd extra multiply-adds per row and head).
  // RoPE's rotation (6 FLOPs per q/k pair, 6·d per token, plus the angles' cos / sin) is elementwise
  // work like LayerNorm's and is not counted, forward or backward.
  static constexpr index_t flops_per_token(index_t seq) { return 2 * d * 3 * d + 2 * d * d + 2 * d * (seq + 1); }
  // Backward: two products per linear (dx and dW); attention recomputes P = softmax(QKᵀ) from
  // the saved lse and forms dP = dO·Vᵀ, dV = Pᵀ·dO, dQ = dS·K, dK = dSᵀ·Q: five causal products
  // of d*(seq+1) FLOPs per token each.
  static constexpr index_t backward_flops_per_token(index_t seq) {
    return 2 * (2 * d * 3 * d + 2 * d * d) + 5 * d * (seq + 1);
  }

  // Activations forward keeps for backward.
  struct Saved {
    index_t ln, mean, rstd, qkv, att, lse;
  };
  static constexpr Saved plan(Arena& a, index_t batch, index_t seq) {
    const index_t n = batch * seq;
    Saved s{};
    s.ln = a.take(n * d);
    s.mean = a.take(n);
    s.rstd = a.take(n);
    s.qkv = a.take(n * 3 * d);
    s.att = a.take(n * d);
    s.lse = a.take(batch * D.heads * seq);
    return s;
  }
  // Backward scratch: d(att) [n x d], d(qkv) [n x 3d], d(ln) [n x d].
  static constexpr index_t scratch(index_t batch, index_t seq) { return batch * seq * 5 * d; }

  // f_out [n x d] = proj(attention(qkv(LN(x)))) for x [n x d], n = batch * seq.
  template <class Be, class T>
  static void forward(Be& be, const T* p, T* ws, const Saved& s, MatrixView<const T> x, MatrixView<T> f_out,
                      index_t batch, index_t seq) {
    forward_into(be, p, ws, s, x, f_out, batch, seq, MatrixView<const T>{});
  }
  // out = x + f(x) (AddsResidualOn): the residual added in the proj product's epilogue by the attention pair.
  template <class Be, class T>
    requires FusesAttentionLinear<Be, T>
  static void forward_residual(Be& be, const T* p, T* ws, const Saved& s, MatrixView<const T> x, MatrixView<T> out,
                               index_t batch, index_t seq) {
    forward_into(be, p, ws, s, x, out, batch, seq, x);
  }

 private:
  // forward's body: f_out = f(x), plus residual where given (forward_residual's: only on a backend with the attention
  // pair, which adds it).
  template <class Be, class T>
  static void forward_into(Be& be, const T* p, T* ws, const Saved& s, MatrixView<const T> x, MatrixView<T> f_out,
                           index_t batch, index_t seq, MatrixView<const T> residual) {
    using detail::mat, detail::vec;
    const index_t n = batch * seq;
    const auto ln = mat(ws, s.ln, n, d);
    const auto qkv = mat(ws, s.qkv, n, 3 * d);
    const auto att = mat(ws, s.att, n, d);
    if constexpr (FusesNormLinear<Be, T>) {  // LN and qkv as one op pair: ln in the backend's layout
      // Without RoPE the attention pair alone reads qkv, which may then stay in the backend's layout too.
      constexpr OutLayout qkv_layout{FusesAttentionLinear<Be, T> && !rope ? index_t{D.heads} : index_t{0}};
      be.norm_linear_forward(qkv, NormSaved<T>(ln, vec(ws, s.mean, n), vec(ws, s.rstd, n)), x, vec(p, o_ln_w, d),
                             vec(p, o_ln_b, d), mat(p, o_w_qkv, 3 * d, d), vec(p, o_b_qkv, 3 * d), qkv_layout);
    } else {
      be.layernorm_forward(ln, vec(ws, s.mean, n), vec(ws, s.rstd, n), x, vec(p, o_ln_w, d), vec(p, o_ln_b, d));
      be.linear_forward(qkv, MatrixView<const T>(ln), mat(p, o_w_qkv, 3 * d, d), vec(p, o_b_qkv, 3 * d));
    }
    if constexpr (rope) be.rope_forward(qkv.col_block(0, 2 * d), std::span<const index_t>{}, seq, hd, rope_base<T>);
    const auto lse = vec(ws, s.lse, batch * D.heads * seq);
    if constexpr (FusesAttentionLinear<Be, T>) {  // attention and proj as one op pair: att in the backend's layout
      be.attention_linear_forward(f_out, att, lse, MatrixView<const T>(qkv), mat(p, o_w_proj, d, d),
                                  vec(p, o_b_proj, d), batch, seq, index_t{D.heads}, residual);
    } else {
      be.attention_forward(att, lse, MatrixView<const T>(qkv), batch, seq, index_t{D.heads});
      be.linear_forward(f_out, MatrixView<const T>(att), mat(p, o_w_proj, d, d), vec(p, o_b_proj, d));
    }
  }

 public:
  // Given df = dL/df_out, accumulate dL/dx into dx and dL/dparams into g (both +=).
  template <class Be, class T>
  static void backward(Be& be, const T* p, T* g, const T* ws, const Saved& s, MatrixView<const T> x, MatrixView<T> dx,
                       MatrixView<const T> df, T* scratch, index_t batch, index_t seq) {
    using detail::mat, detail::vec;
    const index_t n = batch * seq;
    const auto datt = mat(scratch, 0, n, d);
    const auto dqkv = mat(scratch, n * d, n, 3 * d);
    const auto dln = mat(scratch, 4 * n * d, n, d);
    const auto att = mat(ws, s.att, n, d);
    const auto lse = vec(ws, s.lse, batch * D.heads * seq);
    // Without RoPE the two pairs hand dqkv over in the backend's layout (nothing else reads it between them).
    constexpr GradLayout dqkv_layout =
        FusesAttentionLinear<Be, T> && FusesNormLinear<Be, T> && !rope ? GradLayout::backend : GradLayout::fp32;
    if constexpr (FusesAttentionLinear<Be, T>) {  // dqkv written
      be.attention_linear_backward(dqkv, mat(g, o_w_proj, d, d), vec(g, o_b_proj, d), datt, df, att, lse,
                                   mat(ws, s.qkv, n, 3 * d), mat(p, o_w_proj, d, d), batch, seq, index_t{D.heads},
                                   dqkv_layout);
    } else {
      be.zero(dqkv);  // attention_backward accumulates; datt and dln are written (Store::overwrite)
      be.linear_backward(datt, mat(g, o_w_proj, d, d), vec(g, o_b_proj, d), df, att, mat(p, o_w_proj, d, d),
                         Store::overwrite);
      be.attention_backward(dqkv, MatrixView<const T>(datt), att, lse, mat(ws, s.qkv, n, 3 * d), batch, seq,
                            index_t{D.heads});
    }
    if constexpr (rope) be.rope_backward(dqkv.col_block(0, 2 * d), std::span<const index_t>{}, seq, hd, rope_base<T>);
    if constexpr (FusesNormLinear<Be, T>) {
      be.norm_linear_backward(dx, vec(g, o_ln_w, d), vec(g, o_ln_b, d), mat(g, o_w_qkv, 3 * d, d),
                              vec(g, o_b_qkv, 3 * d), dln, MatrixView<const T>(dqkv), x,
                              NormSaved<const T>(mat(ws, s.ln, n, d), vec(ws, s.mean, n), vec(ws, s.rstd, n)),
                              vec(p, o_ln_w, d), mat(p, o_w_qkv, 3 * d, d), dqkv_layout);
    } else {
      be.linear_backward(dln, mat(g, o_w_qkv, 3 * d, d), vec(g, o_b_qkv, 3 * d), MatrixView<const T>(dqkv),
                         mat(ws, s.ln, n, d), mat(p, o_w_qkv, 3 * d, d), Store::overwrite);
      be.layernorm_backward(dx, vec(g, o_ln_w, d), vec(g, o_ln_b, d), MatrixView<const T>(dln), x, vec(ws, s.mean, n),
                            vec(ws, s.rstd, n), vec(p, o_ln_w, d));
    }
  }
  // ---- incremental decoding (infer/decoder.hpp; modules/module.hpp, DecodingSequenceMixer) -------
  // One new token per active sequence: the rows of x [rows x d]. The module's key/value cache is
  // k_cache / v_cache [slots·max_len x d] (cpu/decode.hpp): row r is sequence slot[r] at position
  // pos[r]; its key and value are written there, then it attends to positions 0..pos[r] of its
  // sequence, exactly the causal attention of forward for that position. With RoPE the query and key
  // are rotated by pos[r] first, so the cache holds rotated keys, as forward's attention sees them.
  // The step's workspace is forward's for `rows` tokens of one position (its lse rows go unused).
  using DecodeSaved = Saved;
  static constexpr DecodeSaved plan_decode(Arena& a, index_t rows) { return plan(a, rows, 1); }
  template <class Be, class T>
  static void decode(Be& be, const T* p, T* ws, const DecodeSaved& s, MatrixView<const T> x, MatrixView<T> f_out,
                     MatrixView<T> k_cache, MatrixView<T> v_cache, std::span<const index_t> slot,
                     std::span<const index_t> pos, index_t max_len) {
    decode_into(be, p, ws, s, x, f_out, k_cache, v_cache, slot, pos, max_len, MatrixView<const T>{});
  }
  // out = x + decode's f(x) (DecodesResidualOn): the residual added in the proj product's epilogue.
  template <class Be, class T>
    requires FusesLinearResidual<Be, T>
  static void decode_residual(Be& be, const T* p, T* ws, const DecodeSaved& s, MatrixView<const T> x,
                              MatrixView<T> out, MatrixView<T> k_cache, MatrixView<T> v_cache,
                              std::span<const index_t> slot, std::span<const index_t> pos, index_t max_len) {
    decode_into(be, p, ws, s, x, out, k_cache, v_cache, slot, pos, max_len, x);
  }

 private:
  // decode's body: f_out = f(x), plus residual where given (decode_residual's: only on a backend with
  // linear_forward_residual).
  template <class Be, class T>
  static void decode_into(Be& be, const T* p, T* ws, const DecodeSaved& s, MatrixView<const T> x, MatrixView<T> f_out,
                          MatrixView<T> k_cache, MatrixView<T> v_cache, std::span<const index_t> slot,
                          std::span<const index_t> pos, index_t max_len, MatrixView<const T> residual) {
    using detail::mat, detail::vec;
    const index_t rows = x.rows;
    const auto ln = mat(ws, s.ln, rows, d);
    const auto qkv = mat(ws, s.qkv, rows, 3 * d);
    const auto att = mat(ws, s.att, rows, d);
    be.layernorm_forward(ln, vec(ws, s.mean, rows), vec(ws, s.rstd, rows), x, vec(p, o_ln_w, d), vec(p, o_ln_b, d));
    be.linear_forward(qkv, MatrixView<const T>(ln), mat(p, o_w_qkv, 3 * d, d), vec(p, o_b_qkv, 3 * d));
    if constexpr (rope) be.rope_forward(qkv.col_block(0, 2 * d), pos, max_len, hd, rope_base<T>);
    be.kv_write(k_cache, v_cache, MatrixView<const T>(qkv), slot, pos, max_len);
    be.attention_decode(att, MatrixView<const T>(qkv), MatrixView<const T>(k_cache), MatrixView<const T>(v_cache), slot,
                        pos, max_len, index_t{D.heads});
    if constexpr (FusesLinearResidual<Be, T>)
      be.linear_forward_residual(f_out, MatrixView<const T>(att), mat(p, o_w_proj, d, d), vec(p, o_b_proj, d), residual);
    else
      be.linear_forward(f_out, MatrixView<const T>(att), mat(p, o_w_proj, d, d), vec(p, o_b_proj, d));
  }

 public:
  // ---- decoding inside a routed executor (MoM; modules/module.hpp, RoutedDecodingSequenceMixerOn) ----
  // The two halves of decode, for executors whose tokens do not all run the module: every token may
  // write keys (phi::MoM's AllTokens) while only the routed ones query, and a row's cache row at[r] may
  // differ from its position pos[r] (phi::MoMRoutedKV: at = how many earlier tokens of the sequence
  // were routed here, so the cache holds exactly the keys training's masked attention sees; pos stays
  // the RoPE angle).
  //   decode_keys:    LN, [K|V] of the rows (K rotated by pos), written to cache row slot·max_len + at
  //   decode_queries: LN, Q (rotated by pos), attention over cache rows 0..at of the row's sequence, W_O
  template <class Be, class T>
  static void decode_keys(Be& be, const T* p, T* ws, const DecodeSaved& s, MatrixView<const T> x, MatrixView<T> k_cache,
                          MatrixView<T> v_cache, std::span<const index_t> slot, std::span<const index_t> pos,
                          std::span<const index_t> at, index_t max_len) {
    using detail::mat, detail::vec;
    const index_t rows = x.rows;
    const auto ln = mat(ws, s.ln, rows, d);
    const auto qkv = mat(ws, s.qkv, rows, 3 * d);
    be.layernorm_forward(ln, vec(ws, s.mean, rows), vec(ws, s.rstd, rows), x, vec(p, o_ln_w, d), vec(p, o_ln_b, d));
    be.linear_forward(qkv.col_block(d, 2 * d), MatrixView<const T>(ln), mat(p, o_w_qkv + d * d, 2 * d, d),
                      vec(p, o_b_qkv + d, 2 * d));
    if constexpr (rope) be.rope_forward(qkv.col_block(d, d), pos, max_len, hd, rope_base<T>);
    be.kv_write(k_cache, v_cache, MatrixView<const T>(qkv), slot, at, max_len);
  }
  template <class Be, class T>
  static void decode_queries(Be& be, const T* p, T* ws, const DecodeSaved& s, MatrixView<const T> x,
                             MatrixView<T> f_out, MatrixView<const T> k_cache, MatrixView<const T> v_cache,
                             std::span<const index_t> slot, std::span<const index_t> pos, std::span<const index_t> at,
                             index_t max_len) {
    using detail::mat, detail::vec;
    const index_t rows = x.rows;
    const auto ln = mat(ws, s.ln, rows, d);
    const auto qkv = mat(ws, s.qkv, rows, 3 * d);
    const auto att = mat(ws, s.att, rows, d);
    be.layernorm_forward(ln, vec(ws, s.mean, rows), vec(ws, s.rstd, rows), x, vec(p, o_ln_w, d), vec(p, o_ln_b, d));
    be.linear_forward(qkv.col_block(0, d), MatrixView<const T>(ln), mat(p, o_w_qkv, d, d), vec(p, o_b_qkv, d));
    if constexpr (rope) be.rope_forward(qkv.col_block(0, d), pos, max_len, hd, rope_base<T>);
    be.attention_decode(att, MatrixView<const T>(qkv), k_cache, v_cache, slot, at, max_len, index_t{D.heads});
    be.linear_forward(f_out, MatrixView<const T>(att), mat(p, o_w_proj, d, d), vec(p, o_b_proj, d));
  }

  // ---- over row groups (routed rows; modules/module.hpp, SequenceMixer) --------------------------
  // Cost split as the routed executors count it: per row of the K/V side (LN, the K/V projection),
  // per query row (Q and output projections), per (query, visible key) pair (QKᵀ and PV: 4·d).
  static constexpr index_t kv_flops = 2 * d * 2 * d, query_flops = 2 * d * d + 2 * d * d, pair_flops = 4 * d;
  static constexpr index_t kv_backward_flops = 2 * kv_flops, query_backward_flops = 2 * query_flops,
                           pair_backward_flops = 10 * d;

  // G modules over the packed rows (module g: the rows of group g). AllTokens: per module LN_g, mean,
  // rstd and [K|V] over all n tokens, then the packed rows' LN (gathered), Q, attention output and
  // lse. Routed: the packed rows' LN, mean, rstd, [Q|K|V], attention output and lse. Given: as AllTokens
  // (K/V of x, every token), the queries from the rows' own state xg (their LN and its statistics).
  static constexpr bool given_keys = true;  // KeySource::Given (module.hpp)
  template <int G>
  struct GroupedSaved {
    std::array<index_t, G> ln{}, mean{}, rstd{}, kv{};  // AllTokens, [n × d], [n], [n], [n × 2d] each
    index_t xq = 0, mean_r = 0, rstd_r = 0;             // the packed rows' LN [rows × d] (+ stats: Routed)
    index_t q = 0;                                      // AllTokens: Q [rows × d]; Routed: [Q|K|V] [rows × 3d]
    index_t att = 0, lse = 0;                           // [rows × d], [rows × heads]
  };
  template <int G, KeySource keys>
  static constexpr GroupedSaved<G> plan_grouped(Arena& a, index_t n, index_t rows) {
    GroupedSaved<G> s{};
    if constexpr (keys != KeySource::Routed) {
      for (int g = 0; g < G; ++g) {
        s.ln[g] = a.take(n * d);
        s.mean[g] = a.take(n);
        s.rstd[g] = a.take(n);
        s.kv[g] = a.take(n * 2 * d);
      }
      s.xq = a.take(rows * d);
      s.q = a.take(rows * d);
      if constexpr (keys == KeySource::Given) {
        s.mean_r = a.take(rows);
        s.rstd_r = a.take(rows);
      }
    } else {
      s.xq = a.take(rows * d);
      s.mean_r = a.take(rows);
      s.rstd_r = a.take(rows);
      s.q = a.take(rows * 3 * d);
    }
    s.att = a.take(rows * d);
    s.lse = a.take(rows * D.heads);
    return s;
  }
  // Backward scratch. AllTokens: d(att), dQ, d(LN rows) [rows × d], then per module d[K|V] [n × 2d] and
  // d(LN) [n × d]. Routed: d(att) [rows × d], d[Q|K|V] [rows × 3d], d(LN) [rows × d].
  template <int G, KeySource keys>
  static constexpr index_t scratch_grouped(index_t n, index_t rows) {
    return keys != KeySource::Routed ? 3 * rows * d + G * n * 3 * d : rows * 5 * d;
  }

  template <KeySource keys, class Be, class T, int G>
  static void forward_grouped(Be& be, PerGroup<const T> p, T* ws, const GroupedSaved<G>& s, MatrixView<const T> x,
                              MatrixView<const T> xg, MatrixView<T> out, std::span<const token_t> idx, RowGroups g,
                              index_t seq) {
    using detail::mat, detail::vec;
    const index_t n = x.rows, rows = out.rows, heads = D.heads;
    const auto att = mat(ws, s.att, rows, d);
    const auto lse = vec(ws, s.lse, rows * heads);
    if constexpr (keys != KeySource::Routed) {  // K and V of every token, per module
      for (int m = 0; m < G; ++m) {
        const T* pm = p[m];
        const auto ln = mat(ws, s.ln[m], n, d);
        be.layernorm_forward(ln, vec(ws, s.mean[m], n), vec(ws, s.rstd[m], n), x, vec(pm, o_ln_w, d), vec(pm, o_ln_b, d));
        be.linear_forward(mat(ws, s.kv[m], n, 2 * d), MatrixView<const T>(ln), mat(pm, o_w_qkv + d * d, 2 * d, d),
                          vec(pm, o_b_qkv + d, 2 * d));
        // every token's key at its position: row b·seq + t is position t
        if constexpr (rope)
          be.rope_forward(mat(ws, s.kv[m], n, 2 * d).col_block(0, d), std::span<const index_t>{}, seq, hd,
                          rope_base<T>);
      }
      // The queries' LN rows gathered from each module's LN of every token (Given: the rows' own LN), then Q.
      const auto xq = mat(ws, s.xq, rows, d), q = mat(ws, s.q, rows, d);
      if constexpr (keys == KeySource::Given)
        be.grouped_layernorm_forward(xq, vec(ws, s.mean_r, rows), vec(ws, s.rstd_r, rows), xg, p.plus(o_ln_w),
                                     p.plus(o_ln_b), g);
      else
        be.gather_rows(xq, PerGroup<const T>(ws, G, [&](int m) { return s.ln[m]; }), n, idx, g);
      be.grouped_linear_forward(q, MatrixView<const T>(xq), p.plus(o_w_qkv), p.plus(o_b_qkv), g);
      if constexpr (rope) be.rope_forward(q, idx, seq, hd, rope_base<T>, g);
      const PerGroup<const T> kv(ws, G, [&](int m) { return s.kv[m]; });
      be.attention_grouped_forward(att, lse, MatrixView<const T>(q), kv, kv.plus(d), n, 2 * d, idx,
                                   std::span<const token_t>{}, g, seq, heads);
    } else {  // LN, Q, K and V of the packed rows only
      const auto ln = mat(ws, s.xq, rows, d), qkv = mat(ws, s.q, rows, 3 * d);
      be.grouped_layernorm_forward(ln, vec(ws, s.mean_r, rows), vec(ws, s.rstd_r, rows), xg, p.plus(o_ln_w),
                                   p.plus(o_ln_b), g);
      be.grouped_linear_forward(qkv, MatrixView<const T>(ln), p.plus(o_w_qkv), p.plus(o_b_qkv), g);
      if constexpr (rope) be.rope_forward(qkv.col_block(0, 2 * d), idx, seq, hd, rope_base<T>, g);
      const MatrixView<const T> cq(qkv);
      be.attention_grouped_forward(att, lse, cq.col_block(0, d), same_for_groups(cq.data + d, G),
                                   same_for_groups(cq.data + 2 * d, G), rows, 3 * d, idx, idx, g, seq, heads);
    }
    be.grouped_linear_forward(out, MatrixView<const T>(att), p.plus(o_w_proj), p.plus(o_b_proj), g);
  }

  template <KeySource keys, class Be, class T, int G>
  static void backward_grouped(Be& be, PerGroup<const T> p, PerGroup<T> gp, const T* ws, const GroupedSaved<G>& s,
                               MatrixView<const T> x, MatrixView<const T> xg, MatrixView<T> dx, MatrixView<T> dxg,
                               MatrixView<const T> dout, std::span<const token_t> idx, RowGroups g, index_t seq,
                               T* scratch) {
    using detail::mat, detail::vec;
    const index_t n = x.rows, rows = dout.rows, heads = D.heads;
    const auto att = mat(ws, s.att, rows, d);
    const auto lse = vec(ws, s.lse, rows * heads);
    const auto datt = mat(scratch, 0, rows, d);
    be.zero_rows(datt, g);
    be.grouped_linear_backward(datt, gp.plus(o_w_proj), gp.plus(o_b_proj), dout, att, p.plus(o_w_proj), g);
    if constexpr (keys != KeySource::Routed) {
      const auto dq = mat(scratch, rows * d, rows, d), dxq = mat(scratch, 2 * rows * d, rows, d);
      T* const dkv0 = scratch + 3 * rows * d;  // module m's d[K|V] at m·n·2d
      T* const dln0 = dkv0 + G * n * 2 * d;     // module m's d(LN) at m·n·d
      const PerGroup<const T> kv(ws, G, [&](int m) { return s.kv[m]; });
      const PerGroup<T> dkv(dkv0, G, [&](int m) { return m * n * 2 * d; });
      const PerGroup<T> dln(dln0, G, [&](int m) { return m * n * d; });
      be.zero_rows(dq, g);
      be.zero(vec(dkv0, 0, G * n * 2 * d));
      be.attention_grouped_backward(dq, dkv, dkv.plus(d), MatrixView<const T>(datt), att, lse, mat(ws, s.q, rows, d), kv,
                                    kv.plus(d), n, 2 * d, idx, std::span<const token_t>{}, g, seq, heads);
      if constexpr (rope) {  // dQ, dK of the rotated values -> of the projections' outputs
        be.rope_backward(dq, idx, seq, hd, rope_base<T>, g);
        for (int m = 0; m < G; ++m)
          be.rope_backward(mat(dkv[m], 0, n, 2 * d).col_block(0, d), std::span<const index_t>{}, seq, hd, rope_base<T>);
      }
      // K/V read every token's LN row (module m's dL/dLN at dln[m]); Q the gathered LN rows.
      for (int m = 0; m < G; ++m) {
        be.zero(vec(dln[m], 0, n * d));
        be.linear_backward(mat(dln[m], 0, n, d), mat(gp[m], o_w_qkv + d * d, 2 * d, d), vec(gp[m], o_b_qkv + d, 2 * d),
                           mat<const T>(dkv[m], 0, n, 2 * d), mat(ws, s.ln[m], n, d), mat(p[m], o_w_qkv + d * d, 2 * d, d));
      }
      be.zero_rows(dxq, g);
      be.grouped_linear_backward(dxq, gp.plus(o_w_qkv), gp.plus(o_b_qkv), MatrixView<const T>(dq), mat(ws, s.xq, rows, d),
                                 p.plus(o_w_qkv), g);
      if constexpr (keys == KeySource::Given)  // the queries' LN is the rows' own: its gradient into dxg
        be.grouped_layernorm_backward(dxg, gp.plus(o_ln_w), gp.plus(o_ln_b), MatrixView<const T>(dxq), xg,
                                      vec(ws, s.mean_r, rows), vec(ws, s.rstd_r, rows), p.plus(o_ln_w), g);
      else
        be.scatter_add_rows(dln, n, MatrixView<const T>(dxq), idx, g);
      for (int m = 0; m < G; ++m)
        be.layernorm_backward(dx, vec(gp[m], o_ln_w, d), vec(gp[m], o_ln_b, d), mat<const T>(dln[m], 0, n, d), x,
                              vec(ws, s.mean[m], n), vec(ws, s.rstd[m], n), vec(p[m], o_ln_w, d));
    } else {
      const auto dqkv = mat(scratch, rows * d, rows, 3 * d), dln = mat(scratch, 4 * rows * d, rows, d);
      const auto qkv = mat(ws, s.q, rows, 3 * d);
      be.zero_rows(dqkv, g);
      be.zero_rows(dln, g);
      be.attention_grouped_backward(dqkv.col_block(0, d), same_for_groups(dqkv.data + d, G),
                                    same_for_groups(dqkv.data + 2 * d, G), MatrixView<const T>(datt), att, lse,
                                    qkv.col_block(0, d), same_for_groups(qkv.data + d, G), same_for_groups(qkv.data + 2 * d, G),
                                    rows, 3 * d, idx, idx, g, seq, heads);
      if constexpr (rope) be.rope_backward(dqkv.col_block(0, 2 * d), idx, seq, hd, rope_base<T>, g);
      be.grouped_linear_backward(dln, gp.plus(o_w_qkv), gp.plus(o_b_qkv), MatrixView<const T>(dqkv),
                                 mat(ws, s.xq, rows, d), p.plus(o_w_qkv), g);
      be.grouped_layernorm_backward(dxg, gp.plus(o_ln_w), gp.plus(o_ln_b), MatrixView<const T>(dln), xg,
                                    vec(ws, s.mean_r, rows), vec(ws, s.rstd_r, rows), p.plus(o_ln_w), g);
    }
  }
};

}  // namespace modules

// MHA<N, Impl>: N attention modules in a ModuleSet, each an Impl<D> (a SequenceMixer;
// modules::Attention, GPT-2's, by default).
template <int N, template <Dims> class Impl = modules::Attention>
struct MHA {
  static constexpr ModuleRole role = ModuleRole::SequenceMixer;
  static constexpr int count = N;
  template <Dims D>
  using single = typename checked_sequence_mixer<Impl<D>>::type;
};

}  // namespace mom

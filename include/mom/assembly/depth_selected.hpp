#pragma once
// Mixture-of-Depths' routed blocks during training (Router<BlockChoice<...>> without CausalRouting):
// every sequence gives exactly C = ⌊capacity·seq⌋ tokens (the top-C of the router's scores, in causal
// order), so the gathered rows are `batch` sequences of C tokens and the block runs as a plain dense
// block over (batch, C): ordinary causal attention among the selected tokens, no per-token work.
//   x̃ = x[S]; u = x̃ + Attn(x̃); f = u + FFN(u) − x̃;  x_{h+1} = x_h + scatter(w · f)     (MoD eq. (1))
// The router, the unrouted layers and everything else: DepthExecutorBase (assembly/depth_base.hpp).
#include "mom/assembly/depth_base.hpp"
#include "mom/modules/checked.hpp"

namespace mom::detail {

template <class Policy, class A, Dims D>
struct SelectedBlocks : DepthExecutorBase<SelectedBlocks<Policy, A, D>, Policy, A, D> {
  // The block's attention is the module's dense forward over (batch, C): with RoPE it would rotate a
  // selected token by its rank among the selected, not by its position (and differently from inference,
  // where PackedBlocks uses the true positions).
  static_assert(!D.rope(),
                "mom::Router<BlockChoice> (Mixture-of-Depths) does not support RoPE positions yet: its routed blocks "
                "run dense attention over the C selected tokens, which would rotate them by rank, not position");
  using Base = DepthExecutorBase<SelectedBlocks, Policy, A, D>;
  using typename Base::Attn;
  using typename Base::Block;
  using typename Base::Layer;
  using typename Base::Scratch;
  using typename Base::Set;
  using Base::capacity_tokens;
  using Base::d;
  using Base::mv;
  using Base::route_backward;
  using Base::sp;
  using Base::toks;
  using Base::unit_weight;

  // Top-C per sequence depends on the sequence's later tokens: no incremental decode (infer/decoder.hpp
  // names the causal methods instead; causal_sampling_arch in assembly/depth.hpp).
  static constexpr bool routes_causally = false;

  // Attention over (batch, C): the module's dense workspace (the same sizes as plan(1, rows)).
  static constexpr void plan_attention(Arena& a, Layer& l, index_t /*n*/, index_t rows) { l.attn = Attn::plan(a, 1, rows); }
  static constexpr index_t attention_scratch(index_t /*n*/, index_t /*rows*/) { return 0; }
  template <class Be, class T>
  static index_t rows_run(Be&, const T*, const Layer&, index_t batch, index_t seq) {
    return batch * capacity_tokens(seq);
  }

  // x_next holds x_h (copied); adds w · f on the selected rows. fm: [n × d] forward scratch.
  template <class Be, class T>
  static void block_forward(Be& be, const T* p, T* ws, const Layer& l, int h, MatrixView<const T> x, MatrixView<T> x_next,
                            T* fm_scratch, std::span<T> aux, index_t batch, index_t seq) {
    const index_t m = batch * capacity_tokens(seq);
    if (m == 0) return;  // C = ⌊capacity·seq⌋ is 0 for a short sequence: nobody runs the block
    const T* pa = p + Set::template attention_offset<D>(h);
    const MatrixView<T> xg = mv(ws + l.xg, m, d), u = mv(ws + l.u, m, d), fo = mv(ws + l.fo, m, d);
    const MatrixView<T> fm = mv(fm_scratch, m, d);
    const auto rr = Base::picked(static_cast<const T*>(ws), l, m);
    dispatch::gather(be, rr, x, xg);
    checked<Attn>::forward(be, pa, ws, l.attn, MatrixView<const T>(xg), fo, batch, m / batch);
    be.add_forward(u.flat(), WorkspaceViews::sp<const T>(xg.data, m * d), WorkspaceViews::sp<const T>(fo.data, m * d));
    Block::forward_block(be, p, ws, l.ffn, h, MatrixView<const T>(u), MatrixView<const T>(xg), fo, fm, aux);
    dispatch::combine(be, rr, MatrixView<const T>(fo), x_next);  // MoD eq. (1)
  }

  // dres: dL/dx_{h+1} on entry; the block's input gradient added for the selected rows, dL/d(weight)
  // into the router's dlogits (scratch s.dlogits). The caller runs the router's backward after.
  template <class Be, class T>
  static void block_backward(Be& be, const T* p, T* g, const T* ws, const Layer& l, int h, MatrixView<const T> /*x*/,
                             MatrixView<T> dres, T* sc, const Scratch& s, index_t batch, index_t seq) {
    const index_t m = batch * capacity_tokens(seq), n = batch * seq;
    if (m == 0) return;  // nobody ran the block: only the router's own losses
    const index_t oa = Set::template attention_offset<D>(h);
    const MatrixView<T> dlogits = mv(sc + s.dlogits, n, 1);
    const MatrixView<T> df = mv(sc + s.df, m, d), du = mv(sc + s.g, m, d);
    const std::span<T> dwsel = sp(sc + s.dwsel, m);
    const auto rr = Base::picked(ws, l, m);
    // x' = x + scatter(w · f): df = w · dres[S], dw = dres[S] · f (read before dres changes).
    dispatch::combine_backward(be, rr, WorkspaceViews::mv<const T>(ws + l.fo, m, d), MatrixView<const T>(dres), df,
                               unit_weight ? std::span<T>{} : dwsel);
    // f = a + FFN(u), u = x̃ + a, a = Attn(x̃):  dL/du = FFNᵀ df;  dL/da = df + dL/du;
    // dL/dx̃ = dL/du + Attnᵀ dL/da.
    Block::backward_block(be, p, g, ws, l.ffn, h, WorkspaceViews::mv<const T>(ws + l.u, m, d), df, du, sc + s.module);
    checked<Attn>::backward(be, p + oa, g + oa, ws, l.attn, WorkspaceViews::mv<const T>(ws + l.xg, m, d), du, MatrixView<const T>(df),
                   sc + s.module, batch, m / batch);
    dispatch::gather_backward(be, rr, MatrixView<const T>(du), dres);
    // dL/d(weight) back to the token's score (MoD: the weight is r).
    if constexpr (!unit_weight) be.scatter_add_rows(dlogits, WorkspaceViews::mv<const T>(dwsel.data(), m, 1), rr.token);
  }
};

}  // namespace mom::detail

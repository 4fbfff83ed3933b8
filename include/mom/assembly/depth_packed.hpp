#pragma once
// The routed layers of layer-skip / early exit (Router<Skipping<...>>) and of Mixture-of-Depths at
// inference (ExpertChoice<..., CausalRouting>): a layer runs a variable number of tokens per sequence,
// decided on the device, so its block runs over the run rows as one row group {0, count} (core/groups.hpp)
// whose count the host never reads: grouped ops with host bounds of n rows. Attention is the module's
// forward_grouped over those rows, its keys either the run rows themselves (KeySource::Routed, as MoD)
// or, with AttendToSkipped, every token (KeySource::AllTokens: the skipped ones' keys/values from their
// copied-up state).
//   x̃ = x[S]; u = x̃ + Attn(x̃); f = u + FFN(u) − x̃;  x_{h+1} = x_h + scatter(w · f)
// The router, the unrouted layers and everything else: DepthExecutorBase (assembly/depth_base.hpp).
#include "mom/assembly/depth_base.hpp"

namespace mom::detail {

template <class Policy, class A, Dims D>
struct PackedBlocks : DepthExecutorBase<PackedBlocks<Policy, A, D>, Policy, A, D> {
  using Base = DepthExecutorBase<PackedBlocks, Policy, A, D>;
  using typename Base::Attn;
  using typename Base::Block;
  using typename Base::Layer;
  using typename Base::Scratch;
  using typename Base::Set;
  using Base::d;
  using Base::keys;
  using Base::mv;
  using Base::run_groups;
  using Base::sp;
  using Base::toks;
  using Base::unit_weight;

  static constexpr void plan_attention(Arena& a, Layer& l, index_t n, index_t rows) {
    l.gattn = Attn::template plan_grouped<1, keys>(a, n, rows);
  }
  static constexpr index_t attention_scratch(index_t n, index_t rows) {
    return Attn::template scratch_grouped<1, keys>(n, rows);
  }
  // Tokens routed layer h ran in the last forward, on the host (read-back only: a training step
  // never calls it; the count stays on the device).
  template <class Be, class T>
  static index_t rows_run(Be& be, const T* ws, const Layer& l, index_t, index_t) {
    token_t m = 0;
    be.to_host(std::span<token_t>(&m, 1), std::span<const token_t>(toks(ws, l.groups) + 1, 1));
    return m;
  }

  template <class Be, class T>
  static void block_forward(Be& be, const T* p, T* ws, const Layer& l, int h, MatrixView<const T> x, MatrixView<T> x_next,
                            T* fm_scratch, std::span<T> /*aux*/, index_t batch, index_t seq) {
    const index_t n = batch * seq;
    const T* pa = p + Set::template attention_offset<D>(h);
    const RowGroups g = run_groups(ws, l);
    const auto idx = WorkspaceViews::sp<const token_t>(toks(ws, l.idx), n);
    const MatrixView<T> xg = mv(ws + l.xg, n, d), u = mv(ws + l.u, n, d), fo = mv(ws + l.fo, n, d);
    const MatrixView<T> fm = mv(fm_scratch, n, d);
    be.gather_rows(xg, x, idx, g);
    Attn::template forward_grouped<keys>(be, same_for_groups(pa), ws, l.gattn, x, MatrixView<const T>(xg), fo, idx, g, seq);
    be.add_forward(u, MatrixView<const T>(xg), MatrixView<const T>(fo), g);
    Block::forward_grouped(be, p, ws, l.ffn, h, MatrixView<const T>(u), fo, fm, g);
    be.scatter_add_rows(x_next, MatrixView<const T>(fo), idx,
                        unit_weight ? std::span<const T>{} : WorkspaceViews::sp<const T>(ws + l.wsel, n), g);
  }

  template <class Be, class T>
  static void block_backward(Be& be, const T* p, T* g, const T* ws, const Layer& l, int h, MatrixView<const T> x,
                             MatrixView<T> dres, T* sc, const Scratch& s, index_t batch, index_t seq) {
    const index_t n = batch * seq;
    const index_t oa = Set::template attention_offset<D>(h);
    const RowGroups gr = run_groups(ws, l);
    const auto idx = WorkspaceViews::sp<const token_t>(toks(ws, l.idx), n);
    const MatrixView<T> df = mv(sc + s.df, n, d), du = mv(sc + s.g, n, d);
    const std::span<T> dwsel = sp(sc + s.dwsel, n);
    be.zero_rows(df, gr);
    be.zero(dwsel);
    be.scatter_add_rows_backward(df, unit_weight ? std::span<T>{} : dwsel, MatrixView<const T>(dres),
                                 WorkspaceViews::mv<const T>(ws + l.fo, n, d), idx,
                                 unit_weight ? std::span<const T>{} : WorkspaceViews::sp<const T>(ws + l.wsel, n), gr);
    Block::backward_grouped(be, p, g, ws, l.ffn, h, WorkspaceViews::mv<const T>(ws + l.u, n, d), df, du, sc + s.module, gr);
    // the run rows' input gradient into du (Routed keys); with AttendToSkipped every token's, into dres
    Attn::template backward_grouped<keys>(be, same_for_groups(p + oa), same_for_groups(g + oa), ws, l.gattn, x,
                                          WorkspaceViews::mv<const T>(ws + l.xg, n, d), dres, du, MatrixView<const T>(df), idx, gr, seq,
                                          sc + s.module);
    be.scatter_add_rows(dres, MatrixView<const T>(du), idx, std::span<const T>{}, gr);
    // dL/d(weight) back to the gate σ(g).
    if constexpr (!unit_weight)
      be.scatter_add_rows(mv(sc + s.dgate, n, 1), WorkspaceViews::mv<const T>(dwsel.data(), n, 1), idx, std::span<const T>{}, gr);
  }
};

}  // namespace mom::detail

#pragma once
// The routed layers of layer-skip / early exit (Router<Skipping<...>>) and of Mixture-of-Depths at
// inference (BlockChoice<..., CausalRouting>): a layer runs a variable number of tokens per sequence,
// decided on the device, so its block runs over the run rows as one row group {0, count} (core/groups.hpp)
// whose count the host never reads: grouped ops with host bounds of n rows. Attention is the module's
// forward_grouped over those rows, its keys either the run rows themselves (KeySource::Routed, as MoD)
// or, with AttendToSkipped, every token (KeySource::AllTokens: the skipped ones' keys/values from their
// copied-up state).
//   x̃ = x[S]; u = x̃ + Attn(x̃); f = u + FFN(u) − x̃;  x_{h+1} = x_h + scatter(w · f)
// The router, the unrouted layers and everything else: DepthExecutorBase (assembly/depth_base.hpp).
#include <array>

#include "mom/assembly/decode_rounds.hpp"
#include "mom/assembly/depth_base.hpp"
#include "mom/modules/checked.hpp"

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
  using typename Base::Cfg;
  using typename Base::Plan;
  using Base::L;
  using Base::attend_all;
  using Base::routed;

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
    const MatrixView<T> xg = mv(ws + l.xg, n, d), u = mv(ws + l.u, n, d), fo = mv(ws + l.fo, n, d);
    const MatrixView<T> fm = mv(fm_scratch, n, d);
    const auto rr = Base::picked(static_cast<const T*>(ws), l, n, g);
    dispatch::gather(be, rr, x, xg);
    checked<Attn>::template forward_routed<keys>(be, same_for_groups(pa), ws, l.gattn, x, MatrixView<const T>(xg), fo, rr.token,
                                                 g, seq);
    be.add_forward(u, MatrixView<const T>(xg), MatrixView<const T>(fo), g);
    Block::forward_grouped(be, p, ws, l.ffn, h, MatrixView<const T>(u), fo, fm, g);
    dispatch::combine(be, rr, MatrixView<const T>(fo), x_next);
  }

  template <class Be, class T>
  static void block_backward(Be& be, const T* p, T* g, const T* ws, const Layer& l, int h, MatrixView<const T> x,
                             MatrixView<T> dres, T* sc, const Scratch& s, index_t batch, index_t seq) {
    const index_t n = batch * seq;
    const index_t oa = Set::template attention_offset<D>(h);
    const RowGroups gr = run_groups(ws, l);
    const MatrixView<T> df = mv(sc + s.df, n, d), du = mv(sc + s.g, n, d);
    const std::span<T> dwsel = sp(sc + s.dwsel, n);
    const auto rr = Base::picked(ws, l, n, gr);
    dispatch::combine_backward(be, rr, WorkspaceViews::mv<const T>(ws + l.fo, n, d), MatrixView<const T>(dres), df,
                               unit_weight ? std::span<T>{} : dwsel);
    Block::backward_grouped(be, p, g, ws, l.ffn, h, WorkspaceViews::mv<const T>(ws + l.u, n, d), df, du, sc + s.module, gr);
    // the run rows' input gradient into du (Routed keys); with AttendToSkipped every token's, into dres
    checked<Attn>::template backward_routed<keys>(be, same_for_groups(p + oa), same_for_groups(g + oa), ws, l.gattn, x,
                                          WorkspaceViews::mv<const T>(ws + l.xg, n, d), dres, du, MatrixView<const T>(df), rr.token, gr, seq,
                                          sc + s.module);
    dispatch::gather_backward(be, rr, MatrixView<const T>(du), dres);
    // dL/d(weight) back to the gate σ(g).
    if constexpr (!unit_weight)
      be.scatter_add_rows(mv(sc + s.dgate, n, 1), WorkspaceViews::mv<const T>(dwsel.data(), n, 1), rr.token, std::span<const T>{}, gr);
  }

  // ---- incremental decoding (infer/decoder.hpp; AssemblyDecoderOn; docs/inference.md) -------------
  // A routed layer decides for a new token from its own x_h alone (the skip gate σ(wᵀx + b) > ½, early
  // exit's "ran every routed layer so far", MoD's causal decision), so its step is forward's route_forward
  // and block over the step's rows (batch = rows, seq = 1). One key/value cache per layer:
  //   unrouted layer        every token writes at its position (the dense stack's decode);
  //   routed, Routed keys   (layer-skip, early exit, causal MoD) only the tokens that run the layer write,
  //                         one cache row after another, so a query sees exactly forward's keys: the
  //                         earlier tokens of its sequence that ran the layer; a skipped token leaves nothing;
  //   routed, AttendToSkipped  every token writes its keys from its current state x_h (a skipped or exited
  //                         token's copied-up state) at its position; only the run tokens query.
  template <class Be>
  static constexpr bool decodes_on = RoutedDecodingSequenceMixerOn<Attn, Be>;
  // Its decode reads the step's rows to the host (DecodeRows): infer::Decoder runs it op by op, not as a CUDA graph.
  static constexpr bool decode_reads_host = true;
  struct DecodePlan {
    Plan plan{};                      // forward's workspace for `rows` tokens of one position
    std::array<index_t, L> k{}, v{};  // caches [slots·max_len × d], one pair per layer
    typename Attn::DecodeSaved attn{};
    index_t fm = 0;      // [rows × d]: a module's output
    index_t counts = 0;  // token_t [L × slots]: the routed caches' fill (Routed keys)
    index_t staged = 0;  // the run rows' slots, positions and cache rows (DecodeRows::stage)
  };
  static constexpr DecodePlan plan_decode(Arena& a, index_t slots, index_t max_len, index_t rows) {
    DecodePlan p{};
    p.plan = Base::plan(a, rows, 1);
    for (int h = 0; h < L; ++h) {
      p.k[h] = a.take(slots * max_len * d);
      p.v[h] = a.take(slots * max_len * d);
    }
    p.attn = Attn::plan_decode(a, rows);
    p.fm = a.take(rows * d);
    if constexpr (!attend_all) p.counts = a.take(dispatch::tok_elems(L * slots));
    p.staged = DecodeRows::take(a, rows);
    return p;
  }

  template <class Be, class T>
  static MatrixView<const T> decode(Be& be, const T* p, T* ws, const DecodePlan& dp, MatrixView<const T> x,
                                    std::span<const index_t> slot, std::span<const index_t> pos, index_t slots,
                                    index_t max_len, std::span<const token_t> /*tokens*/) {
    const index_t rows = x.rows;
    const Plan& plan = dp.plan;
    DecodeRows& host = DecodeRows::begin(be, slot, pos, rows);
    if constexpr (!attend_all) host.load_counts(be, ws, dp.counts, L, slots);
    if constexpr (Cfg::early_exit) be.fill(sp(toks(ws, plan.alive), rows), token_t(1));
    if constexpr (Cfg::early_exit && Cfg::gate_mean) be.fill(sp(ws + plan.ones, rows), T(1));
    const std::span<T> aux = sp(ws + plan.aux, 1);  // the routers' losses, computed as in forward, unused
    be.zero(aux);
    const MatrixView<T> fm = mv(ws + dp.fm, rows, d);
    for (int h = 0; h < L; ++h) {
      const Layer& l = plan.layer[h];
      const T* pa = p + Set::template attention_offset<D>(h);
      const MatrixView<T> kc = mv(ws + dp.k[h], slots * max_len, d), vc = mv(ws + dp.v[h], slots * max_len, d);
      const MatrixView<T> x_next = mv(ws + l.x_next, rows, d);
      if (!routed(h)) {  // as Dense<L>: u = x + Attn(x), x' = u + FFN(u)
        const MatrixView<T> u = mv(ws + l.u, rows, d);
        Attn::decode(be, pa, ws, dp.attn, x, fm, kc, vc, slot, pos, max_len);
        be.add_forward(u.flat(), sp(x.data, rows * d), WorkspaceViews::sp<const T>(fm.data, rows * d));
        Block::forward_residual(be, p, ws, l.ffn, h, MatrixView<const T>(u), x_next, fm, aux);
        x = x_next;
        continue;
      }
      Base::route_forward(be, p, ws, plan, l, h, x, aux, rows, 1);
      be.copy(x_next.flat(), sp(x.data, rows * d));  // x_{h+1} = x_h, then + w·f on the run rows
      const RowGroups g = run_groups(ws, l);
      const auto run_rows = Base::picked(static_cast<const T*>(ws), l, rows, g);
      const MatrixView<T> xg = mv(ws + l.xg, rows, d), u = mv(ws + l.u, rows, d), fo = mv(ws + l.fo, rows, d);
      dispatch::gather(be, run_rows, x, xg);
      if constexpr (attend_all) Attn::decode_keys(be, pa, ws, dp.attn, x, kc, vc, slot, pos, pos, max_len);
      const index_t run = rows_run(be, ws, l, rows, 1);
      if (run > 0) {  // the run rows' sequences, positions and cache rows (host), then their attention
        be.to_host(std::span<token_t>(host.idx.data(), std::size_t(run)), run_rows.token.first(std::size_t(run)));
        host.place(0, run, attend_all ? -1 : h, slots);
        const auto rr = host.stage(be, ws, dp.staged, run);
        const MatrixView<const T> xr(xg.row_block(0, run));
        if constexpr (!attend_all) Attn::decode_keys(be, pa, ws, dp.attn, xr, kc, vc, rr.slot, rr.pos, rr.at, max_len);
        Attn::decode_queries(be, pa, ws, dp.attn, xr, fo.row_block(0, run), MatrixView<const T>(kc),
                             MatrixView<const T>(vc), rr.slot, rr.pos, rr.at, max_len);
      }
      be.add_forward(u, MatrixView<const T>(xg), MatrixView<const T>(fo), g);
      Block::forward_grouped(be, p, ws, l.ffn, h, MatrixView<const T>(u), fo, fm, g);
      dispatch::combine(be, run_rows, MatrixView<const T>(fo), x_next);
      x = x_next;
    }
    if constexpr (!attend_all) host.store_counts(be, ws, dp.counts);
    return x;
  }
};

}  // namespace mom::detail

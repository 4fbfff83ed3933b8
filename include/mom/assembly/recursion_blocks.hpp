#pragma once
// The shared block of a Mixture-of-Recursions recursion (assembly/recursion.hpp), forward and backward side by
// side, in its two layouts:
//   dense    expert choice in training: exactly k_r tokens of every sequence, gathered as `batch` sequences of
//            k_r rows, the block a plain dense stack over them (attention among them: recursion-wise caching)
//   packed   CausalRouting and token choice: a count of run rows known only on the device, one row group
//            {0, count} (core/groups.hpp), attention over the packed rows (their own keys)
// Per layer j of the block: u_j = y_j + Attn_j(y_j), y_{j+1} = u_j + FFN_j(u_j); f = y_B − x̃ (AddBlockOutput:
// y_B); x_next += scatter(w · f). Under KVShare the deeper recursions run packed, their queries attending to
// recursion 0's keys and values of every token (recomputed from recursion 0's saved layer inputs: the same
// values), and recursion 0's backward adds the gradient they send back. E is the executor (its workspace
// layout, types and options).
#include <span>
#include <utility>

#include "mom/assembly/grouped_dispatch.hpp"
#include "mom/routing/dispatch.hpp"
#include "mom/core/groups.hpp"
#include "mom/modules/checked.hpp"

namespace mom::detail {

template <class E>
struct RecursionBlocks : WorkspaceViews {
  using Cfg = typename E::Cfg;
  using Set = typename E::Set;
  using Attn = typename E::Attn;
  using RAttn = typename E::RAttn;
  using Ffn = typename E::Ffn;
  using Block = typename E::Block;
  using Rec = typename E::Rec;
  using LayerWs = typename E::LayerWs;
  using Scratch = typename E::Scratch;
  static constexpr int B = E::B;
  static constexpr index_t d = E::d;
  static constexpr bool unit_weight = E::unit_weight, token = E::token;
  static RowGroups run_groups(const auto* ws, const Rec& R) { return E::run_groups(ws, R); }

  // The shared block over x̃ = x[S_r] as `batch` sequences of kr tokens; x_next += scatter(g · f).
  template <class Be, class T>
  static void block_forward(Be& be, const T* p, T* ws, const Rec& R, MatrixView<const T> x, MatrixView<T> x_next,
                            T* fm_scratch, std::span<T> aux, index_t batch, index_t kr) {
    const index_t m = batch * kr;
    const auto idx = sp<const token_t>(toks(ws, R.idx), m);
    const MatrixView<T> xg = mv(ws + R.xg, m, d), fo = mv(ws + R.fo, m, d), a = mv(fm_scratch, m, d);
    const auto rr = dispatch::picked_rows(idx, unit_weight ? std::span<const T>{} : sp<const T>(ws + R.wsel, m));
    dispatch::gather(be, rr, x, xg);
    MatrixView<const T> y = xg;
    for (int j = 0; j < B; ++j) {
      const LayerWs& l = R.layer[std::size_t(j)];
      const MatrixView<T> u = mv(ws + l.u, m, d), out = j == B - 1 ? fo : mv(ws + l.y, m, d);
      checked<Attn>::forward(be, p + Set::template attention_offset<E::dims>(j), ws, l.attn, y, a, batch, kr);
      be.add_forward(u.flat(), sp(y.data, m * d), sp<const T>(a.data, m * d));
      Block::forward_residual(be, p, ws, l.ffn, j, MatrixView<const T>(u), out, a, aux);
      y = out;
    }
    if constexpr (!Cfg::add_block_output) be.axpy(fo.flat(), T(-1), sp<const T>(xg.data, m * d));  // f = y_B − x̃
    dispatch::combine(be, rr, MatrixView<const T>(fo), x_next);  // eq. (2)
  }

  // df = g · dres[S_r], dw = dres[S_r] · f; back through the B layers; dres += scatter(dL/dx̃).
  template <class Be, class T>
  static void block_backward(Be& be, const T* p, T* g, const T* ws, const Rec& R, MatrixView<T> dres, T* sc,
                             const Scratch& s, index_t batch, index_t kr, const T* dshared = nullptr) {
    const index_t m = batch * kr;
    const auto idx = sp<const token_t>(toks(ws, R.idx), m);
    const MatrixView<T> df = mv(sc + s.df, m, d), dy = mv(sc + s.dy, m, d);
    const std::span<T> dw = sp(sc + s.dw, m);
    const auto rr = dispatch::picked_rows(idx, unit_weight ? std::span<const T>{} : sp<const T>(ws + R.wsel, m));
    dispatch::combine_backward(be, rr, mv<const T>(ws + R.fo, m, d), MatrixView<const T>(dres), df,
                               unit_weight ? std::span<T>{} : dw);
    be.copy(dy.flat(), sp<const T>(df.data, m * d));
    for (int j = B - 1; j >= 0; --j) {  // dy: dL/dy_{j+1} on entry, dL/dy_j on exit
      const LayerWs& l = R.layer[std::size_t(j)];
      const MatrixView<const T> in = j == 0 ? mv<const T>(ws + R.xg, m, d) : mv<const T>(ws + R.layer[std::size_t(j - 1)].y, m, d);
      const index_t oa = Set::template attention_offset<E::dims>(j);
      Block::backward_residual(be, p, g, ws, l.ffn, j, mv<const T>(ws + l.u, m, d), dy, sc + s.module);
      checked<Attn>::backward(be, p + oa, g + oa, ws, l.attn, in, dy, MatrixView<const T>(dy), sc + s.module, batch, kr);
      // KVShare, recursion 0 (every token, in order): the deeper recursions' gradient on this layer's keys
      if (dshared) be.axpy(dy.flat(), T(1), sp<const T>(dshared + j * m * d, m * d));
    }
    if constexpr (!Cfg::add_block_output) be.axpy(dy.flat(), T(-1), sp<const T>(df.data, m * d));  // f = y_B − x̃
    dispatch::gather_backward(be, rr, MatrixView<const T>(dy), dres);
  }

  // The packed layout's key source of layer j under KVShare: recursion 0's input to that layer, every token in
  // order (recursion 0 runs them all); nullptr: the run rows' own keys.
  template <class T>
  static MatrixView<const T> shared_keys(const T* ws, const Rec* shared, int j, index_t n) {
    return mv<const T>(ws + (j == 0 ? shared->xg : shared->layer[std::size_t(j - 1)].y), n, d);
  }

  // The block over the packed run rows (at most `rows`, one row group), attending among them (recursion-wise
  // caching) or, with `shared` (KVShare), to recursion 0's keys and values of every earlier token.
  template <class Be, class T>
  static void block_forward_packed(Be& be, const T* p, T* ws, const Rec& R, MatrixView<const T> x, MatrixView<T> x_next,
                                   T* fm_scratch, index_t rows, index_t seq, const Rec* shared = nullptr) {
    const RowGroups g = run_groups(ws, R);
    const index_t n = x.rows;
    const auto idx = sp<const token_t>(toks(ws, R.idx), rows);
    const MatrixView<T> xg = mv(ws + R.xg, rows, d), fo = mv(ws + R.fo, rows, d), a = mv(fm_scratch, rows, d);
    const auto rr = dispatch::picked_rows(idx, unit_weight && !token ? std::span<const T>{} : sp<const T>(ws + R.wsel, rows), g);
    dispatch::gather(be, rr, x, xg);
    MatrixView<const T> y = xg;
    for (int j = 0; j < B; ++j) {
      const LayerWs& l = R.layer[std::size_t(j)];
      const MatrixView<T> u = mv(ws + l.u, rows, d), out = j == B - 1 ? fo : mv(ws + l.y, rows, d);
      const auto pa = same_for_groups(p + Set::template attention_offset<E::dims>(j));
      if (shared)
        checked<RAttn>::template forward_routed<KeySource::Given>(be, pa, ws, l.gattn, shared_keys(ws, shared, j, n), y, a,
                                                              idx, g, seq);
      else
        checked<RAttn>::template forward_routed<KeySource::Routed>(be, pa, ws, l.gattn, x, y, a, idx, g, seq);
      be.add_forward(u, y, MatrixView<const T>(a), g);
      checked<Ffn>::forward_grouped(be, same_for_groups(p + Block::offset(j)), ws, l.ffn, MatrixView<const T>(u), a, g);
      be.add_forward(out, MatrixView<const T>(u), MatrixView<const T>(a), g);
      y = out;
    }
    if constexpr (!Cfg::add_block_output) be.axpy(fo, T(-1), MatrixView<const T>(xg), g);  // f = y_B − x̃
    dispatch::combine(be, rr, MatrixView<const T>(fo), x_next);
  }

  // The packed block's backward: df = c · dres[S_r], dc = dres[S_r] · f (into s.dw); back through the B layers
  // (each: dL/du = dy + FFNᵀ dy, then dL/dy_j = dL/du + Attnᵀ dL/du, plus dshared_j, the gradient the deeper
  // recursions sent to this layer's keys under KVShare, when this is recursion 0); dres += scatter(dL/dx̃).
  // With `shared` (a deeper recursion under KVShare) the keys' gradient goes to dshared [B × n × d] instead.
  template <class Be, class T>
  static void block_backward_packed(Be& be, const T* p, T* g, const T* ws, const Rec& R, MatrixView<const T> x,
                                    MatrixView<T> dres, T* sc, const Scratch& s, index_t rows, index_t seq,
                                    const Rec* shared = nullptr, T* dshared = nullptr) {
    const RowGroups gr = run_groups(ws, R);
    const index_t n = x.rows;
    const auto idx = sp<const token_t>(toks(ws, R.idx), rows);
    const MatrixView<T> df = mv(sc + s.df, rows, d);
    MatrixView<T> dy = mv(sc + s.dy, rows, d), dz = mv(sc + s.dy2, rows, d);
    const std::span<T> dw = sp(sc + s.dw, rows);
    const auto rr = dispatch::picked_rows(idx, sp<const T>(ws + R.wsel, rows), gr);
    dispatch::combine_backward(be, rr, mv<const T>(ws + R.fo, rows, d), MatrixView<const T>(dres), df, dw);
    be.zero_rows(dy, gr);
    be.axpy(dy, T(1), MatrixView<const T>(df), gr);
    for (int j = B - 1; j >= 0; --j) {  // dy: dL/dy_{j+1} on entry, dL/dy_j on exit
      const LayerWs& l = R.layer[std::size_t(j)];
      const MatrixView<const T> in =
          j == 0 ? mv<const T>(ws + R.xg, rows, d) : mv<const T>(ws + R.layer[std::size_t(j - 1)].y, rows, d);
      const index_t oa = Set::template attention_offset<E::dims>(j), of = Block::offset(j);
      be.zero_rows(dz, gr);
      checked<Ffn>::backward_grouped(be, same_for_groups(p + of), same_for_groups(g + of), ws, l.ffn, mv<const T>(ws + l.u, rows, d),
                            dz, MatrixView<const T>(dy), sc + s.module, gr);
      be.axpy(dy, T(1), MatrixView<const T>(dz), gr);  // dy := dL/du
      be.zero_rows(dz, gr);
      be.axpy(dz, T(1), MatrixView<const T>(dy), gr);
      if (shared)
        checked<RAttn>::template backward_routed<KeySource::Given>(
            be, same_for_groups(p + oa), same_for_groups(g + oa), ws, l.gattn, shared_keys(ws, shared, j, n), in,
            mv(dshared + j * n * d, n, d), dz, MatrixView<const T>(dy), idx, gr, seq, sc + s.module);
      else
        checked<RAttn>::template backward_routed<KeySource::Routed>(be, same_for_groups(p + oa), same_for_groups(g + oa), ws,
                                                            l.gattn, x, in, dres, dz, MatrixView<const T>(dy), idx, gr,
                                                            seq, sc + s.module);
      std::swap(dy, dz);  // dy := dL/dy_j
      if (!shared && dshared) be.axpy(dy, T(1), mv<const T>(dshared + j * n * d, rows, d), gr);
    }
    if constexpr (!Cfg::add_block_output) be.axpy(dy, T(-1), MatrixView<const T>(df), gr);  // f = y_B − x̃
    dispatch::gather_backward(be, rr, MatrixView<const T>(dy), dres);
  }
};

}  // namespace mom::detail

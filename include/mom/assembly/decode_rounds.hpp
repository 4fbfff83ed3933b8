#pragma once
// What the incremental decode of every stack of H rounds "attention, then an FFN half" shares
// (infer/decoder.hpp; the dense / shared stack in sequential.hpp, token-choice MoE in moe.hpp): a key/value
// cache per round (a module used in several rounds keeps one per use) and the new rows' residual stream.
#include <array>
#include <span>
#include <vector>

#include "mom/core/layout.hpp"
#include "mom/core/selection.hpp"
#include "mom/core/tensor.hpp"
#include "mom/modules/module.hpp"

namespace mom::dispatch {

// A host list copied to base + off (backend memory, off in base's elements: an ordered host -> device copy on
// a device backend), returned there: the decoder's slots, positions and tokens for the ops.
template <class Be, class T, class U>
std::span<const U> from_host_at(Be& be, T* base, index_t off, std::span<const U> host) {
  const std::span<U> dev(reinterpret_cast<U*>(base + off), host.size());
  be.from_host(dev, host);
  return dev;
}

}  // namespace mom::dispatch

namespace mom::detail {

template <int H, index_t d>
struct DecodeRounds {
  std::array<index_t, H> k{}, v{};  // caches [slots·max_len × d], one pair per round
  index_t f = 0, u = 0, x = 0;      // [rows × d]: a module's output, u_h, x_{h+1}

  static constexpr DecodeRounds take(Arena& a, index_t slots, index_t max_len, index_t rows) {
    DecodeRounds r{};
    for (int h = 0; h < H; ++h) {
      r.k[h] = a.take(slots * max_len * d);
      r.v[h] = a.take(slots * max_len * d);
    }
    r.f = a.take(rows * d);
    r.u = a.take(rows * d);
    r.x = a.take(rows * d);
    return r;
  }

  // For h = 0..H-1: u = x + Attn_h(x) against round h's cache (eq. (4)), then x = ffn_half(h, u, x_next),
  // which writes x_next from u. attn_offset(h): round h's attention parameters.
  template <class Attn, class Be, class T, class AttnOffset, class FfnHalf>
  MatrixView<const T> run(Be& be, const T* p, T* ws, const typename Attn::DecodeSaved& attn, AttnOffset attn_offset,
                          MatrixView<const T> x, std::span<const index_t> slot, std::span<const index_t> pos,
                          index_t slots, index_t max_len, FfnHalf&& ffn_half) const {
    const index_t rows = x.rows;
    const MatrixView<T> fv{ws + f, rows, d}, uv{ws + u, rows, d}, x_next{ws + this->x, rows, d};
    for (int h = 0; h < H; ++h) {
      const MatrixView<T> kc{ws + k[h], slots * max_len, d}, vc{ws + v[h], slots * max_len, d};
      if constexpr (DecodesResidualOn<Attn, Be, T>) {  // eq. (4) in the attention's output product
        Attn::decode_residual(be, p + attn_offset(h), ws, attn, x, uv, kc, vc, slot, pos, max_len);
      } else {
        Attn::decode(be, p + attn_offset(h), ws, attn, x, fv, kc, vc, slot, pos, max_len);
        be.add_forward(uv.flat(), x.flat(), MatrixView<const T>(fv).flat());  // eq. (4)
      }
      ffn_half(h, MatrixView<const T>(uv), x_next, fv);
      x = x_next;
    }
    return x;
  }
};

// The host side of a routed executor's decode step (MoM, layer-skip, causal Mixture-of-Depths,
// Mixture-of-Recursions): which rows one module or block runs, their sequences, positions and cache rows.
// The decoder hands the step's slot and pos in backend memory (as every op takes them); begin() reads them
// to the host once per step, place() works out a group's rows there, and stage() puts them back into a
// workspace region for the ops (on a device backend an ordered host -> device copy: no wait). A cache that
// holds only the tokens routed to it (phi::MoMRoutedKV, a skip layer's or MoD block's own keys) fills one row
// after another: `counts` [caches × slots] in the decoder's workspace holds how many of a sequence's tokens
// each cache has, restarted when the sequence starts again at position 0. Sized once for the largest step
// (thread_local): no allocation per step after the first.
struct DecodeRows {
  std::vector<token_t> idx, counts;
  std::vector<index_t> slot_of, pos_of;  // the step's rows (host copies of the decoder's slot and pos)
  std::vector<index_t> slot, pos, at;    // the rows place() put together

  // The workspace region stage() writes, for up to `rows` placed rows.
  static constexpr index_t take(Arena& a, index_t rows) { return a.take(dispatch::index_elems(3 * rows)); }

  // The step's rows (slot, pos: backend memory) read to the host; `rows`: the most rows one group places.
  template <class Be>
  static DecodeRows& begin(Be& be, std::span<const index_t> slot, std::span<const index_t> pos, index_t rows) {
    thread_local DecodeRows h;
    for (auto* v : {&h.slot, &h.pos, &h.at}) v->resize(std::size_t(rows));
    h.idx.resize(std::size_t(rows));
    h.slot_of.resize(slot.size());
    h.pos_of.resize(pos.size());
    be.to_host(std::span<index_t>(h.slot_of), slot);
    be.to_host(std::span<index_t>(h.pos_of), pos);
    return h;
  }
  // The counts of `caches` routed caches from the workspace, a slot at position 0 restarted.
  template <class Be, class T>
  void load_counts(Be& be, const T* ws, index_t off, index_t caches, index_t slots) {
    counts.resize(std::size_t(caches * slots));
    be.to_host(std::span<token_t>(counts), std::span<const token_t>(dispatch::toks(ws, off), counts.size()));
    for (std::size_t r = 0; r < slot_of.size(); ++r)
      if (pos_of[r] == 0)
        for (index_t c = 0; c < caches; ++c) counts[std::size_t(c * slots + slot_of[r])] = 0;
  }
  template <class Be, class T>
  void store_counts(Be& be, T* ws, index_t off) const {
    be.from_host(std::span<token_t>(dispatch::toks(ws, off), counts.size()), std::span<const token_t>(counts));
  }
  // The rows idx[o .. o+cnt) (indices into the step's rows, read into `idx` by the caller): their slots
  // and positions, and their cache rows: the position (a cache every token writes, cache < 0) or the next
  // free row of routed cache `cache` (its count advanced).
  void place(index_t o, index_t cnt, index_t cache, index_t slots) {
    for (index_t i = 0; i < cnt; ++i) {
      const auto row = std::size_t(idx[std::size_t(o + i)]);
      slot[std::size_t(i)] = slot_of[row];
      pos[std::size_t(i)] = pos_of[row];
      at[std::size_t(i)] = cache < 0 ? pos_of[row] : counts[std::size_t(cache * slots + slot_of[row])]++;
    }
  }
  // The `cnt` placed rows' slots, positions and cache rows in backend memory (region `off`, from take()),
  // valid until the next stage() into it.
  struct Staged {
    std::span<const index_t> slot, pos, at;
  };
  template <class Be, class T>
  Staged stage(Be& be, T* ws, index_t off, index_t cnt) const {
    index_t* lists = reinterpret_cast<index_t*>(ws + off);  // slot, pos, at: cnt each
    const auto put = [&](index_t i, const std::vector<index_t>& v) {
      return dispatch::from_host_at(be, lists, i * cnt, std::span<const index_t>(v.data(), std::size_t(cnt)));
    };
    return {put(0, slot), put(1, pos), put(2, at)};
  }
};

}  // namespace mom::detail

#pragma once
// What the incremental decode of every stack of H rounds "attention, then an FFN half" shares
// (infer/decoder.hpp; the dense / shared stack in sequential.hpp, token-choice MoE in moe.hpp): a key/value
// cache per round (a module used in several rounds keeps one per use) and the new rows' residual stream.
#include <array>
#include <span>

#include "mom/core/layout.hpp"
#include "mom/core/tensor.hpp"

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
      Attn::decode(be, p + attn_offset(h), ws, attn, x, fv, kc, vc, slot, pos, max_len);
      be.add_forward(uv.flat(), x.flat(), MatrixView<const T>(fv).flat());  // eq. (4)
      ffn_half(h, MatrixView<const T>(uv), x_next, fv);
      x = x_next;
    }
    return x;
  }
};

}  // namespace mom::detail

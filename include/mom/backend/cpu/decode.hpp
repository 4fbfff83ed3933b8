#pragma once
// Incremental decoding ops (infer/decoder.hpp): the key/value cache of one attention use and attention of
// a step's new tokens against it. A cache holds `slots` sequences of up to `max_len` positions:
// row slot·max_len + position of k_cache / v_cache [slots·max_len × d] is that token's key / value.
// A decode step has one new token per active sequence (row r: sequence slot[r] at position pos[r]).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>

#include "mom/backend/cpu/attention.hpp"
#include "mom/backend/cpu/parallel.hpp"
#include "mom/core/check.hpp"
#include "mom/core/tensor.hpp"

namespace mom::cpu {

namespace detail {
inline void check_decode_rows(const char* op, index_t rows, std::span<const index_t> slot, std::span<const index_t> pos,
                              index_t cache_rows, index_t max_len) {
  MOM_CHECK(ssize(slot) == rows && ssize(pos) == rows, op, ": ", slot.size(), " slots and ", pos.size(),
            " positions for ", rows, " rows");
  MOM_CHECK(max_len > 0 && cache_rows % max_len == 0, op, ": cache of ", cache_rows, " rows is not slots x max_len ",
            max_len);
  for (index_t r = 0; r < rows; ++r)
    MOM_CHECK(slot[std::size_t(r)] >= 0 && slot[std::size_t(r)] < cache_rows / max_len && pos[std::size_t(r)] >= 0 &&
                  pos[std::size_t(r)] < max_len,
              op, ": row ", r, " (slot ", slot[std::size_t(r)], ", position ", pos[std::size_t(r)],
              ") is outside the cache of ", cache_rows / max_len, " x ", max_len);
}
struct DecodeScratch;
}  // namespace detail

// Writes the keys and values of a step's rows (qkv [rows × 3d]: q | k | v) into the cache.
template <class T>
void kv_write(MatrixView<T> k_cache, MatrixView<T> v_cache, MatrixView<const T> qkv, std::span<const index_t> slot,
              std::span<const index_t> pos, index_t max_len) {
  const index_t d = k_cache.cols;
  checks::kv_write_shapes<T>(k_cache, v_cache, qkv, ssize(slot), ssize(pos), max_len);
  detail::check_decode_rows("kv_write", qkv.rows, slot, pos, k_cache.rows, max_len);
  for (index_t r = 0; r < qkv.rows; ++r) {
    const index_t at = slot[std::size_t(r)] * max_len + pos[std::size_t(r)];
    std::memcpy(k_cache.row(at), qkv.row(r) + d, std::size_t(d) * sizeof(T));
    std::memcpy(v_cache.row(at), qkv.row(r) + 2 * d, std::size_t(d) * sizeof(T));
  }
}

// out[r] = softmax(q_r · K_{slot r}[0..pos r]ᵀ / sqrt(hd)) · V_{slot r}[0..pos r] per head (the causal
// attention of attention_forward for the row's position, its own key and value included: write them
// with kv_write first).
template <class T>
void attention_decode(MatrixView<T> out, MatrixView<const T> qkv, MatrixView<const T> k_cache,
                      MatrixView<const T> v_cache, std::span<const index_t> slot, std::span<const index_t> pos,
                      index_t max_len, index_t heads) {
  const index_t d = k_cache.cols, rows = qkv.rows;
  checks::decode_shapes<T>("attention_decode", out, qkv, k_cache, v_cache, ssize(slot), ssize(pos), max_len, heads);
  detail::check_decode_rows("attention_decode", rows, slot, pos, k_cache.rows, max_len);
  const index_t hd = d / heads;
  const T scale = T(1) / std::sqrt(T(hd));
#pragma omp parallel if (rows * heads > 1 && rows * max_len * d > (1 << 15))
  {
    T* s = detail::thread_scratch<T, detail::DecodeScratch, 0>(std::size_t(max_len));
#pragma omp for schedule(static)
    for (index_t rh = 0; rh < rows * heads; ++rh) {
      const index_t r = rh / heads, h = rh % heads, len = pos[std::size_t(r)] + 1;
      const T* q = qkv.row(r) + h * hd;
      const index_t base = slot[std::size_t(r)] * max_len;
      T m = -std::numeric_limits<T>::infinity();
      for (index_t j = 0; j < len; ++j) {
        const T* k = k_cache.row(base + j) + h * hd;
        T dot = T(0);
#pragma omp simd reduction(+ : dot)
        for (index_t c = 0; c < hd; ++c) dot += q[c] * k[c];
        s[j] = dot;
        m = std::max(m, dot);
      }
      const T sum = detail::exp_affine(s, len, scale, m * scale);  // s = exp((s - max)·scale)
      T* o = out.row(r) + h * hd;
      std::fill(o, o + hd, T(0));
      for (index_t j = 0; j < len; ++j) {
        const T* v = v_cache.row(base + j) + h * hd;
        const T w = s[j] / sum;
#pragma omp simd
        for (index_t c = 0; c < hd; ++c) o[c] += w * v[c];
      }
    }
  }
}

}  // namespace mom::cpu

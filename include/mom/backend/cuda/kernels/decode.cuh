#pragma once
// Incremental decoding ops (cpu/decode.hpp has the layout and the maths) on the CUDA cores, written for
// correctness first:
// - kv_write: one thread per (row, column) writes the row's key and value into the cache at
//   (slot[r]·max_len + pos[r]); a slot or position outside the cache is reported (the row is skipped).
// - attention_decode: one thread per (row, head) streams the row's cached keys 0 .. pos[r] with an
//   online softmax (running max and sum), padded to HD = 32, 64 or 128 as attention.cuh.
// slot and pos are device arrays.
#include "mom/backend/cuda/kernels/common.cuh"

namespace mom::cuda {

namespace dev {

// The row's slot and position, or false (reported once per row, by its column 0 / head 0) when outside.
__device__ __forceinline__ bool decode_row(const index_t* slot, const index_t* pos, index_t r, index_t slots,
                                          index_t max_len, bool reporter, int* error, DeviceError code) {
  const index_t s = slot[r], p = pos[r];
  if (s >= 0 && s < slots && p >= 0 && p < max_len) return true;
  if (reporter) {
    const bool bad_slot = s < 0 || s >= slots;
    report(error, code, r, bad_slot ? s : p, bad_slot ? slots : max_len);
  }
  return false;
}

template <class T>
__global__ void kv_write_kernel(MatrixView<T> k_cache, MatrixView<T> v_cache, MatrixView<const T> qkv,
                                const index_t* slot, const index_t* pos, index_t max_len, int* error) {
  const index_t d = k_cache.cols, slots = k_cache.rows / max_len;
  MOM_GRID_STRIDE(i, qkv.rows * d) {
    const index_t r = i / d, c = i % d;
    if (!decode_row(slot, pos, r, slots, max_len, c == 0, error, DeviceError::kv_write_position)) continue;
    const index_t at = slot[r] * max_len + pos[r];
    k_cache.data[at * k_cache.ld + c] = qkv.data[r * qkv.ld + d + c];
    v_cache.data[at * v_cache.ld + c] = qkv.data[r * qkv.ld + 2 * d + c];
  }
}

template <class T, int HD>
__global__ void attention_decode_kernel(MatrixView<T> out, MatrixView<const T> qkv, MatrixView<const T> k_cache,
                                        MatrixView<const T> v_cache, const index_t* slot, const index_t* pos,
                                        index_t max_len, index_t heads, index_t hd, T scale, int* error) {
  const index_t rh = index_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (rh >= qkv.rows * heads) return;
  const index_t r = rh / heads, h = rh % heads, slots = k_cache.rows / max_len;
  if (!decode_row(slot, pos, r, slots, max_len, h == 0, error, DeviceError::attention_decode_position)) return;
  const index_t s = slot[r], p = pos[r];
  T q[HD], o[HD];
#pragma unroll
  for (int c = 0; c < HD; ++c) {
    q[c] = c < hd ? qkv.data[r * qkv.ld + h * hd + c] : T(0);
    o[c] = T(0);
  }
  T m = T(0), l = T(0);  // running max of the scaled scores and Σ exp(score − m)
  for (index_t j = 0; j <= p; ++j) {
    const T* k = k_cache.data + (s * max_len + j) * k_cache.ld + h * hd;
    const T* v = v_cache.data + (s * max_len + j) * v_cache.ld + h * hd;
    T z = T(0);
#pragma unroll
    for (int c = 0; c < HD; ++c)
      if (c < hd) z += q[c] * k[c];
    z *= scale;
    const T m_new = j == 0 || z > m ? z : m;
    const T shrink = j == 0 ? T(0) : exp_(m - m_new), w = exp_(z - m_new);
    l = l * shrink + w;
#pragma unroll
    for (int c = 0; c < HD; ++c)
      if (c < hd) o[c] = o[c] * shrink + w * v[c];
    m = m_new;
  }
  T* orow = out.data + r * out.ld + h * hd;
#pragma unroll
  for (int c = 0; c < HD; ++c)
    if (c < hd) orow[c] = o[c] / l;
}

template <class T, int HD>
void attention_decode_hd(const Context& ctx, MatrixView<T> out, MatrixView<const T> qkv, MatrixView<const T> k_cache,
                         MatrixView<const T> v_cache, const index_t* slot, const index_t* pos, index_t max_len,
                         index_t heads, index_t hd) {
  constexpr int per_block = 64;
  launch("attention_decode", ctx, dim3(blocks_exact(qkv.rows * heads, per_block)), per_block,
         attention_decode_kernel<T, HD>, out, qkv, k_cache, v_cache, slot, pos, max_len, heads, hd,
         T(1) / std::sqrt(T(hd)), ctx.error);
}

}  // namespace dev

template <class T>
void Kernels<T>::kv_write(const Context& ctx, M k_cache, M v_cache, CM qkv, const index_t* slot, const index_t* pos,
                          index_t max_len) {
  dev::launch("kv_write", ctx, dev::blocks_for(qkv.rows * k_cache.cols), dev::threads, dev::kv_write_kernel<T>, k_cache,
              v_cache, qkv, slot, pos, max_len, ctx.error);
}
template <class T>
void Kernels<T>::attention_decode(const Context& ctx, M out, CM qkv, CM k_cache, CM v_cache, const index_t* slot,
                                  const index_t* pos, index_t max_len, index_t heads) {
  const index_t hd = k_cache.cols / heads;
  if (hd <= 32) dev::attention_decode_hd<T, 32>(ctx, out, qkv, k_cache, v_cache, slot, pos, max_len, heads, hd);
  else if (hd <= 64) dev::attention_decode_hd<T, 64>(ctx, out, qkv, k_cache, v_cache, slot, pos, max_len, heads, hd);
  else dev::attention_decode_hd<T, 128>(ctx, out, qkv, k_cache, v_cache, slot, pos, max_len, heads, hd);
}

}  // namespace mom::cuda

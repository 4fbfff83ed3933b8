#pragma once
// Incremental decoding ops (cpu/decode.hpp has the layout and the maths) on the CUDA cores:
// - kv_write: one thread per (row, column) writes the row's key and value into the cache at
//   (slot[r]·max_len + pos[r]); a slot or position outside the cache is reported (the row is skipped).
// - attention_decode: one block per (row, head); its warps split the row's cached positions 0 .. pos[r]
//   (online softmax each, merged at the end), their lanes the head's dims, HD = 32, 64 or 128 as
//   attention.cuh.
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

// One block per (row, head) of kDecodeWarps warps. Warp w streams the runs of kDecodeRun consecutive positions
// w·U, (w + W)·U, ... of 0 .. pos[r] (U = kDecodeRun) with its own online softmax (running max m and sum l): the
// U positions of a run are loaded and scored together, so a warp keeps U cache rows in flight instead of one
// (a warp's chain of load, lane sum and exponential per position is what bounds a step at batch 1, where GPT-2
// small's 12 heads give 12 blocks). Its lanes split the head's dims (lane c holds dims c, c + 32, ...: a cache row
// is read coalesced) and a score is the warp's sum of its lanes' products. The warps' (m, l, output) are then
// merged in shared memory: o = Σ_w e^(m_w − M) o_w / Σ_w e^(m_w − M) l_w with M the largest m_w. (The first
// version ran one thread per (row, head) over every position: a batch-1 step of GPT-2 small's shape used 12
// threads of the GPU and took 10.5 ms at context 256, 33 ms at 1024, measured on an H100.)
inline constexpr int kDecodeWarps = 16;
inline constexpr int kDecodeRun = 4;

template <class T, int HD>
__global__ void attention_decode_kernel(MatrixView<T> out, MatrixView<const T> qkv, MatrixView<const T> k_cache,
                                        MatrixView<const T> v_cache, const index_t* slot, const index_t* pos,
                                        index_t max_len, index_t heads, index_t hd, T scale, int* error) {
  constexpr int W = kDecodeWarps, PL = HD / 32;  // warps, dims per lane
  static_assert(kDecodeRun == 4, "attention_decode_kernel sums a run's four weights as a pairwise tree");
  __shared__ T m_w[W], l_w[W], o_w[W][HD];
  const index_t r = index_t(blockIdx.x) / heads, h = index_t(blockIdx.x) % heads, slots = k_cache.rows / max_len;
  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
  // The same answer in every thread of the block: the whole block leaves together.
  if (!decode_row(slot, pos, r, slots, max_len, h == 0 && threadIdx.x == 0, error,
                  DeviceError::attention_decode_position))
    return;
  const index_t s = slot[r], p = pos[r];
  T q[PL], o[PL];
#pragma unroll
  for (int i = 0; i < PL; ++i) {
    const int c = lane + 32 * i;
    q[i] = c < hd ? qkv.data[r * qkv.ld + h * hd + c] : T(0);
    o[i] = T(0);
  }
  constexpr int U = kDecodeRun;
  T m = T(0), l = T(0);  // l = 0 until the warp's first position
  for (index_t j0 = index_t(warp) * U; j0 <= p; j0 += index_t(W) * U) {
    // The run's keys and values first (the loads of its U rows in flight together), then its U scores.
    T kv[U][PL], vv[U][PL], z[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const bool in = j0 + u <= p;
      const index_t at = s * max_len + (in ? j0 + u : j0);  // a row past pos[r]: not read, and no pointer past it
      const T* k = k_cache.data + at * k_cache.ld + h * hd;
      const T* v = v_cache.data + at * v_cache.ld + h * hd;
#pragma unroll
      for (int i = 0; i < PL; ++i) {
        const bool c = in && lane + 32 * i < hd;
        kv[u][i] = c ? k[lane + 32 * i] : T(0);
        vv[u][i] = c ? v[lane + 32 * i] : T(0);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      T dot = T(0);
#pragma unroll
      for (int i = 0; i < PL; ++i) dot += q[i] * kv[u][i];
      z[u] = dot;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) z[u] = warp_sum(z[u]) * scale;
    // Position j0 is in range (the loop's condition); the others of the run only up to pos[r].
    T m_new = l == T(0) || z[0] > m ? z[0] : m;
#pragma unroll
    for (int u = 1; u < U; ++u)
      if (j0 + u <= p && z[u] > m_new) m_new = z[u];
    const T shrink = l == T(0) ? T(0) : exp_(m - m_new);
    T w[U];
#pragma unroll
    for (int u = 0; u < U; ++u) w[u] = j0 + u <= p ? exp_(z[u] - m_new) : T(0);
    l = l * shrink + ((w[0] + w[1]) + (w[2] + w[3]));
#pragma unroll
    for (int i = 0; i < PL; ++i) {
      T acc = o[i] * shrink;
#pragma unroll
      for (int u = 0; u < U; ++u) acc += w[u] * vv[u][i];
      o[i] = acc;
    }
    m = m_new;
  }
  if (lane == 0) {
    m_w[warp] = m;
    l_w[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < PL; ++i) o_w[warp][lane + 32 * i] = o[i];
  __syncthreads();
  if (warp != 0) return;
  T M = T(0);
  bool first = true;
  for (int w = 0; w < W; ++w)
    if (l_w[w] > T(0) && (first || m_w[w] > M)) M = m_w[w], first = false;
  T L = T(0), acc[PL];
#pragma unroll
  for (int i = 0; i < PL; ++i) acc[i] = T(0);
  for (int w = 0; w < W; ++w) {
    if (l_w[w] == T(0)) continue;  // a warp that had no position (pos[r] < w·U)
    const T f = exp_(m_w[w] - M);
    L += l_w[w] * f;
#pragma unroll
    for (int i = 0; i < PL; ++i) acc[i] += o_w[w][lane + 32 * i] * f;
  }
  T* orow = out.data + r * out.ld + h * hd;
#pragma unroll
  for (int i = 0; i < PL; ++i)
    if (lane + 32 * i < hd) orow[lane + 32 * i] = acc[i] / L;
}

template <class T, int HD>
void attention_decode_hd(const Context& ctx, MatrixView<T> out, MatrixView<const T> qkv, MatrixView<const T> k_cache,
                         MatrixView<const T> v_cache, const index_t* slot, const index_t* pos, index_t max_len,
                         index_t heads, index_t hd) {
  launch("attention_decode", ctx, dim3(unsigned(qkv.rows * heads)), kDecodeWarps * 32, attention_decode_kernel<T, HD>,
         out, qkv, k_cache, v_cache, slot, pos, max_len, heads, hd, T(1) / std::sqrt(T(hd)), ctx.error);
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

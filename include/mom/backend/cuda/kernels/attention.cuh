#pragma once
// Dense causal attention on the CUDA cores (cpu/attention.hpp), flash style: SIMT kernels for every
// scalar and head dim <= 128. Float at head dims 64 / 128 under Precision::TF32 / BF16 takes the
// tensor-core kernels of attention_tc.cuh instead (the launchers below ask them first).
#include "mom/backend/cuda/kernels/common.cuh"

namespace mom::cuda {

namespace dev {

// ---- causal attention, flash style ------------------------------------------------------------
//
// Head dimension hd is padded to HD (32, 64 or 128): the padded columns load as 0, so every dot
// product and update runs over HD without per-element guards; only stores check c < hd. Tiles
// are BT rows (one thread per row); the shared memory of a block is ≤ 4 tiles of [BT × HD] (32 KB).
// One thread owns one query row (forward, dQ) or one key row (dK, dV); the other side streams
// through shared memory in tiles, and every thread reads the same streamed row at once (a
// broadcast). Own rows sit in shared memory padded to HD + 1 so that thread t's reads of row t hit
// distinct banks. No [S × S] matrix exists anywhere: forward keeps a running (max, sum) per row
// and saves lse; backward recomputes P = exp(s - lse).

template <class T, int HD>
inline constexpr int attention_tile = std::min(64, 8192 / (HD * int(sizeof(T))));

struct HeadLayout {
  index_t seq, heads, d, hd;
  index_t qkv_ld, out_ld;
};

// Loads rows [r0, r0 + BT) of column block col0 (width hd, padded to HD) of a [seq × *] matrix into
// tile[BT][LD]; rows past seq load as 0.
template <class T, int BT, int HD, int LD>
__device__ __forceinline__ void load_tile(T (*tile)[LD], const T* base, index_t ld, index_t r0, index_t seq,
                                          index_t col0, index_t hd) {
  for (int e = threadIdx.x; e < BT * HD; e += blockDim.x) {
    const int rr = e / HD, c = e % HD;
    const index_t r = r0 + rr;
    tile[rr][c] = (r < seq && c < hd) ? base[r * ld + col0 + c] : T(0);
  }
}

template <class T, int HD>
__global__ void attention_forward_kernel(MatrixView<T> out, T* lse, MatrixView<const T> qkv, HeadLayout L, T scale) {
  constexpr int BT = attention_tile<T, HD>;
  __shared__ T sq[BT][HD + 1];
  __shared__ T sk[BT][HD];
  __shared__ T sv[BT][HD];
  const index_t bh = blockIdx.y, b = bh / L.heads, h = bh % L.heads;
  const index_t i0 = index_t(blockIdx.x) * BT, i = i0 + threadIdx.x;
  const T* base = qkv.data + b * L.seq * L.qkv_ld;
  load_tile<T, BT, HD, HD + 1>(sq, base, L.qkv_ld, i0, L.seq, h * L.hd, L.hd);
  T o[HD];
#pragma unroll
  for (int c = 0; c < HD; ++c) o[c] = T(0);
  T m = neg_inf<T>(), l = T(0);
  const index_t last = min(L.seq, i0 + BT) - 1;  // the tile's last query: keys [0, last] matter
  for (index_t j0 = 0; j0 <= last; j0 += BT) {
    __syncthreads();
    load_tile<T, BT, HD, HD>(sk, base, L.qkv_ld, j0, L.seq, L.d + h * L.hd, L.hd);
    load_tile<T, BT, HD, HD>(sv, base, L.qkv_ld, j0, L.seq, 2 * L.d + h * L.hd, L.hd);
    __syncthreads();
    if (i >= L.seq) continue;
    const int jn = static_cast<int>(min(index_t(BT), i - j0 + 1));  // causal: keys j <= i
    for (int jj = 0; jj < jn; ++jj) {
      T s = T(0);
#pragma unroll
      for (int c = 0; c < HD; ++c) s += sq[threadIdx.x][c] * sk[jj][c];
      s *= scale;
      if (s > m) {  // online softmax: rescale what was accumulated under the old max
        const T corr = exp_(m - s);
        l *= corr;
#pragma unroll
        for (int c = 0; c < HD; ++c) o[c] *= corr;
        m = s;
      }
      const T p = exp_(s - m);
      l += p;
#pragma unroll
      for (int c = 0; c < HD; ++c) o[c] += p * sv[jj][c];
    }
  }
  if (i >= L.seq) return;
  const T inv = T(1) / l;
  T* orow = out.data + (b * L.seq + i) * L.out_ld + h * L.hd;
#pragma unroll
  for (int c = 0; c < HD; ++c)
    if (c < L.hd) orow[c] = o[c] * inv;
  lse[bh * L.seq + i] = m + log_(l);
}

// dQ: thread = query i; streams key tiles. dS_ij = P_ij (dO_i·v_j - D_i), D_i = dO_i·O_i;
// dq_i += scale Σ_j dS_ij k_j.
template <class T, int HD>
__global__ void attention_backward_dq_kernel(MatrixView<T> dqkv, MatrixView<const T> dout, MatrixView<const T> out,
                                             const T* lse, MatrixView<const T> qkv, HeadLayout L, T scale,
                                             index_t dqkv_ld, index_t dout_ld) {
  constexpr int BT = attention_tile<T, HD>;
  __shared__ T sq[BT][HD + 1];
  __shared__ T sdo[BT][HD + 1];
  __shared__ T sk[BT][HD];
  __shared__ T sv[BT][HD];
  const index_t bh = blockIdx.y, b = bh / L.heads, h = bh % L.heads;
  const index_t i0 = index_t(blockIdx.x) * BT, i = i0 + threadIdx.x;
  const T* base = qkv.data + b * L.seq * L.qkv_ld;
  load_tile<T, BT, HD, HD + 1>(sq, base, L.qkv_ld, i0, L.seq, h * L.hd, L.hd);
  load_tile<T, BT, HD, HD + 1>(sdo, dout.data + b * L.seq * dout_ld, dout_ld, i0, L.seq, h * L.hd, L.hd);
  __syncthreads();
  T di = T(0), row_lse = T(0);
  if (i < L.seq) {
    const T* orow = out.data + (b * L.seq + i) * L.out_ld + h * L.hd;
    for (index_t c = 0; c < L.hd; ++c) di += sdo[threadIdx.x][c] * orow[c];
    row_lse = lse[bh * L.seq + i];
  }
  T dq[HD];
#pragma unroll
  for (int c = 0; c < HD; ++c) dq[c] = T(0);
  const index_t last = min(L.seq, i0 + BT) - 1;
  for (index_t j0 = 0; j0 <= last; j0 += BT) {
    __syncthreads();
    load_tile<T, BT, HD, HD>(sk, base, L.qkv_ld, j0, L.seq, L.d + h * L.hd, L.hd);
    load_tile<T, BT, HD, HD>(sv, base, L.qkv_ld, j0, L.seq, 2 * L.d + h * L.hd, L.hd);
    __syncthreads();
    if (i >= L.seq) continue;
    const int jn = static_cast<int>(min(index_t(BT), i - j0 + 1));
    for (int jj = 0; jj < jn; ++jj) {
      T s = T(0), dp = T(0);
#pragma unroll
      for (int c = 0; c < HD; ++c) {
        s += sq[threadIdx.x][c] * sk[jj][c];
        dp += sdo[threadIdx.x][c] * sv[jj][c];
      }
      const T p = exp_(s * scale - row_lse);
      const T ds = p * (dp - di);
#pragma unroll
      for (int c = 0; c < HD; ++c) dq[c] += ds * sk[jj][c];
    }
  }
  if (i >= L.seq) return;
  T* drow = dqkv.data + (b * L.seq + i) * dqkv_ld + h * L.hd;
#pragma unroll
  for (int c = 0; c < HD; ++c)
    if (c < L.hd) drow[c] += scale * dq[c];
}

// dK, dV: thread = key j; streams query tiles i >= j. dv_j += Σ_i P_ij dO_i, dk_j += scale Σ_i dS_ij q_i.
template <class T, int HD>
__global__ void attention_backward_dkdv_kernel(MatrixView<T> dqkv, MatrixView<const T> dout, MatrixView<const T> out,
                                               const T* lse, MatrixView<const T> qkv, HeadLayout L, T scale,
                                               index_t dqkv_ld, index_t dout_ld) {
  constexpr int BT = attention_tile<T, HD>;
  __shared__ T sk[BT][HD + 1];
  __shared__ T sv[BT][HD + 1];
  __shared__ T sq[BT][HD];
  __shared__ T sdo[BT][HD];
  __shared__ T slse[BT], sd[BT];
  const index_t bh = blockIdx.y, b = bh / L.heads, h = bh % L.heads;
  const index_t j0 = index_t(blockIdx.x) * BT, j = j0 + threadIdx.x;
  const T* base = qkv.data + b * L.seq * L.qkv_ld;
  const T* dbase = dout.data + b * L.seq * dout_ld;
  load_tile<T, BT, HD, HD + 1>(sk, base, L.qkv_ld, j0, L.seq, L.d + h * L.hd, L.hd);
  load_tile<T, BT, HD, HD + 1>(sv, base, L.qkv_ld, j0, L.seq, 2 * L.d + h * L.hd, L.hd);
  T dk[HD], dv[HD];
#pragma unroll
  for (int c = 0; c < HD; ++c) dk[c] = dv[c] = T(0);
  for (index_t i0 = j0; i0 < L.seq; i0 += BT) {  // query tiles at or after this key tile
    __syncthreads();
    load_tile<T, BT, HD, HD>(sq, base, L.qkv_ld, i0, L.seq, h * L.hd, L.hd);
    load_tile<T, BT, HD, HD>(sdo, dbase, dout_ld, i0, L.seq, h * L.hd, L.hd);
    __syncthreads();
    {  // thread t prepares D and lse of query row i0 + t
      const index_t i = i0 + threadIdx.x;
      T di = T(0), l = T(0);
      if (i < L.seq) {
        const T* orow = out.data + (b * L.seq + i) * L.out_ld + h * L.hd;
        for (index_t c = 0; c < L.hd; ++c) di += sdo[threadIdx.x][c] * orow[c];
        l = lse[bh * L.seq + i];
      }
      sd[threadIdx.x] = di;
      slse[threadIdx.x] = l;
    }
    __syncthreads();
    if (j >= L.seq) continue;
    const int in = static_cast<int>(min(index_t(BT), L.seq - i0));
    for (int ii = 0; ii < in; ++ii) {
      if (i0 + ii < j) continue;  // causal: only queries i >= j see key j
      T s = T(0), dp = T(0);
#pragma unroll
      for (int c = 0; c < HD; ++c) {
        s += sq[ii][c] * sk[threadIdx.x][c];
        dp += sdo[ii][c] * sv[threadIdx.x][c];
      }
      const T p = exp_(s * scale - slse[ii]);
      const T ds = p * (dp - sd[ii]);
#pragma unroll
      for (int c = 0; c < HD; ++c) {
        dv[c] += p * sdo[ii][c];
        dk[c] += ds * sq[ii][c];
      }
    }
  }
  if (j >= L.seq) return;
  T* krow = dqkv.data + (b * L.seq + j) * dqkv_ld + L.d + h * L.hd;
  T* vrow = krow + L.d;
#pragma unroll
  for (int c = 0; c < HD; ++c)
    if (c < L.hd) {
      krow[c] += scale * dk[c];
      vrow[c] += dv[c];
    }
}

}  // namespace dev

// ---- launchers --------------------------------------------------------------------------------

namespace dev {
// The tensor-core path (attention_tc.cuh, included by mom_cuda.cu): false when it does not apply
// (double, Precision::FP32, head dims other than 64 and 128), and the SIMT kernels run instead.
template <class T>
bool attention_tc_forward(const Context& ctx, MatrixView<T> out, T* lse, MatrixView<const T> qkv, HeadLayout L,
                          index_t batch);
template <class T>
bool attention_tc_backward(const Context& ctx, MatrixView<T> dqkv, MatrixView<const T> dout, MatrixView<const T> out,
                           const T* lse, MatrixView<const T> qkv, HeadLayout L, index_t batch);

template <class T, int HD>
void attention_forward_hd(const Context& ctx, MatrixView<T> out, T* lse, MatrixView<const T> qkv, HeadLayout L,
                          index_t batch) {
  constexpr int BT = attention_tile<T, HD>;
  const dim3 grid(static_cast<unsigned>((L.seq + BT - 1) / BT), static_cast<unsigned>(batch * L.heads));
  launch("attention_forward", ctx, grid, BT, attention_forward_kernel<T, HD>, out, lse, qkv, L,
         T(1) / std::sqrt(T(L.hd)));
}
template <class T, int HD>
void attention_backward_hd(const Context& ctx, MatrixView<T> dqkv, MatrixView<const T> dout, MatrixView<const T> out,
                           const T* lse, MatrixView<const T> qkv, HeadLayout L, index_t batch) {
  constexpr int BT = attention_tile<T, HD>;
  const dim3 grid(static_cast<unsigned>((L.seq + BT - 1) / BT), static_cast<unsigned>(batch * L.heads));
  const T scale = T(1) / std::sqrt(T(L.hd));
  launch("attention_backward", ctx, grid, BT, attention_backward_dq_kernel<T, HD>, dqkv, dout, out, lse, qkv, L, scale,
         dqkv.ld, dout.ld);
  launch("attention_backward", ctx, grid, BT, attention_backward_dkdv_kernel<T, HD>, dqkv, dout, out, lse, qkv, L,
         scale, dqkv.ld, dout.ld);
}
}  // namespace dev

template <class T>
void Kernels<T>::attention_forward(const Context& ctx, M out, T* lse, CM qkv, index_t batch, index_t seq,
                                   index_t heads) {
  const index_t d = qkv.cols / 3, hd = d / heads;
  const dev::HeadLayout L{seq, heads, d, hd, qkv.ld, out.ld};
  if (dev::attention_tc_forward<T>(ctx, out, lse, qkv, L, batch)) return;
  if (hd <= 32) dev::attention_forward_hd<T, 32>(ctx, out, lse, qkv, L, batch);
  else if (hd <= 64) dev::attention_forward_hd<T, 64>(ctx, out, lse, qkv, L, batch);
  else dev::attention_forward_hd<T, 128>(ctx, out, lse, qkv, L, batch);
}
template <class T>
void Kernels<T>::attention_backward(const Context& ctx, M dqkv, CM dout, CM out, const T* lse, CM qkv, index_t batch,
                                    index_t seq, index_t heads) {
  const index_t d = qkv.cols / 3, hd = d / heads;
  const dev::HeadLayout L{seq, heads, d, hd, qkv.ld, out.ld};
  if (dev::attention_tc_backward<T>(ctx, dqkv, dout, out, lse, qkv, L, batch)) return;
  if (hd <= 32) dev::attention_backward_hd<T, 32>(ctx, dqkv, dout, out, lse, qkv, L, batch);
  else if (hd <= 64) dev::attention_backward_hd<T, 64>(ctx, dqkv, dout, out, lse, qkv, L, batch);
  else dev::attention_backward_hd<T, 128>(ctx, dqkv, dout, out, lse, qkv, L, batch);
}

}  // namespace mom::cuda

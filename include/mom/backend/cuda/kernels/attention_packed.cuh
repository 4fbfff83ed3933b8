#pragma once
// Packed and grouped causal attention (routed assembly; cpu/routing.hpp, cpu/grouped.hpp): the
// packed op is the grouped op with one group, so both run the kernels here (SIMT; float at head dims
// 64 / 128 under Precision::TF32 / BF16 takes the tensor-core kernels of attention_packed_tc.cuh).
#include "mom/backend/cuda/kernels/attention.cuh"

namespace mom::cuda {

namespace dev {

// ---- packed and grouped causal attention (routed assembly; cpu/routing.hpp, cpu/grouped.hpp) -----
//
// Packed: query row i is token q_tok[i] (ascending); it attends to the key rows j of the same
// sequence with token k_tok[j] <= q_tok[i] (k_tok null: key row j is token j) — one contiguous key
// range per query, found by binary search. Grouped (core/groups.hpp): the same within each row
// group g = query rows [offsets[g], offsets[g+1]), whose keys are group g's own matrices k[g], v[g]
// (k_tok null: all their kv_rows rows, row t = token t; k_tok given: the rows of g's own row range).
// The packed op is the grouped op with one group (offsets null: queries [0, nq), keys [0, nk)), so
// both run these kernels. The offsets stay in device memory: each thread finds its row's group by
// binary search (the host never learns the group sizes), and the grids are sized from host bounds.
//
// A tile may straddle two sequences or groups: the block walks the tile's groups in row order
// (a group's rows are consecutive), streams the union of that group's rows' ranges from that
// group's matrices, and each thread skips other groups and keys outside its own range. lse is
// [nq × heads] (row i, head h); a query without keys gets lse = -inf and a zero row.

struct PackedLayout {
  index_t nq;  // query rows (grouped: the bound of the offsets)
  index_t nk;  // key rows: packed k.rows; grouped without k_tok kv_rows (per group), with k_tok nq
  index_t seq, heads, hd;
  const token_t* q_tok;
  const token_t* k_tok;    // null: key row j is token j
  const token_t* offsets;  // null: one group (the packed op); else count + 1 row offsets (device)
  int count;               // groups (1 without offsets)
};

// Rows at data, ld apart (one group's key or value matrix, or a gradient of one).
template <class U>
struct RowsAt {
  U* data;
  index_t ld;
  __device__ __forceinline__ U* row(index_t r) const { return data + r * ld; }
};
// The packed op's keys and values (or their gradients): the same matrices for every row.
template <class U>
struct OneKV {
  U* k;
  index_t k_ld;
  U* v;
  index_t v_ld;
  __device__ __forceinline__ RowsAt<U> keys(int) const { return {k, k_ld}; }
  __device__ __forceinline__ RowsAt<U> values(int) const { return {v, v_ld}; }
};
// The grouped op's: group g's at k[g], v[g] (PerGroup tables, kernel parameters), rows ld apart.
template <class U>
struct GroupKV {
  PerGroup<U> k, v;
  index_t ld;
  __device__ __forceinline__ RowsAt<U> keys(int g) const { return {k.base + k.at[std::size_t(g)], ld}; }
  __device__ __forceinline__ RowsAt<U> values(int g) const { return {v.base + v.at[std::size_t(g)], ld}; }
};

__device__ __forceinline__ index_t clamp_rows(index_t r, index_t n) { return r < 0 ? 0 : (r > n ? n : r); }
// Rows [b, e) of group g in a row space of n rows; clamped, so that bad offsets (reported by
// check_offsets) never index out of bounds.
__device__ __forceinline__ void group_rows(const PackedLayout& L, int g, index_t n, index_t& b, index_t& e) {
  if (!L.offsets) {
    b = 0, e = n;
    return;
  }
  b = clamp_rows(L.offsets[g], n);
  e = max(b, clamp_rows(L.offsets[g + 1], n));
}
// The rows [offsets[0], offsets[count]) of all groups.
__device__ __forceinline__ void grouped_span(const PackedLayout& L, index_t n, index_t& b, index_t& e) {
  if (!L.offsets) {
    b = 0, e = n;
    return;
  }
  b = clamp_rows(L.offsets[0], n);
  e = max(b, clamp_rows(L.offsets[L.count], n));
}
// The group of a row r in the span: the last g < count with offsets[g] <= r (skips empty groups).
__device__ __forceinline__ int group_of(const PackedLayout& L, index_t r) {
  if (!L.offsets) return 0;
  int lo = 0, hi = L.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (L.offsets[mid] <= r) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}
// Offsets must be non-decreasing in [0, nq] (the CPU checks this on the host; here the first bad
// entry is reported and the clamping above keeps every access in bounds).
__device__ __forceinline__ void check_offsets(const PackedLayout& L, int* error) {
  for (int g = threadIdx.x; g <= L.count; g += blockDim.x) {
    const index_t o = L.offsets[g];
    if (o < 0 || o > L.nq || (g > 0 && o < L.offsets[g - 1])) report(error, DeviceError::group_offsets, g, o, L.nq);
  }
}

// First index in sorted v[0, n) with v[i] >= x (lower) / v[i] > x (upper).
__device__ __forceinline__ index_t lower_idx(const token_t* v, index_t n, index_t x) {
  index_t lo = 0, hi = n;
  while (lo < hi) {
    const index_t mid = (lo + hi) / 2;
    if (v[mid] < x) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}
__device__ __forceinline__ index_t upper_idx(const token_t* v, index_t n, index_t x) {
  index_t lo = 0, hi = n;
  while (lo < hi) {
    const index_t mid = (lo + hi) / 2;
    if (v[mid] <= x) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}
// Key rows [lo, hi) of group g visible to a query at token t.
__device__ __forceinline__ void packed_key_range(const PackedLayout& L, int g, index_t t, index_t& lo, index_t& hi) {
  const index_t first = (t / L.seq) * L.seq;
  if (!L.k_tok) {
    lo = first, hi = t + 1;
    return;
  }
  index_t b, e;
  group_rows(L, g, L.nk, b, e);
  lo = b + lower_idx(L.k_tok + b, e - b, first);
  hi = b + upper_idx(L.k_tok + b, e - b, t);
}
// Query rows [lo, hi) of group g that see a key at token t.
__device__ __forceinline__ void packed_query_range(const PackedLayout& L, int g, index_t t, index_t& lo, index_t& hi) {
  index_t b, e;
  group_rows(L, g, L.nq, b, e);
  lo = b + lower_idx(L.q_tok + b, e - b, t);
  hi = b + upper_idx(L.q_tok + b, e - b, (t / L.seq) * L.seq + L.seq - 1);
}
// Query row i's group (-1 outside the groups' span [rb, re)) and its key range [lo, hi) (empty for a row out of
// causal order or out of bounds, which head 0 reports: the position within the group, as the CPU's per-group check).
__device__ __forceinline__ int packed_query_row(const PackedLayout& L, index_t i, index_t rb, index_t re, index_t h,
                                                int* error, index_t& lo, index_t& hi) {
  lo = hi = 0;
  if (i < rb || i >= re) return -1;
  const int g = group_of(L, i);
  index_t gb, ge;
  group_rows(L, g, L.nq, gb, ge);
  const index_t t = L.q_tok[i];
  if ((i > gb && L.q_tok[i - 1] >= t) || t < 0 || (!L.k_tok && t >= L.nk)) {
    if (h == 0) report(error, DeviceError::packed_positions, i - gb, t, L.nk);
  } else {
    packed_key_range(L, g, t, lo, hi);
  }
  return g;
}
// Key row j's group (-1 outside [rb, re); block_group when the block has one) and the range [lo, hi) of query rows
// that see it.
__device__ __forceinline__ int packed_key_row(const PackedLayout& L, index_t j, index_t rb, index_t re, int block_group,
                                              index_t& lo, index_t& hi) {
  lo = hi = 0;
  if (j < rb || j >= re) return -1;
  const int g = block_group >= 0 ? block_group : group_of(L, j);
  packed_query_range(L, g, L.k_tok ? L.k_tok[j] : j, lo, hi);
  return g;
}
// The key rows of a dK / dV block of `tile` rows (blockIdx.x): with k_tok the packed key rows from j0 (the groups'
// span [rb, re)); without, block x is (group, key tile) = (x / tiles, x % tiles) over every group's own nk keys
// (block_group; [rb, re) = [0, nk)). False when the block has no key of a group to work on.
__device__ __forceinline__ bool packed_key_block(const PackedLayout& L, int tile, index_t& j0, index_t& rb, index_t& re,
                                                 int& block_group) {
  block_group = -1;
  if (L.k_tok) {
    j0 = index_t(blockIdx.x) * tile;
    grouped_span(L, L.nk, rb, re);
  } else {
    const index_t tiles = (L.nk + tile - 1) / tile;
    block_group = static_cast<int>(blockIdx.x / tiles);
    j0 = (index_t(blockIdx.x) % tiles) * tile;
    group_rows(L, block_group, L.nq, rb, re);
    if (rb >= re) return false;  // an empty group: its keys get no gradient
    rb = 0, re = L.nk;
  }
  return j0 < re && j0 + tile > rb;
}
// The union [ulo, uhi) of the ranges s_lo[t], s_hi[t] of the tile's threads a <= t < e.
__device__ __forceinline__ void range_union(const index_t* s_lo, const index_t* s_hi, int a, int e, index_t& ulo,
                                            index_t& uhi) {
  ulo = std::numeric_limits<index_t>::max();
  uhi = 0;
  for (int t = a; t < e; ++t)
    if (s_lo[t] < s_hi[t]) {
      ulo = min(ulo, s_lo[t]);
      uhi = max(uhi, s_hi[t]);
    }
  if (uhi == 0) ulo = 0;
}
// The end of the run of equal groups starting at tile row a (a group's rows are consecutive).
template <int BT>
__device__ __forceinline__ int group_run_end(const int* s_g, int a) {
  int e = a + 1;
  while (e < BT && s_g[e] == s_g[a]) ++e;
  return e;
}
// Loads rows [r0, r0 + BT) (rows >= rows load as 0) of column block col0 (width hd, padded to HD).
template <class T, int BT, int HD, int LD>
__device__ __forceinline__ void load_rows(T (*tile)[LD], RowsAt<const T> m, index_t r0, index_t rows, index_t col0,
                                          index_t hd) {
  for (int e = threadIdx.x; e < BT * HD; e += blockDim.x) {
    const int rr = e / HD, c = e % HD;
    const index_t r = r0 + rr;
    tile[rr][c] = (r < rows && c < hd) ? m.row(r)[col0 + c] : T(0);
  }
}

template <class T, int HD, class KV>
__global__ void attention_packed_forward_kernel(MatrixView<T> out, T* lse, MatrixView<const T> q, KV kv,
                                                PackedLayout L, T scale, int* error) {
  constexpr int BT = attention_tile<T, HD>;
  __shared__ T sq[BT][HD + 1];
  __shared__ T sk[BT][HD];
  __shared__ T sv[BT][HD];
  __shared__ index_t s_lo[BT], s_hi[BT];
  __shared__ int s_g[BT];
  const index_t h = blockIdx.y, col0 = h * L.hd;
  const index_t i0 = index_t(blockIdx.x) * BT, i = i0 + threadIdx.x;
  if (L.offsets && blockIdx.x == 0 && h == 0) check_offsets(L, error);
  index_t rb, re;
  grouped_span(L, L.nq, rb, re);
  if (i0 >= re || i0 + BT <= rb) return;  // no row of the tile is in a group (the whole block)
  load_rows<T, BT, HD, HD + 1>(sq, {q.data, q.ld}, i0, re, col0, L.hd);
  index_t lo, hi;
  const int g = packed_query_row(L, i, rb, re, h, error, lo, hi);
  s_g[threadIdx.x] = g;
  s_lo[threadIdx.x] = lo;
  s_hi[threadIdx.x] = hi;
  __syncthreads();
  T o[HD];
#pragma unroll
  for (int c = 0; c < HD; ++c) o[c] = T(0);
  T m = neg_inf<T>(), l = T(0);
  for (int a = 0, e = 0; a < BT; a = e) {  // the tile's groups (every thread runs every pass)
    e = group_run_end<BT>(s_g, a);
    const int gg = s_g[a];
    if (gg < 0) continue;
    index_t ulo, uhi;
    range_union(s_lo, s_hi, a, e, ulo, uhi);
    const RowsAt<const T> K = kv.keys(gg), V = kv.values(gg);
    for (index_t j0 = ulo; j0 < uhi; j0 += BT) {
      __syncthreads();
      load_rows<T, BT, HD, HD>(sk, K, j0, uhi, col0, L.hd);
      load_rows<T, BT, HD, HD>(sv, V, j0, uhi, col0, L.hd);
      __syncthreads();
      if (g != gg) continue;
      for (int jj = 0; jj < BT; ++jj) {
        const index_t j = j0 + jj;
        if (j < lo || j >= hi) continue;
        T s = T(0);
#pragma unroll
        for (int c = 0; c < HD; ++c) s += sq[threadIdx.x][c] * sk[jj][c];
        s *= scale;
        if (s > m) {
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
  }
  if (g < 0) return;  // rows outside every group are untouched
  const T inv = l > T(0) ? T(1) / l : T(0);
  T* orow = out.data + i * out.ld + col0;
#pragma unroll
  for (int c = 0; c < HD; ++c)
    if (c < L.hd) orow[c] = o[c] * inv;
  lse[i * L.heads + h] = l > T(0) ? m + log_(l) : neg_inf<T>();
}

template <class T, int HD, class KV>
__global__ void attention_packed_backward_dq_kernel(MatrixView<T> dq, MatrixView<const T> dout, MatrixView<const T> out,
                                                    const T* lse, MatrixView<const T> q, KV kv, PackedLayout L,
                                                    T scale) {
  constexpr int BT = attention_tile<T, HD>;
  __shared__ T sq[BT][HD + 1];
  __shared__ T sdo[BT][HD + 1];
  __shared__ T sk[BT][HD];
  __shared__ T sv[BT][HD];
  __shared__ index_t s_lo[BT], s_hi[BT];
  __shared__ int s_g[BT];
  const index_t h = blockIdx.y, col0 = h * L.hd;
  const index_t i0 = index_t(blockIdx.x) * BT, i = i0 + threadIdx.x;
  index_t rb, re;
  grouped_span(L, L.nq, rb, re);
  if (i0 >= re || i0 + BT <= rb) return;
  load_rows<T, BT, HD, HD + 1>(sq, {q.data, q.ld}, i0, re, col0, L.hd);
  load_rows<T, BT, HD, HD + 1>(sdo, {dout.data, dout.ld}, i0, re, col0, L.hd);
  int g = -1;
  index_t lo = 0, hi = 0;
  T di = T(0), row_lse = T(0);
  if (i >= rb && i < re) {
    g = group_of(L, i);
    row_lse = lse[i * L.heads + h];
    if (row_lse != neg_inf<T>()) packed_key_range(L, g, L.q_tok[i], lo, hi);
  }
  s_g[threadIdx.x] = g;
  s_lo[threadIdx.x] = lo;
  s_hi[threadIdx.x] = hi;
  __syncthreads();
  if (g >= 0)
    for (index_t c = 0; c < L.hd; ++c) di += sdo[threadIdx.x][c] * out.data[i * out.ld + col0 + c];
  T acc[HD];
#pragma unroll
  for (int c = 0; c < HD; ++c) acc[c] = T(0);
  for (int a = 0, e = 0; a < BT; a = e) {
    e = group_run_end<BT>(s_g, a);
    const int gg = s_g[a];
    if (gg < 0) continue;
    index_t ulo, uhi;
    range_union(s_lo, s_hi, a, e, ulo, uhi);
    const RowsAt<const T> K = kv.keys(gg), V = kv.values(gg);
    for (index_t j0 = ulo; j0 < uhi; j0 += BT) {
      __syncthreads();
      load_rows<T, BT, HD, HD>(sk, K, j0, uhi, col0, L.hd);
      load_rows<T, BT, HD, HD>(sv, V, j0, uhi, col0, L.hd);
      __syncthreads();
      if (g != gg) continue;
      for (int jj = 0; jj < BT; ++jj) {
        const index_t j = j0 + jj;
        if (j < lo || j >= hi) continue;
        T s = T(0), dp = T(0);
#pragma unroll
        for (int c = 0; c < HD; ++c) {
          s += sq[threadIdx.x][c] * sk[jj][c];
          dp += sdo[threadIdx.x][c] * sv[jj][c];
        }
        const T ds = exp_(s * scale - row_lse) * (dp - di);
#pragma unroll
        for (int c = 0; c < HD; ++c) acc[c] += ds * sk[jj][c];
      }
    }
  }
  if (g < 0 || lo >= hi) return;
  T* drow = dq.data + i * dq.ld + col0;
#pragma unroll
  for (int c = 0; c < HD; ++c)
    if (c < L.hd) drow[c] += scale * acc[c];
}

// One thread per key row. With k_tok the key rows are packed like the queries (grouped: the same
// row groups), so blocks tile them and look the group up per row; without k_tok every group has
// its own keys 0 .. nk, and block x is (group, key tile) = (x / tiles, x % tiles). Different
// groups' gradient rows are disjoint either way, so the accumulation needs no atomics.
template <class T, int HD, class KV, class DKV>
__global__ void attention_packed_backward_dkdv_kernel(DKV dkv, MatrixView<const T> dout, MatrixView<const T> out,
                                                      const T* lse, MatrixView<const T> q, KV kv, PackedLayout L,
                                                      T scale) {
  constexpr int BT = attention_tile<T, HD>;
  __shared__ T sk[BT][HD + 1];
  __shared__ T sv[BT][HD + 1];
  __shared__ T sq[BT][HD];
  __shared__ T sdo[BT][HD];
  __shared__ T slse[BT], sd[BT];
  __shared__ index_t s_lo[BT], s_hi[BT];
  __shared__ int s_g[BT];
  const index_t h = blockIdx.y, col0 = h * L.hd;
  int block_group;  // the block's group (without k_tok)
  index_t j0, rb, re;
  if (!packed_key_block(L, BT, j0, rb, re, block_group)) return;
  const index_t j = j0 + threadIdx.x;
  index_t lo, hi;
  const int g = packed_key_row(L, j, rb, re, block_group, lo, hi);
  s_g[threadIdx.x] = g;
  s_lo[threadIdx.x] = lo;
  s_hi[threadIdx.x] = hi;
  __syncthreads();
  for (int e = threadIdx.x; e < BT * HD; e += blockDim.x) {  // own tile: row rr from its group's matrices
    const int rr = e / HD, c = e % HD, gr = s_g[rr];
    const bool in = gr >= 0 && c < L.hd;
    sk[rr][c] = in ? kv.keys(gr).row(j0 + rr)[col0 + c] : T(0);
    sv[rr][c] = in ? kv.values(gr).row(j0 + rr)[col0 + c] : T(0);
  }
  T gk[HD], gv[HD];
#pragma unroll
  for (int c = 0; c < HD; ++c) gk[c] = gv[c] = T(0);
  for (int a = 0, e = 0; a < BT; a = e) {
    e = group_run_end<BT>(s_g, a);
    if (s_g[a] < 0) continue;
    index_t ulo, uhi;
    range_union(s_lo, s_hi, a, e, ulo, uhi);
    for (index_t i0 = ulo; i0 < uhi; i0 += BT) {
      __syncthreads();
      load_rows<T, BT, HD, HD>(sq, {q.data, q.ld}, i0, uhi, col0, L.hd);
      load_rows<T, BT, HD, HD>(sdo, {dout.data, dout.ld}, i0, uhi, col0, L.hd);
      __syncthreads();
      {  // thread t prepares D and lse of query row i0 + t
        const index_t i = i0 + threadIdx.x;
        T di = T(0), l = neg_inf<T>();
        if (i < uhi) {
          for (index_t c = 0; c < L.hd; ++c) di += sdo[threadIdx.x][c] * out.data[i * out.ld + col0 + c];
          l = lse[i * L.heads + h];
        }
        sd[threadIdx.x] = di;
        slse[threadIdx.x] = l;
      }
      __syncthreads();
      if (g != s_g[a]) continue;
      for (int ii = 0; ii < BT; ++ii) {
        const index_t i = i0 + ii;
        if (i < lo || i >= hi) continue;
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
          gv[c] += p * sdo[ii][c];
          gk[c] += ds * sq[ii][c];
        }
      }
    }
  }
  if (g < 0 || lo >= hi) return;
  T* krow = dkv.keys(g).row(j) + col0;
  T* vrow = dkv.values(g).row(j) + col0;
#pragma unroll
  for (int c = 0; c < HD; ++c)
    if (c < L.hd) {
      krow[c] += scale * gk[c];
      vrow[c] += gv[c];
    }
}

}  // namespace dev

// ---- launchers --------------------------------------------------------------------------------

namespace dev {
// The tensor-core path (attention_packed_tc.cuh, included after this file): false when it does not apply
// (double, Precision::FP32, head dims other than 64 and 128), and the SIMT kernels above run instead.
template <class T, class KV>
bool attention_packed_tc_forward(const Context& ctx, const char* op, MatrixView<T> out, T* lse, MatrixView<const T> q,
                                 const KV& kv, const PackedLayout& L);
template <class T, class KV, class DKV>
bool attention_packed_tc_backward(const Context& ctx, const char* op, MatrixView<T> dq, const DKV& dkv,
                                  MatrixView<const T> dout, MatrixView<const T> out, const T* lse, MatrixView<const T> q,
                                  const KV& kv, const PackedLayout& L);

template <class T, int HD, class KV>
void attention_packed_forward_hd(const Context& ctx, const char* op, MatrixView<T> out, T* lse, MatrixView<const T> q,
                                 const KV& kv, const PackedLayout& L) {
  constexpr int BT = attention_tile<T, HD>;
  const dim3 grid(blocks_exact(L.nq, BT), static_cast<unsigned>(L.heads));
  launch(op, ctx, grid, BT, attention_packed_forward_kernel<T, HD, KV>, out, lse, q, kv, L, T(1) / std::sqrt(T(L.hd)),
         ctx.error);
}
template <class T, int HD, class KV, class DKV>
void attention_packed_backward_hd(const Context& ctx, const char* op, MatrixView<T> dq, const DKV& dkv,
                                  MatrixView<const T> dout, MatrixView<const T> out, const T* lse,
                                  MatrixView<const T> q, const KV& kv, const PackedLayout& L) {
  constexpr int BT = attention_tile<T, HD>;
  const T scale = T(1) / std::sqrt(T(L.hd));
  const auto heads = static_cast<unsigned>(L.heads);
  launch(op, ctx, dim3(blocks_exact(L.nq, BT), heads), BT, attention_packed_backward_dq_kernel<T, HD, KV>, dq, dout,
         out, lse, q, kv, L, scale);
  // Key tiles: of the packed key rows (k_tok given), or of every group's own nk keys.
  const unsigned key_tiles = blocks_exact(L.nk, BT);
  const unsigned key_blocks = L.k_tok ? key_tiles : key_tiles * static_cast<unsigned>(L.count);
  launch(op, ctx, dim3(key_blocks, heads), BT, attention_packed_backward_dkdv_kernel<T, HD, KV, DKV>, dkv, dout, out,
         lse, q, kv, L, scale);
}
// The head-dimension instantiations (HD: the padded register/shared-memory width).
template <class T, class KV>
void attention_forward_any(const Context& ctx, const char* op, MatrixView<T> out, T* lse, MatrixView<const T> q,
                           const KV& kv, const PackedLayout& L) {
  if (attention_packed_tc_forward<T>(ctx, op, out, lse, q, kv, L)) return;
  if (L.hd <= 32) attention_packed_forward_hd<T, 32>(ctx, op, out, lse, q, kv, L);
  else if (L.hd <= 64) attention_packed_forward_hd<T, 64>(ctx, op, out, lse, q, kv, L);
  else attention_packed_forward_hd<T, 128>(ctx, op, out, lse, q, kv, L);
}
template <class T, class KV, class DKV>
void attention_backward_any(const Context& ctx, const char* op, MatrixView<T> dq, const DKV& dkv,
                            MatrixView<const T> dout, MatrixView<const T> out, const T* lse, MatrixView<const T> q,
                            const KV& kv, const PackedLayout& L) {
  if (attention_packed_tc_backward<T>(ctx, op, dq, dkv, dout, out, lse, q, kv, L)) return;
  if (L.hd <= 32) attention_packed_backward_hd<T, 32>(ctx, op, dq, dkv, dout, out, lse, q, kv, L);
  else if (L.hd <= 64) attention_packed_backward_hd<T, 64>(ctx, op, dq, dkv, dout, out, lse, q, kv, L);
  else attention_packed_backward_hd<T, 128>(ctx, op, dq, dkv, dout, out, lse, q, kv, L);
}
}  // namespace dev

template <class T>
void Kernels<T>::attention_packed_forward(const Context& ctx, M out, T* lse, CM q, CM k, CM v, const token_t* q_tok,
                                          const token_t* k_tok, index_t seq, index_t heads) {
  const dev::PackedLayout L{q.rows, k.rows, seq, heads, q.cols / heads, q_tok, k_tok, nullptr, 1};
  dev::attention_forward_any<T>(ctx, "attention_packed_forward", out, lse, q,
                                dev::OneKV<const T>{k.data, k.ld, v.data, v.ld}, L);
}
template <class T>
void Kernels<T>::attention_packed_backward(const Context& ctx, M dq, M dk, M dv, CM dout, CM out, const T* lse, CM q,
                                           CM k, CM v, const token_t* q_tok, const token_t* k_tok, index_t seq,
                                           index_t heads) {
  const dev::PackedLayout L{q.rows, k.rows, seq, heads, q.cols / heads, q_tok, k_tok, nullptr, 1};
  dev::attention_backward_any<T>(ctx, "attention_packed_backward", dq, dev::OneKV<T>{dk.data, dk.ld, dv.data, dv.ld},
                                 dout, out, lse, q, dev::OneKV<const T>{k.data, k.ld, v.data, v.ld}, L);
}
template <class T>
void Kernels<T>::attention_grouped_forward(const Context& ctx, M out, T* lse, CM q, PerGroup<const T> k,
                                           PerGroup<const T> v, index_t kv_rows, index_t kv_ld, const token_t* q_tok,
                                           const token_t* k_tok, RowGroups g, index_t seq, index_t heads) {
  const dev::PackedLayout L{q.rows, k_tok ? q.rows : kv_rows, seq, heads, q.cols / heads, q_tok, k_tok, g.offsets,
                            g.count};
  dev::attention_forward_any<T>(ctx, "attention_grouped_forward", out, lse, q, dev::GroupKV<const T>{k, v, kv_ld}, L);
}
template <class T>
void Kernels<T>::attention_grouped_backward(const Context& ctx, M dq, PerGroup<T> dk, PerGroup<T> dv, CM dout, CM out,
                                            const T* lse, CM q, PerGroup<const T> k, PerGroup<const T> v,
                                            index_t kv_rows, index_t kv_ld, const token_t* q_tok, const token_t* k_tok,
                                            RowGroups g, index_t seq, index_t heads) {
  const dev::PackedLayout L{q.rows, k_tok ? q.rows : kv_rows, seq, heads, q.cols / heads, q_tok, k_tok, g.offsets,
                            g.count};
  dev::attention_backward_any<T>(ctx, "attention_grouped_backward", dq, dev::GroupKV<T>{dk, dv, kv_ld}, dout, out, lse,
                                 q, dev::GroupKV<const T>{k, v, kv_ld}, L);
}

}  // namespace mom::cuda

#pragma once
// Packed and grouped causal attention on tensor cores (nvcuda::wmma) for cuda::Backend<float> with
// Precision::TF32 or BF16 and head dim 64 or 128: the path attention_packed.cuh's launchers take when
// attention_packed_tc_forward / _backward below accept the call (the SIMT kernels there otherwise).
// Same contract as those: out and lse ([nq × heads]) written for the groups' rows, a row without keys
// gets lse = -inf and a zero row, dq / dk / dv accumulated (+=), rows outside the groups untouched.
//
// The dense tensor-core kernels (attention_tc.cuh) with the packed layout's row ranges in place of the
// causal diagonal. A block is 4 warps and 64 rows (queries in the forward and dQ, keys in dK/dV); each of
// its rows knows its group and the range [lo, hi) of rows on the other side it sees (attention_packed.cuh's
// packed_key_range / packed_query_range; in shared memory). The block walks its tile's groups in row
// order (a group's rows are consecutive) and, for each, streams the union of those rows' ranges from that
// group's matrices in tiles of 64, as the SIMT kernels do. A warp multiplies only the 16-column blocks
// that meet the union of its own rows' ranges, and an entry counts only inside its row's range (else
// P = 0): masked, not skipped, so a query tile spread over a long sequence costs up to its whole prefix.
// Staging, rounding (operands, P and dS rounded as the wmma's A operand), the fp32 softmax in a shared
// scratch, the row-index fragment for rescaling, and the shared-memory layouts are attention_tc.cuh's.
// With one group holding every token of every sequence and keys = all tokens, every tile, range and
// product is the dense kernel's: the results are the same bits (tests/cuda/cuda_tc_attention_test.cpp).
#include <cstddef>

#include "mom/backend/cuda/kernels/attention_packed.cuh"
#include "mom/backend/cuda/kernels/attention_tc.cuh"

namespace mom::cuda {

namespace dev {

// The block's per-row facts, after the layout's bytes: group (-1: not in a group), range [lo, hi).
struct TcRowInfo {
  index_t* lo;
  index_t* hi;
  int* g;
};
inline constexpr std::size_t tc_row_info_bytes = round128(tc_tile * (2 * sizeof(index_t) + sizeof(int)));
__device__ __forceinline__ TcRowInfo tc_row_info(unsigned char* at) {
  index_t* lo = reinterpret_cast<index_t*>(at);
  return {lo, lo + tc_tile, reinterpret_cast<int*>(lo + 2 * tc_tile)};
}

// The 16-column blocks [f_lo, f_hi) of a streamed tile starting at row j0 that meet the rows [wlo, whi).
__device__ __forceinline__ void tc_column_blocks(index_t wlo, index_t whi, index_t j0, int& f_lo, int& f_hi) {
  f_lo = wlo > j0 ? static_cast<int>(min(index_t(4), (wlo - j0) / 16)) : 0;
  f_hi = whi > j0 ? static_cast<int>(min(index_t(4), (whi - j0 + 15) / 16)) : 0;
}

// dst[rr][c] = rounded row(rr)[c] for rr < 64, c < HD (row(rr) null: zeros): rows from different matrices
// (a tile of routed keys may straddle groups).
template <int Path, int HD, class Row>
__device__ __forceinline__ void tc_stage_rows(typename TcLayout<Path, HD>::S* dst, Row&& row) {
  constexpr int LD = TcLayout<Path, HD>::ld;
  for (int e = threadIdx.x; e < tc_tile * HD; e += tc_threads) {
    const int rr = e / HD, c = e % HD;
    const float* p = row(rr);
    dst[rr * LD + c] = stage_value<float, Path>(p ? p[c] : 0.0f);
  }
}

namespace wm = nvcuda::wmma;

template <int Path, int HD, class KV>
__global__ void attention_packed_tc_forward_kernel(MatrixView<float> out, float* lse, MatrixView<const float> q, KV kv,
                                                   PackedLayout L, float scale, int* error) {
#if defined(MOM_TC_ATTENTION_BODY)
  using Lay = TcLayout<Path, HD>;
  using S = typename Lay::S;
  using FT = typename Lay::frag_t;
  constexpr int KF = Lay::kf, LD = Lay::ld, SLD = Lay::sld, PLD = Lay::pld, NK = HD / KF, NO = HD / 16;
  unsigned char* sm = dynamic_smem();
  S* sK = reinterpret_cast<S*>(sm);
  S* sV = reinterpret_cast<S*>(sm + Lay::tile);
  float* sS = reinterpret_cast<float*>(sm + 2 * Lay::tile);
  S* sP = Path == gemm_bf16 ? reinterpret_cast<S*>(sm + 2 * Lay::tile + Lay::scratch) : reinterpret_cast<S*>(sS);
  float* sCorr = reinterpret_cast<float*>(sm + 2 * Lay::tile + Lay::scratch + Lay::pstage);
  float* sRows = reinterpret_cast<float*>(sm + 2 * Lay::tile + Lay::scratch + Lay::pstage + Lay::vec);
  const TcRowInfo info = tc_row_info(sm + Lay::fwd_bytes);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const index_t h = blockIdx.y, col0 = h * L.hd, i0 = index_t(blockIdx.x) * tc_tile;
  if (L.offsets && blockIdx.x == 0 && h == 0) check_offsets(L, error);
  index_t rb, re;
  grouped_span(L, L.nq, rb, re);
  if (i0 >= re || i0 + tc_tile <= rb) return;  // no row of the tile is in a group (the whole block)
  if (threadIdx.x < tc_tile) {
    const index_t i = i0 + threadIdx.x;
    int g = -1;
    index_t lo = 0, hi = 0;
    if (i >= rb && i < re) {
      g = group_of(L, i);
      index_t gb, ge;
      group_rows(L, g, L.nq, gb, ge);
      const index_t t = L.q_tok[i];
      if ((i > gb && L.q_tok[i - 1] >= t) || t < 0 || (!L.k_tok && t >= L.nk)) {
        if (h == 0) report(error, DeviceError::packed_positions, i - gb, t, L.nk);
      } else {
        packed_key_range(L, g, t, lo, hi);
      }
    }
    info.g[threadIdx.x] = g;
    info.lo[threadIdx.x] = lo;
    info.hi[threadIdx.x] = hi;
  }
  tc_stage<Path, HD, 1>(sK, q.data, q.ld, i0, re, col0);  // Q, through K's buffer
  for (int e = threadIdx.x; e < 256; e += tc_threads) sRows[e] = float(e / 16);
  __syncthreads();
  wm::fragment<wm::matrix_a, 16, 16, KF, FT, wm::row_major> qf[NK];
#pragma unroll
  for (int k = 0; k < NK; ++k) wm::load_matrix_sync(qf[k], sK + 16 * warp * LD + k * KF, LD);
  wm::fragment<wm::accumulator, 16, 16, KF, float> rows, o[NO];
  wm::load_matrix_sync(rows, sRows, 16, wm::mem_row_major);
#pragma unroll
  for (int n = 0; n < NO; ++n) wm::fill_fragment(o[n], 0.0f);

  const int r = lane >> 1, half = lane & 1, rr = 16 * warp + r;  // this lane's row, and half of the 64 columns
  float* ss = sS + 16 * warp * SLD;
  S* sp = sP + 16 * warp * PLD;
  float* corr_w = sCorr + 16 * warp;
  float m = neg_inf<float>(), l = 0.0f;
  for (int a = 0, e = 0; a < tc_tile; a = e) {  // the tile's groups (every thread runs every pass)
    e = group_run_end<tc_tile>(info.g, a);
    const int gg = info.g[a];
    if (gg < 0) continue;
    index_t ulo, uhi, wlo, whi;
    range_union(info.lo, info.hi, a, e, ulo, uhi);                                // the block's keys
    range_union(info.lo, info.hi, max(a, 16 * warp), min(e, 16 * warp + 16), wlo, whi);  // this warp's
    const bool mine = rr >= a && rr < e;
    const index_t lo = mine ? info.lo[rr] : 0, hi = mine ? info.hi[rr] : 0;
    const RowsAt<const float> K = kv.keys(gg), V = kv.values(gg);
    for (index_t j0 = ulo; j0 < uhi; j0 += tc_tile) {
      __syncthreads();  // Q (first tile) or the previous K, V consumed
      tc_stage<Path, HD, 1>(sK, K.data, K.ld, j0, uhi, col0);
      tc_stage<Path, HD, 1>(sV, V.data, V.ld, j0, uhi, col0);
      __syncthreads();
      int f_lo, f_hi;
      tc_column_blocks(wlo, whi, j0, f_lo, f_hi);
      if (f_lo >= f_hi) continue;  // the same for the whole warp
#pragma unroll
      for (int f = 0; f < 4; ++f) {
        if (f >= f_lo && f < f_hi) {
          wm::fragment<wm::accumulator, 16, 16, KF, float> sf;
          wm::fill_fragment(sf, 0.0f);
#pragma unroll
          for (int k = 0; k < NK; ++k) {
            wm::fragment<wm::matrix_b, 16, 16, KF, FT, wm::col_major> kb;  // Kᵀ: (c, j) at sK[j][c]
            wm::load_matrix_sync(kb, sK + 16 * f * LD + k * KF, LD);
            wm::mma_sync(sf, qf[k], kb, sf);
          }
          wm::store_matrix_sync(ss + 16 * f, sf, SLD, wm::mem_row_major);
        }
      }
      __syncwarp();
      // Online softmax of row r over columns [c0, c1) (this lane's half of the multiplied blocks), keys in [lo, hi).
      const int c0 = max(32 * half, 16 * f_lo), c1 = min(32 * half + 32, 16 * f_hi);
      float tmax = neg_inf<float>();
      for (int c = c0; c < c1; ++c)
        if (j0 + c >= lo && j0 + c < hi) tmax = max(tmax, ss[r * SLD + c] * scale);
      tmax = max(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
      const float mnew = max(m, tmax);
      const float corr = mnew == neg_inf<float>() ? 1.0f : exp_(m - mnew);  // no key yet: nothing to rescale
      float sum = 0.0f;
      for (int c = c0; c < c1; ++c) {
        const float p = j0 + c >= lo && j0 + c < hi ? exp_(ss[r * SLD + c] * scale - mnew) : 0.0f;
        sum += p;
        sp[r * PLD + c] = stage_value<float, Path>(p);
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      l = l * corr + sum;
      m = mnew;
      if (half == 0) corr_w[r] = corr;
      __syncwarp();
#pragma unroll
      for (int n = 0; n < NO; ++n)
#pragma unroll
        for (int x = 0; x < o[n].num_elements; ++x) o[n].x[x] *= corr_w[int(rows.x[x])];
      for (int kk = 16 * f_lo; kk < 16 * f_hi; kk += KF) {  // O += P V over the multiplied keys
        wm::fragment<wm::matrix_a, 16, 16, KF, FT, wm::row_major> pa;
        wm::load_matrix_sync(pa, sp + kk, PLD);
#pragma unroll
        for (int n = 0; n < NO; ++n) {
          wm::fragment<wm::matrix_b, 16, 16, KF, FT, wm::row_major> vb;
          wm::load_matrix_sync(vb, sV + kk * LD + 16 * n, LD);
          wm::mma_sync(o[n], pa, vb, o[n]);
        }
      }
    }
  }
  __syncthreads();  // K, V consumed: their space stages the output
  if (half == 0) corr_w[r] = l > 0.0f ? 1.0f / l : 0.0f;
  __syncwarp();
  float* so = reinterpret_cast<float*>(sm) + 16 * warp * Lay::old;
#pragma unroll
  for (int n = 0; n < NO; ++n) {
#pragma unroll
    for (int x = 0; x < o[n].num_elements; ++x) o[n].x[x] *= corr_w[int(rows.x[x])];
    wm::store_matrix_sync(so + 16 * n, o[n], Lay::old, wm::mem_row_major);
  }
  __syncwarp();
  for (int x = lane; x < 16 * HD; x += 32) {
    const int row = 16 * warp + x / HD, c = x % HD;
    if (info.g[row] >= 0) out.data[(i0 + row) * out.ld + col0 + c] = so[(x / HD) * Lay::old + c];
  }
  if (half == 0 && info.g[rr] >= 0) lse[(i0 + rr) * L.heads + h] = l > 0.0f ? m + log_(l) : neg_inf<float>();
#else
  (void)out, (void)lse, (void)q, (void)kv, (void)L, (void)scale, (void)error;
#endif
}

// dQ: block = 64 query rows; per group of the tile, its key tiles. Per tile and warp: S = Q Kᵀ, dP = dO Vᵀ
// (wmma), P = exp(scale·S − lse), dS = P ∘ (dP − D) in fp32 inside the rows' key ranges (0 outside), dS
// rounded, dQ += dS K; at the end dq += scale · dQ for the rows with keys.
template <int Path, int HD, class KV>
__global__ void attention_packed_tc_dq_kernel(MatrixView<float> dq, MatrixView<const float> dout,
                                              MatrixView<const float> out, const float* lse, MatrixView<const float> q,
                                              KV kv, PackedLayout L, float scale) {
#if defined(MOM_TC_ATTENTION_BODY)
  using Lay = TcLayout<Path, HD>;
  using S = typename Lay::S;
  using FT = typename Lay::frag_t;
  constexpr int KF = Lay::kf, LD = Lay::ld, SLD = Lay::sld, PLD = Lay::pld, NK = HD / KF, NO = HD / 16;
  unsigned char* sm = dynamic_smem();
  S* sQ = reinterpret_cast<S*>(sm);
  S* sdO = reinterpret_cast<S*>(sm + Lay::tile);
  S* sK = reinterpret_cast<S*>(sm + 2 * Lay::tile);
  S* sV = reinterpret_cast<S*>(sm + 3 * Lay::tile);
  float* sS = reinterpret_cast<float*>(sm + 4 * Lay::tile);
  float* sdP = reinterpret_cast<float*>(sm + 4 * Lay::tile + Lay::scratch);
  S* sdS = Path == gemm_bf16 ? reinterpret_cast<S*>(sm + 4 * Lay::tile + 2 * Lay::scratch) : reinterpret_cast<S*>(sS);
  float* sLse = reinterpret_cast<float*>(sm + 4 * Lay::tile + 2 * Lay::scratch + Lay::pstage);
  float* sD = sLse + tc_tile;
  const TcRowInfo info = tc_row_info(sm + Lay::dq_bytes);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const index_t h = blockIdx.y, col0 = h * L.hd, i0 = index_t(blockIdx.x) * tc_tile;
  index_t rb, re;
  grouped_span(L, L.nq, rb, re);
  if (i0 >= re || i0 + tc_tile <= rb) return;
  if (threadIdx.x < tc_tile) {
    const index_t i = i0 + threadIdx.x;
    int g = -1;
    index_t lo = 0, hi = 0;
    if (i >= rb && i < re) {
      g = group_of(L, i);
      if (lse[i * L.heads + h] != neg_inf<float>()) packed_key_range(L, g, L.q_tok[i], lo, hi);
    }
    info.g[threadIdx.x] = g;
    info.lo[threadIdx.x] = lo;
    info.hi[threadIdx.x] = hi;
  }
  tc_stage<Path, HD>(sQ, q.data, q.ld, i0, re, col0);
  tc_stage_dout<Path, HD>(sdO, sD, sLse, dout.data, dout.ld, out.data, out.ld, lse + h, i0, re, col0, L.heads);
  __syncthreads();
  wm::fragment<wm::accumulator, 16, 16, KF, float> dqf[NO];
#pragma unroll
  for (int n = 0; n < NO; ++n) wm::fill_fragment(dqf[n], 0.0f);
  const int r = lane >> 1, half = lane & 1, rr = 16 * warp + r;
  float* ss = sS + 16 * warp * SLD;
  float* sdp = sdP + 16 * warp * SLD;
  S* sds = sdS + 16 * warp * PLD;
  const S* sq = sQ + 16 * warp * LD;
  const S* sdo = sdO + 16 * warp * LD;
  for (int a = 0, e = 0; a < tc_tile; a = e) {
    e = group_run_end<tc_tile>(info.g, a);
    const int gg = info.g[a];
    if (gg < 0) continue;
    index_t ulo, uhi, wlo, whi;
    range_union(info.lo, info.hi, a, e, ulo, uhi);
    range_union(info.lo, info.hi, max(a, 16 * warp), min(e, 16 * warp + 16), wlo, whi);
    const bool mine = rr >= a && rr < e;
    const index_t lo = mine ? info.lo[rr] : 0, hi = mine ? info.hi[rr] : 0;
    const RowsAt<const float> K = kv.keys(gg), V = kv.values(gg);
    for (index_t j0 = ulo; j0 < uhi; j0 += tc_tile) {
      __syncthreads();
      tc_stage<Path, HD>(sK, K.data, K.ld, j0, uhi, col0);
      tc_stage<Path, HD>(sV, V.data, V.ld, j0, uhi, col0);
      __syncthreads();
      int f_lo, f_hi;
      tc_column_blocks(wlo, whi, j0, f_lo, f_hi);
      if (f_lo >= f_hi) continue;
      for (int f = f_lo; f < f_hi; ++f) {
        wm::fragment<wm::accumulator, 16, 16, KF, float> sf, pf;
        wm::fill_fragment(sf, 0.0f);
        wm::fill_fragment(pf, 0.0f);
#pragma unroll
        for (int k = 0; k < NK; ++k) {
          wm::fragment<wm::matrix_a, 16, 16, KF, FT, wm::row_major> fa;
          wm::fragment<wm::matrix_b, 16, 16, KF, FT, wm::col_major> bt;
          wm::load_matrix_sync(fa, sq + k * KF, LD);
          wm::load_matrix_sync(bt, sK + 16 * f * LD + k * KF, LD);
          wm::mma_sync(sf, fa, bt, sf);
          wm::load_matrix_sync(fa, sdo + k * KF, LD);
          wm::load_matrix_sync(bt, sV + 16 * f * LD + k * KF, LD);
          wm::mma_sync(pf, fa, bt, pf);
        }
        wm::store_matrix_sync(ss + 16 * f, sf, SLD, wm::mem_row_major);
        wm::store_matrix_sync(sdp + 16 * f, pf, SLD, wm::mem_row_major);
      }
      __syncwarp();
      {
        const int c0 = max(32 * half, 16 * f_lo), c1 = min(32 * half + 32, 16 * f_hi);
        const float li = sLse[rr], di = sD[rr];
        for (int c = c0; c < c1; ++c) {
          const float p = j0 + c >= lo && j0 + c < hi ? exp_(ss[r * SLD + c] * scale - li) : 0.0f;
          sds[r * PLD + c] = stage_value<float, Path>(p * (sdp[r * SLD + c] - di));
        }
      }
      __syncwarp();
      for (int kk = 16 * f_lo; kk < 16 * f_hi; kk += KF) {  // dQ += dS K
        wm::fragment<wm::matrix_a, 16, 16, KF, FT, wm::row_major> fa;
        wm::load_matrix_sync(fa, sds + kk, PLD);
#pragma unroll
        for (int n = 0; n < NO; ++n) {
          wm::fragment<wm::matrix_b, 16, 16, KF, FT, wm::row_major> kb;
          wm::load_matrix_sync(kb, sK + kk * LD + 16 * n, LD);
          wm::mma_sync(dqf[n], fa, kb, dqf[n]);
        }
      }
    }
  }
  __syncthreads();  // Q, dO consumed: their space stages dQ
  float* so = reinterpret_cast<float*>(sm) + 16 * warp * Lay::old;
#pragma unroll
  for (int n = 0; n < NO; ++n) wm::store_matrix_sync(so + 16 * n, dqf[n], Lay::old, wm::mem_row_major);
  __syncwarp();
  for (int x = lane; x < 16 * HD; x += 32) {
    const int row = 16 * warp + x / HD, c = x % HD;
    if (info.g[row] >= 0 && info.lo[row] < info.hi[row])
      dq.data[(i0 + row) * dq.ld + col0 + c] += scale * so[(x / HD) * Lay::old + c];
  }
#else
  (void)dq, (void)dout, (void)out, (void)lse, (void)q, (void)kv, (void)L, (void)scale;
#endif
}

// dK, dV: block = 64 key rows (with k_tok the packed key rows, a tile that may straddle groups; without,
// block x is (group, key tile) = (x / tiles, x % tiles) over every group's own nk keys, as the SIMT kernel).
// Per group of the tile, its query tiles; per tile and warp (16 keys): Sᵀ = K Qᵀ, dPᵀ = V dOᵀ (wmma),
// Pᵀ = exp(scale·Sᵀ − lse), dSᵀ = Pᵀ ∘ (dPᵀ − D) inside the keys' query ranges, both rounded, dV += Pᵀ dO,
// dK += dSᵀ Q; at the end dk += scale · dK, dv += dV for the keys some query sees (each group's rows disjoint).
template <int Path, int HD, class KV, class DKV>
__global__ void attention_packed_tc_dkdv_kernel(DKV dkv, MatrixView<const float> dout, MatrixView<const float> out,
                                                const float* lse, MatrixView<const float> q, KV kv, PackedLayout L,
                                                float scale) {
#if defined(MOM_TC_ATTENTION_BODY)
  using Lay = TcLayout<Path, HD>;
  using S = typename Lay::S;
  using FT = typename Lay::frag_t;
  constexpr int KF = Lay::kf, LD = Lay::ld, SLD = Lay::sld, PLD = Lay::pld, NK = HD / KF, NO = HD / 16;
  unsigned char* sm = dynamic_smem();
  S* sK = reinterpret_cast<S*>(sm);
  S* sV = reinterpret_cast<S*>(sm + Lay::tile);
  S* sQ = reinterpret_cast<S*>(sm + 2 * Lay::tile);
  S* sdO = reinterpret_cast<S*>(sm + 3 * Lay::tile);
  float* sS = reinterpret_cast<float*>(sm + 4 * Lay::tile);
  float* sdP = reinterpret_cast<float*>(sm + 4 * Lay::tile + Lay::scratch);
  S* sP = Path == gemm_bf16 ? reinterpret_cast<S*>(sm + 4 * Lay::tile + 2 * Lay::scratch) : reinterpret_cast<S*>(sS);
  S* sdS = Path == gemm_bf16 ? reinterpret_cast<S*>(sm + 4 * Lay::tile + 2 * Lay::scratch + Lay::pstage)
                             : reinterpret_cast<S*>(sdP);
  float* sLse = reinterpret_cast<float*>(sm + 4 * Lay::tile + 2 * Lay::scratch + 2 * Lay::pstage);
  float* sD = sLse + tc_tile;
  const TcRowInfo info = tc_row_info(sm + Lay::dkdv_bytes);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const index_t h = blockIdx.y, col0 = h * L.hd;
  int block_group = -1;  // the block's group (without k_tok)
  index_t j0, rb, re;
  if (L.k_tok) {
    j0 = index_t(blockIdx.x) * tc_tile;
    grouped_span(L, L.nk, rb, re);
  } else {
    const index_t tiles = (L.nk + tc_tile - 1) / tc_tile;
    block_group = static_cast<int>(blockIdx.x / tiles);
    j0 = (index_t(blockIdx.x) % tiles) * tc_tile;
    group_rows(L, block_group, L.nq, rb, re);
    if (rb >= re) return;  // an empty group: its keys get no gradient
    rb = 0, re = L.nk;
  }
  if (j0 >= re || j0 + tc_tile <= rb) return;
  if (threadIdx.x < tc_tile) {
    const index_t j = j0 + threadIdx.x;
    int g = -1;
    index_t lo = 0, hi = 0;
    if (j >= rb && j < re) {
      g = block_group >= 0 ? block_group : group_of(L, j);
      packed_query_range(L, g, L.k_tok ? L.k_tok[j] : j, lo, hi);
    }
    info.g[threadIdx.x] = g;
    info.lo[threadIdx.x] = lo;
    info.hi[threadIdx.x] = hi;
  }
  __syncthreads();
  // The block's own keys and values, row rr from its group's matrices.
  tc_stage_rows<Path, HD>(sK, [&](int k) { return info.g[k] >= 0 ? kv.keys(info.g[k]).row(j0 + k) + col0 : nullptr; });
  tc_stage_rows<Path, HD>(sV, [&](int k) { return info.g[k] >= 0 ? kv.values(info.g[k]).row(j0 + k) + col0 : nullptr; });
  wm::fragment<wm::accumulator, 16, 16, KF, float> dk[NO], dv[NO];
#pragma unroll
  for (int n = 0; n < NO; ++n) {
    wm::fill_fragment(dk[n], 0.0f);
    wm::fill_fragment(dv[n], 0.0f);
  }
  const int r = lane >> 1, half = lane & 1, rr = 16 * warp + r;  // this lane's key
  float* ss = sS + 16 * warp * SLD;
  float* sdp = sdP + 16 * warp * SLD;
  S* sp = sP + 16 * warp * PLD;
  S* sds = sdS + 16 * warp * PLD;
  const S* sk = sK + 16 * warp * LD;
  const S* sv = sV + 16 * warp * LD;
  for (int a = 0, e = 0; a < tc_tile; a = e) {
    e = group_run_end<tc_tile>(info.g, a);
    if (info.g[a] < 0) continue;
    index_t ulo, uhi, wlo, whi;
    range_union(info.lo, info.hi, a, e, ulo, uhi);
    range_union(info.lo, info.hi, max(a, 16 * warp), min(e, 16 * warp + 16), wlo, whi);
    const bool mine = rr >= a && rr < e;
    const index_t lo = mine ? info.lo[rr] : 0, hi = mine ? info.hi[rr] : 0;
    for (index_t i0 = ulo; i0 < uhi; i0 += tc_tile) {  // the query tiles that see a key of this group's rows
      __syncthreads();
      tc_stage<Path, HD>(sQ, q.data, q.ld, i0, uhi, col0);
      tc_stage_dout<Path, HD>(sdO, sD, sLse, dout.data, dout.ld, out.data, out.ld, lse + h, i0, uhi, col0, L.heads);
      __syncthreads();
      int f_lo, f_hi;
      tc_column_blocks(wlo, whi, i0, f_lo, f_hi);
      if (f_lo >= f_hi) continue;
      for (int f = f_lo; f < f_hi; ++f) {
        wm::fragment<wm::accumulator, 16, 16, KF, float> sf, pf;
        wm::fill_fragment(sf, 0.0f);
        wm::fill_fragment(pf, 0.0f);
#pragma unroll
        for (int k = 0; k < NK; ++k) {
          wm::fragment<wm::matrix_a, 16, 16, KF, FT, wm::row_major> fa;
          wm::fragment<wm::matrix_b, 16, 16, KF, FT, wm::col_major> bt;
          wm::load_matrix_sync(fa, sk + k * KF, LD);
          wm::load_matrix_sync(bt, sQ + 16 * f * LD + k * KF, LD);
          wm::mma_sync(sf, fa, bt, sf);
          wm::load_matrix_sync(fa, sv + k * KF, LD);
          wm::load_matrix_sync(bt, sdO + 16 * f * LD + k * KF, LD);
          wm::mma_sync(pf, fa, bt, pf);
        }
        wm::store_matrix_sync(ss + 16 * f, sf, SLD, wm::mem_row_major);
        wm::store_matrix_sync(sdp + 16 * f, pf, SLD, wm::mem_row_major);
      }
      __syncwarp();
      {
        const int c0 = max(32 * half, 16 * f_lo), c1 = min(32 * half + 32, 16 * f_hi);
        for (int c = c0; c < c1; ++c) {
          const bool seen = i0 + c >= lo && i0 + c < hi;
          const float p = seen ? exp_(ss[r * SLD + c] * scale - sLse[c]) : 0.0f;
          const float ds = p * (sdp[r * SLD + c] - sD[c]);
          sp[r * PLD + c] = stage_value<float, Path>(p);
          sds[r * PLD + c] = stage_value<float, Path>(ds);
        }
      }
      __syncwarp();
      for (int kk = 16 * f_lo; kk < 16 * f_hi; kk += KF) {  // dV += Pᵀ dO, dK += dSᵀ Q
        wm::fragment<wm::matrix_a, 16, 16, KF, FT, wm::row_major> pa, da;
        wm::load_matrix_sync(pa, sp + kk, PLD);
        wm::load_matrix_sync(da, sds + kk, PLD);
#pragma unroll
        for (int n = 0; n < NO; ++n) {
          wm::fragment<wm::matrix_b, 16, 16, KF, FT, wm::row_major> bb;
          wm::load_matrix_sync(bb, sdO + kk * LD + 16 * n, LD);
          wm::mma_sync(dv[n], pa, bb, dv[n]);
          wm::load_matrix_sync(bb, sQ + kk * LD + 16 * n, LD);
          wm::mma_sync(dk[n], da, bb, dk[n]);
        }
      }
    }
  }
  __syncthreads();  // K, V consumed: their space stages dK, then dV
  float* so = reinterpret_cast<float*>(sm) + 16 * warp * Lay::old;
  const auto write = [&](wm::fragment<wm::accumulator, 16, 16, KF, float>* acc, bool keys, float s) {
#pragma unroll
    for (int n = 0; n < NO; ++n) wm::store_matrix_sync(so + 16 * n, acc[n], Lay::old, wm::mem_row_major);
    __syncwarp();
    for (int x = lane; x < 16 * HD; x += 32) {
      const int row = 16 * warp + x / HD, c = x % HD, g = info.g[row];
      if (g >= 0 && info.lo[row] < info.hi[row]) {
        const RowsAt<float> m = keys ? dkv.keys(g) : dkv.values(g);
        m.row(j0 + row)[col0 + c] += s * so[(x / HD) * Lay::old + c];
      }
    }
    __syncwarp();
  };
  write(dk, true, scale);
  write(dv, false, 1.0f);
#else
  (void)dkv, (void)dout, (void)out, (void)lse, (void)q, (void)kv, (void)L, (void)scale;
#endif
}

// ---- launchers: false when the path does not apply (attention_tc.cuh's with_tc_attention, the shared memory) ----

template <class T, class KV>
bool attention_packed_tc_forward(const Context& ctx, const char* op, MatrixView<T> out, T* lse, MatrixView<const T> q,
                                 const KV& kv, const PackedLayout& L) {
  return with_tc_attention<T>(ctx, L.hd, [&](auto path, auto hd) {
    constexpr int P = decltype(path)::value, HD = decltype(hd)::value;
    constexpr std::size_t smem = TcLayout<P, HD>::fwd_bytes + tc_row_info_bytes;
    constexpr auto kernel = attention_packed_tc_forward_kernel<P, HD, KV>;
    if (!tc_kernel_usable<kernel>(ctx, smem)) return false;
    const dim3 grid(blocks_exact(L.nq, tc_tile), static_cast<unsigned>(L.heads));
    launch_smem(op, ctx, grid, tc_threads, smem, kernel, out, lse, q, kv, L, 1.0f / std::sqrt(float(L.hd)), ctx.error);
    return true;
  });
}

template <class T, class KV, class DKV>
bool attention_packed_tc_backward(const Context& ctx, const char* op, MatrixView<T> dq, const DKV& dkv,
                                  MatrixView<const T> dout, MatrixView<const T> out, const T* lse, MatrixView<const T> q,
                                  const KV& kv, const PackedLayout& L) {
  return with_tc_attention<T>(ctx, L.hd, [&](auto path, auto hd) {
    constexpr int P = decltype(path)::value, HD = decltype(hd)::value;
    constexpr std::size_t dq_smem = TcLayout<P, HD>::dq_bytes + tc_row_info_bytes;
    constexpr std::size_t dkdv_smem = TcLayout<P, HD>::dkdv_bytes + tc_row_info_bytes;
    constexpr auto dq_kernel = attention_packed_tc_dq_kernel<P, HD, KV>;
    constexpr auto dkdv_kernel = attention_packed_tc_dkdv_kernel<P, HD, KV, DKV>;
    if (!tc_kernel_usable<dq_kernel>(ctx, dq_smem) || !tc_kernel_usable<dkdv_kernel>(ctx, dkdv_smem)) return false;
    const float scale = 1.0f / std::sqrt(float(L.hd));
    const auto heads = static_cast<unsigned>(L.heads);
    launch_smem(op, ctx, dim3(blocks_exact(L.nq, tc_tile), heads), tc_threads, dq_smem, dq_kernel, dq, dout, out, lse,
                q, kv, L, scale);
    // Key tiles: of the packed key rows (k_tok given), or of every group's own nk keys.
    const unsigned key_tiles = blocks_exact(L.nk, tc_tile);
    const unsigned key_blocks = L.k_tok ? key_tiles : key_tiles * static_cast<unsigned>(L.count);
    launch_smem(op, ctx, dim3(key_blocks, heads), tc_threads, dkdv_smem, dkdv_kernel, dkv, dout, out, lse, q, kv, L,
                scale);
    return true;
  });
}

}  // namespace dev

}  // namespace mom::cuda

#pragma once
// Packed and grouped causal attention on tensor cores (nvcuda::wmma) for cuda::Backend<float> with
// Precision::TF32 or BF16 and head dim 64 or 128: the path attention_packed.cuh's launchers take when
// attention_packed_tc_forward / _backward below accept the call (the SIMT kernels there otherwise).
// Same contract as those: out and lse ([nq × heads]) written for the groups' rows, a row without keys
// gets lse = -inf and a zero row, dq / dk / dv accumulated (+=), rows outside the groups untouched.
//
// The dense tensor-core kernels (attention_tc.cuh) with the packed layout's row ranges in place of the
// causal diagonal. A block is 4 warps and 64 rows (queries in the forward, keys in the backward); each of
// its rows knows its group and the range [lo, hi) of rows on the other side it sees (attention_packed.cuh's
// packed_key_range / packed_query_range; in shared memory). The block walks its tile's groups in row
// order (a group's rows are consecutive) and, for each, streams the union of those rows' ranges from that
// group's matrices in tiles of 64, as the SIMT kernels do. A warp multiplies only the 16-column blocks
// that meet the union of its own rows' ranges, and an entry counts only inside its row's range (else
// P = 0): masked, not skipped, so a query tile spread over a long sequence costs up to its whole prefix.
// Staging, rounding (operands, P and dS rounded as the wmma's A operand), the shared-memory layouts and a warp's
// work on a tile (the products, the fp32 softmax in a shared scratch, the row rescaling, the accumulation, the
// write-out) are attention_tc.cuh's, called with the rows' ranges.
// With one group holding every token of every sequence and keys = all tokens, every tile, range and
// product is the dense kernel's: the same bits (tests/cuda/cuda_tc_attention_test.cpp).
#include <cstddef>

#include "mom/backend/cuda/kernels/attention_packed.cuh"
#include "mom/backend/cuda/kernels/attention_tc.cuh"

namespace mom::cuda {

namespace dev {

// The block's per-row facts, after the layout's bytes: group (-1: not in a group), range [lo, hi); and the backward's
// per-warp column blocks [f[2w], f[2w + 1]) of the current query tile (which dQ's key blocks to take).
struct TcRowInfo {
  index_t* lo;
  index_t* hi;
  int* g;
  int* f;
};
inline constexpr std::size_t tc_row_info_bytes = round128(tc_tile * (2 * sizeof(index_t) + sizeof(int)) + 8 * sizeof(int));
__device__ __forceinline__ TcRowInfo tc_row_info(unsigned char* at) {
  index_t* lo = reinterpret_cast<index_t*>(at);
  int* g = reinterpret_cast<int*>(lo + 2 * tc_tile);
  return {lo, lo + tc_tile, g, g + tc_tile};
}

// One run of the tile's rows in the same group (a group's rows are consecutive), from row a: its end e, group g
// (-1: rows outside the groups), the union [ulo, uhi) of its rows' ranges, that of this warp's rows in it
// [wlo, whi), and row rr's own range [lo, hi) (empty when rr is not in the run).
struct TcRun {
  int e, g;
  index_t ulo, uhi, wlo, whi, lo, hi;
};
__device__ __forceinline__ TcRun tc_group_run(const TcRowInfo& info, int a, int rr) {
  TcRun run;
  run.e = group_run_end<tc_tile>(info.g, a);
  run.g = info.g[a];
  const int warp = threadIdx.x / 32;
  range_union(info.lo, info.hi, a, run.e, run.ulo, run.uhi);
  range_union(info.lo, info.hi, max(a, 16 * warp), min(run.e, 16 * warp + 16), run.wlo, run.whi);
  const bool mine = rr >= a && rr < run.e;
  run.lo = mine ? info.lo[rr] : 0;
  run.hi = mine ? info.hi[rr] : 0;
  return run;
}

// The 16-column blocks [f_lo, f_hi) of a streamed tile starting at row j0 that meet the rows [wlo, whi).
__device__ __forceinline__ void tc_column_blocks(index_t wlo, index_t whi, index_t j0, int& f_lo, int& f_hi) {
  f_lo = wlo > j0 ? static_cast<int>(min(index_t(4), (wlo - j0) / 16)) : 0;
  f_hi = whi > j0 ? static_cast<int>(min(index_t(4), (whi - j0 + 15) / 16)) : 0;
}

// The forwards' start (wmma and mma): the offsets checked once, the block's query rows' facts into info (before the
// caller's next barrier), re = the end of the grouped rows; false: no row of the tile is in a group (the whole
// block returns).
__device__ __forceinline__ bool tc_packed_query_rows(const PackedLayout& L, const TcRowInfo& info, index_t i0, index_t h,
                                                     int* error, index_t& re) {
  if (L.offsets && blockIdx.x == 0 && h == 0) check_offsets(L, error);
  index_t rb;
  grouped_span(L, L.nq, rb, re);
  if (i0 >= re || i0 + tc_tile <= rb) return false;
  if (threadIdx.x < tc_tile) {
    index_t lo, hi;
    info.g[threadIdx.x] = packed_query_row(L, i0 + threadIdx.x, rb, re, h, error, lo, hi);
    info.lo[threadIdx.x] = lo;
    info.hi[threadIdx.x] = hi;
  }
  return true;
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

// The backwards' dQ: the key warps whose multiplied column blocks (info.f, published by a barrier) hold this warp's
// 16 queries of the streamed tile, as a bit mask.
__device__ __forceinline__ unsigned tc_dq_key_warps(const TcRowInfo& info) {
  const int warp = threadIdx.x / 32;
  unsigned kmask = 0;
#pragma unroll
  for (int kw = 0; kw < 4; ++kw)
    if (info.f[2 * kw] <= warp && warp < info.f[2 * kw + 1]) kmask |= 1u << kw;
  return kmask;
}

// The backwards' start (wmma and mma): the block's key tile j0 (false: none, the whole block returns), its key rows'
// facts into info, a barrier, and its own keys and values staged into sk, sv (row rr from its group's matrices).
template <int Path, int HD, class KV>
__device__ __forceinline__ bool tc_packed_key_rows(const PackedLayout& L, const TcRowInfo& info, const KV& kv,
                                                   index_t col0, typename TcLayout<Path, HD>::S* sk,
                                                   typename TcLayout<Path, HD>::S* sv, index_t& j0) {
  int block_group;  // the block's group (without k_tok)
  index_t rb, re;
  if (!packed_key_block(L, tc_tile, j0, rb, re, block_group)) return false;
  if (threadIdx.x < tc_tile) {
    index_t lo, hi;
    info.g[threadIdx.x] = packed_key_row(L, j0 + threadIdx.x, rb, re, block_group, lo, hi);
    info.lo[threadIdx.x] = lo;
    info.hi[threadIdx.x] = hi;
  }
  __syncthreads();
  tc_stage_rows<Path, HD>(sk, [&](int k) { return info.g[k] >= 0 ? kv.keys(info.g[k]).row(j0 + k) + col0 : nullptr; });
  tc_stage_rows<Path, HD>(sv, [&](int k) { return info.g[k] >= 0 ? kv.values(info.g[k]).row(j0 + k) + col0 : nullptr; });
  return true;
}


template <int Path, int HD, class KV>
__global__ void attention_packed_tc_forward_kernel(MatrixView<float> out, float* lse, MatrixView<const float> q, KV kv,
                                                   PackedLayout L, float scale, int* error) {
#if defined(MOM_TC_ATTENTION_BODY)
  using Lay = TcLayout<Path, HD>;
  using S = typename Lay::S;
  constexpr int SLD = Lay::sld, PLD = Lay::pld, NO = HD / 16;
  unsigned char* sm = dynamic_smem();
  const auto [sK, sV, sS, sP, sCorr, sRows] = tc_forward_smem<Path, HD>(sm);
  const TcRowInfo info = tc_row_info(sm + Lay::fwd_bytes);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const index_t h = blockIdx.y, col0 = h * L.hd, i0 = index_t(blockIdx.x) * tc_tile;
  index_t re;
  if (!tc_packed_query_rows(L, info, i0, h, error, re)) return;
  tc_stage<Path, HD, 1>(sK, q.data, q.ld, i0, re, col0);  // Q, through K's buffer
  TcQFrags<Path, HD> qf;
  TcAcc<Path> rows, o[NO];
  tc_forward_start<Path, HD>(qf, rows, o, sK, sRows);

  const int r = lane >> 1, half = lane & 1, rr = 16 * warp + r;  // this lane's row, and half of the 64 columns
  float* ss = sS + 16 * warp * SLD;
  S* sp = sP + 16 * warp * PLD;
  float* corr_w = sCorr + 16 * warp;
  float m = neg_inf<float>(), l = 0.0f;
  for (int a = 0; a < tc_tile;) {  // the tile's groups (every thread runs every pass)
    const auto [e, gg, ulo, uhi, wlo, whi, lo, hi] = tc_group_run(info, a, rr);
    a = e;
    if (gg < 0) continue;
    const RowsAt<const float> K = kv.keys(gg), V = kv.values(gg);
    for (index_t j0 = ulo; j0 < uhi; j0 += tc_tile) {
      __syncthreads();  // Q (first tile) or the previous K, V consumed
      tc_stage<Path, HD, 1>(sK, K.data, K.ld, j0, uhi, col0);
      tc_stage<Path, HD, 1>(sV, V.data, V.ld, j0, uhi, col0);
      __syncthreads();
      int f_lo, f_hi;
      tc_column_blocks(wlo, whi, j0, f_lo, f_hi);
      if (f_lo >= f_hi) continue;  // the same for the whole warp
      tc_scores<Path, HD>(ss, qf, sK, f_lo, f_hi);
      __syncwarp();
      // Online softmax of row r over its half of the multiplied blocks, keys in [lo, hi).
      const float corr = tc_softmax<Path, HD>(ss, sp, r, max(32 * half, 16 * f_lo), min(32 * half + 32, 16 * f_hi), j0,
                                              lo, hi, scale, m, l);
      if (half == 0) corr_w[r] = corr;
      __syncwarp();
      tc_scale_rows<Path, HD>(o, rows, corr_w);
      tc_accumulate<Path, HD>(o, sp, PLD, sV, 16 * f_lo, 16 * f_hi);  // O += P V over the multiplied keys
    }
  }
  __syncthreads();  // K, V consumed: their space stages the output
  if (half == 0) corr_w[r] = l > 0.0f ? 1.0f / l : 0.0f;
  __syncwarp();
  tc_scale_rows<Path, HD>(o, rows, corr_w);
  tc_write_rows<Path, HD>(o, reinterpret_cast<float*>(sm) + 16 * warp * Lay::old, [&](int row, int c, float v) {
    if (info.g[16 * warp + row] >= 0) out.data[(i0 + 16 * warp + row) * out.ld + col0 + c] = v;
  });
  if (half == 0 && info.g[rr] >= 0) lse[(i0 + rr) * L.heads + h] = l > 0.0f ? m + log_(l) : neg_inf<float>();
#else
  (void)out, (void)lse, (void)q, (void)kv, (void)L, (void)scale, (void)error;
#endif
}

// The forward in bf16 with the softmax in registers (attention_mma.cuh's warp work, with the rows' ranges): the
// path for Precision::BF16. One group holding every token gives the dense mma kernel's bits.
template <int HD, class KV>
__global__ void attention_packed_mma_forward_kernel(MatrixView<float> out, float* lse, MatrixView<const float> q, KV kv,
                                                    PackedLayout L, float scale, int* error) {
#if defined(MOM_MMA_BF16)
  using Lay = TcLayout<gemm_bf16, HD>;
  unsigned char* sm = dynamic_smem();
  bf16_t* sK = reinterpret_cast<bf16_t*>(sm);
  bf16_t* sV = reinterpret_cast<bf16_t*>(sm + Lay::tile);
  const TcRowInfo info = tc_row_info(sm + 2 * Lay::tile);

  const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4;
  const index_t h = blockIdx.y, col0 = h * L.hd, i0 = index_t(blockIdx.x) * tc_tile;
  index_t re;
  if (!tc_packed_query_rows(L, info, i0, h, error, re)) return;
  tc_stage<gemm_bf16, HD, 1>(sK, q.data, q.ld, i0, re, col0);  // Q, through K's buffer
  __syncthreads();                                              // Q and the rows' facts
  MmaQ<HD> qf;
  mma_load_q<HD>(qf, sK);
  MmaRows<HD> st;
  mma_rows_start<HD>(st);
  const int rows[2] = {16 * warp + g, 16 * warp + g + 8};  // this lane's rows of the tile
  const float sl2 = scale * mma_log2e;
  for (int a = 0; a < tc_tile;) {  // the tile's groups (every thread runs every pass)
    const TcRun run = tc_group_run(info, a, rows[0]);
    const bool second = rows[1] >= a && rows[1] < run.e;
    const index_t lo[2] = {run.lo, second ? info.lo[rows[1]] : 0}, hi[2] = {run.hi, second ? info.hi[rows[1]] : 0};
    a = run.e;
    if (run.g < 0) continue;
    const RowsAt<const float> K = kv.keys(run.g), V = kv.values(run.g);
    for (index_t j0 = run.ulo; j0 < run.uhi; j0 += tc_tile) {
      __syncthreads();  // Q (first tile) or the previous K, V consumed
      tc_stage<gemm_bf16, HD, 1>(sK, K.data, K.ld, j0, run.uhi, col0);
      tc_stage<gemm_bf16, HD, 1>(sV, V.data, V.ld, j0, run.uhi, col0);
      __syncthreads();
      int f_lo, f_hi;
      tc_column_blocks(run.wlo, run.whi, j0, f_lo, f_hi);
      if (f_lo >= f_hi) continue;  // the same for the whole warp
      mma_forward_tile<HD>(st, qf, sK, sV, j0, lo, hi, f_lo, f_hi, sl2);
    }
  }
  mma_forward_finish<HD>(
      st,
      [&](int r, int c, float x, float y) {
        if (info.g[rows[r]] < 0) return;
        float* p = out.data + (i0 + rows[r]) * out.ld + col0 + c;
        p[0] = x;
        p[1] = y;
      },
      [&](int r, float v) {
        if (info.g[rows[r]] >= 0) lse[(i0 + rows[r]) * L.heads + h] = v;
      });
#else
  (void)out, (void)lse, (void)q, (void)kv, (void)L, (void)scale, (void)error;
#endif
}

// The backward in one kernel (attention_tc.cuh's, FlashAttention-2's). Block = 64 key rows (with k_tok the packed
// key rows, a tile that may straddle groups; without, block x is (group, key tile) = (x / tiles, x % tiles) over
// every group's own nk keys, as the SIMT kernel). Per group of the tile, its query tiles; per tile and warp (16
// keys): Sᵀ = K Qᵀ, dPᵀ = V dOᵀ (wmma), Pᵀ = exp(scale·Sᵀ − lse), dSᵀ = Pᵀ ∘ (dPᵀ − D) inside the keys' query
// ranges, both rounded, dV += Pᵀ dO, dK += dSᵀ Q; then, after a barrier, warp w adds scale · dS K for the tile's
// queries 16w .. 16w + 15 to dq (atomicAdd), over the key warps whose multiplied column blocks hold those queries
// (the others' dSᵀ columns there are not written: no key of theirs sees them). At the end dk += scale · dK,
// dv += dV for the keys some query sees (each group's rows disjoint).
template <int Path, int HD, class KV, class DKV>
__global__ void attention_packed_tc_backward_kernel(MatrixView<float> dq, DKV dkv, MatrixView<const float> dout,
                                                    MatrixView<const float> out, const float* lse,
                                                    MatrixView<const float> q, KV kv, PackedLayout L, float scale) {
#if defined(MOM_TC_ATTENTION_BODY)
  using Lay = TcLayout<Path, HD>;
  using S = typename Lay::S;
  constexpr int LD = Lay::ld, SLD = Lay::sld, PLD = Lay::pld, NO = HD / 16;
  unsigned char* sm = dynamic_smem();
  const auto [sK, sV, sQ, sdO, sS, sdP, sP, sdS, sLse, sD] = tc_backward_smem<Path, HD>(sm);
  const TcRowInfo info = tc_row_info(sm + Lay::bwd_bytes);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const index_t h = blockIdx.y, col0 = h * L.hd;
  // dQ's vector atomics need every row's head slice 16-byte aligned (the usual layouts).
  const bool dq_aligned = dq.ld % 4 == 0 && aligned16(dq.data + col0);
  index_t j0;
  if (!tc_packed_key_rows<Path, HD>(L, info, kv, col0, sK, sV, j0)) return;
  TcAcc<Path> dk[NO], dv[NO];
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
  for (int a = 0; a < tc_tile;) {
    const auto [e, gg, ulo, uhi, wlo, whi, lo, hi] = tc_group_run(info, a, rr);
    a = e;
    if (gg < 0) continue;
    for (index_t i0 = ulo; i0 < uhi; i0 += tc_tile) {  // the query tiles that see a key of this group's rows
      __syncthreads();
      tc_stage<Path, HD>(sQ, q.data, q.ld, i0, uhi, col0);
      tc_stage_dout<Path, HD>(sdO, sD, sLse, dout.data, dout.ld, out.data, out.ld, lse + h, i0, uhi, col0, L.heads);
      __syncthreads();
      int f_lo, f_hi;
      tc_column_blocks(wlo, whi, i0, f_lo, f_hi);
      if (lane == 0) {
        info.f[2 * warp] = f_lo;
        info.f[2 * warp + 1] = f_hi;
      }
      if (f_lo < f_hi) {  // the same for the whole warp
        tc_products<Path, HD, true>(ss, sk, sQ, sdp, sv, sdO, f_lo, f_hi);
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
        tc_accumulate_dkdv<Path, HD>(dk, dv, sp, sds, sdO, sQ, 16 * f_lo, 16 * f_hi);  // dV += Pᵀ dO, dK += dSᵀ Q
      }
      __syncthreads();  // every warp's dSᵀ rows and column blocks written: dQ reads them across warps
      const unsigned kmask = tc_dq_key_warps(info);
      if (kmask != 0) {
        const index_t q0 = i0 + 16 * warp;
        tc_dq_from_dst<Path, HD>(sdS, sK, kmask, scale, ss, [&](int row, int c, float4 v) {
          if (q0 + row < uhi) atomic_add4(dq.data + (q0 + row) * dq.ld + col0 + c, v, dq_aligned);
        });
      }
    }
  }
  __syncthreads();  // K, V consumed: their space stages dK, then dV
  float* so = reinterpret_cast<float*>(sm) + 16 * warp * Lay::old;
  const auto put = [&](bool keys, float sc) {
    return [&, keys, sc](int row, int c, float v) {
      const int tr = 16 * warp + row, g = info.g[tr];
      if (g >= 0 && info.lo[tr] < info.hi[tr]) (keys ? dkv.keys(g) : dkv.values(g)).row(j0 + tr)[col0 + c] += sc * v;
    };
  };
  tc_write_rows<Path, HD>(dk, so, put(true, scale));
  tc_write_rows<Path, HD>(dv, so, put(false, 1.0f));
#else
  (void)dq, (void)dkv, (void)dout, (void)out, (void)lse, (void)q, (void)kv, (void)L, (void)scale;
#endif
}

// The backward in bf16 with P and dS in registers (attention_mma.cuh's warp work, with the keys' query ranges), the
// same blocks, tiles and dQ key warps as the wmma kernel above: the path for Precision::BF16. One group holding
// every token gives the dense mma kernel's bits.
template <int HD, class KV, class DKV>
__global__ void attention_packed_mma_backward_kernel(MatrixView<float> dq, DKV dkv, MatrixView<const float> dout,
                                                     MatrixView<const float> out, const float* lse,
                                                     MatrixView<const float> q, KV kv, PackedLayout L, float scale) {
#if defined(MOM_MMA_BF16)
  unsigned char* raw = dynamic_smem();
  const MmaBackwardSmem<HD> sm = mma_backward_smem<HD>(raw);
  const TcRowInfo info = tc_row_info(raw + MmaBackwardSmem<HD>::bytes);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4;
  const index_t h = blockIdx.y, col0 = h * L.hd;
  const bool dq_aligned = dq.ld % 4 == 0 && aligned16(dq.data + col0);
  index_t j0;
  if (!tc_packed_key_rows<gemm_bf16, HD>(L, info, kv, col0, sm.k, sm.v, j0)) return;
  MmaKeyGrads<HD> acc;
  mma_key_grads_start<HD>(acc);
  const int rows[2] = {16 * warp + g, 16 * warp + g + 8};  // this lane's keys of the tile
  const float sl2 = scale * mma_log2e;
  for (int a = 0; a < tc_tile;) {
    const TcRun run = tc_group_run(info, a, rows[0]);
    const bool second = rows[1] >= a && rows[1] < run.e;
    const index_t lo[2] = {run.lo, second ? info.lo[rows[1]] : 0}, hi[2] = {run.hi, second ? info.hi[rows[1]] : 0};
    a = run.e;
    if (run.g < 0) continue;
    for (index_t i0 = run.ulo; i0 < run.uhi; i0 += tc_tile) {  // the query tiles that see a key of this group's rows
      __syncthreads();
      tc_stage<gemm_bf16, HD>(sm.q, q.data, q.ld, i0, run.uhi, col0);
      tc_stage_dout<gemm_bf16, HD>(sm.dout, sm.d, sm.lse, dout.data, dout.ld, out.data, out.ld, lse + h, i0, run.uhi,
                                   col0, L.heads);
      __syncthreads();
      int f_lo, f_hi;
      tc_column_blocks(run.wlo, run.whi, i0, f_lo, f_hi);
      if (lane == 0) {
        info.f[2 * warp] = f_lo;
        info.f[2 * warp + 1] = f_hi;
      }
      if (f_lo < f_hi) mma_backward_tile<HD>(acc, sm, i0, lo, hi, f_lo, f_hi, sl2);  // the same for the whole warp
      __syncthreads();  // every warp's dSᵀ rows and column blocks written
      const unsigned kmask = tc_dq_key_warps(info);
      if (kmask != 0) {
        const index_t q0 = i0 + 16 * warp;
        mma_dq_tile<HD>(sm, kmask, scale, [&](int row, int c, float4 v) {
          if (q0 + row < run.uhi) atomic_add4(dq.data + (q0 + row) * dq.ld + col0 + c, v, dq_aligned);
        });
      }
    }
  }
  mma_key_grads_finish<HD>(acc, [&](int r, int c, float kx, float ky, float vx, float vy) {
    const int tr = rows[r], gg = info.g[tr];
    if (gg < 0 || info.lo[tr] >= info.hi[tr]) return;
    float* kr = dkv.keys(gg).row(j0 + tr) + col0 + c;
    float* vr = dkv.values(gg).row(j0 + tr) + col0 + c;
    kr[0] += scale * kx;
    kr[1] += scale * ky;
    vr[0] += vx;
    vr[1] += vy;
  });
#else
  (void)dq, (void)dkv, (void)dout, (void)out, (void)lse, (void)q, (void)kv, (void)L, (void)scale;
#endif
}

// ---- launchers: false when the path does not apply (attention_tc.cuh's with_tc_attention, the shared memory) ----

template <class T, class KV>
bool attention_packed_tc_forward(const Context& ctx, const char* op, MatrixView<T> out, T* lse, MatrixView<const T> q,
                                 const KV& kv, const PackedLayout& L) {
  return with_tc_attention<T>(ctx, L.hd, [&](auto path, auto hd) {
    constexpr int P = decltype(path)::value, HD = decltype(hd)::value;
    const dim3 grid(blocks_exact(L.nq, tc_tile), static_cast<unsigned>(L.heads));
    const float scale = 1.0f / std::sqrt(float(L.hd));
    if constexpr (P == gemm_bf16) {  // attention_mma.cuh's warp work: K and V tiles and the rows' facts
      constexpr std::size_t smem = 2 * TcLayout<P, HD>::tile + tc_row_info_bytes;
      constexpr auto kernel = attention_packed_mma_forward_kernel<HD, KV>;
      if (tc_kernel_usable<kernel>(ctx, smem)) {
        launch_smem(op, ctx, grid, tc_threads, smem, kernel, out, lse, q, kv, L, scale, ctx.error);
        return true;
      }
    }
    constexpr std::size_t smem = TcLayout<P, HD>::fwd_bytes + tc_row_info_bytes;
    constexpr auto kernel = attention_packed_tc_forward_kernel<P, HD, KV>;
    if (!tc_kernel_usable<kernel>(ctx, smem)) return false;
    launch_smem(op, ctx, grid, tc_threads, smem, kernel, out, lse, q, kv, L, scale, ctx.error);
    return true;
  });
}

template <class T, class KV, class DKV>
bool attention_packed_tc_backward(const Context& ctx, const char* op, MatrixView<T> dq, const DKV& dkv,
                                  MatrixView<const T> dout, MatrixView<const T> out, const T* lse, MatrixView<const T> q,
                                  const KV& kv, const PackedLayout& L) {
  return with_tc_attention<T>(ctx, L.hd, [&](auto path, auto hd) {
    constexpr int P = decltype(path)::value, HD = decltype(hd)::value;
    const float scale = 1.0f / std::sqrt(float(L.hd));
    // Key tiles: of the packed key rows (k_tok given), or of every group's own nk keys.
    const unsigned key_tiles = blocks_exact(L.nk, tc_tile);
    const unsigned key_blocks = L.k_tok ? key_tiles : key_tiles * static_cast<unsigned>(L.count);
    const dim3 grid(key_blocks, static_cast<unsigned>(L.heads));
    if constexpr (P == gemm_bf16) {  // attention_mma.cuh's warp work
      constexpr std::size_t smem = MmaBackwardSmem<HD>::bytes + tc_row_info_bytes;
      constexpr auto kernel = attention_packed_mma_backward_kernel<HD, KV, DKV>;
      if (tc_kernel_usable<kernel>(ctx, smem)) {
        launch_smem(op, ctx, grid, tc_threads, smem, kernel, dq, dkv, dout, out, lse, q, kv, L, scale);
        return true;
      }
    }
    constexpr std::size_t smem = TcLayout<P, HD>::bwd_bytes + tc_row_info_bytes;
    constexpr auto kernel = attention_packed_tc_backward_kernel<P, HD, KV, DKV>;
    if (!tc_kernel_usable<kernel>(ctx, smem)) return false;
    launch_smem(op, ctx, grid, tc_threads, smem, kernel, dq, dkv, dout, out, lse, q, kv, L, scale);
    return true;
  });
}

}  // namespace dev

}  // namespace mom::cuda

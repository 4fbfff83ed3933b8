#pragma once
// Stick-breaking attention (ModuleFormer, arXiv 2306.04640, §3.2; cpu/stick_breaking.hpp has the maths) on
// the CUDA cores: straightforward SIMT kernels for every scalar and head dim <= 128 (padded to HD = 32, 64
// or 128 as in attention.cuh), written for correctness first.
//
// Grouped / multi-query key-value heads (SbLayout): query head h reads key/value head h / (heads / kv_heads)
// of a [q (heads·hd) | k (kv_heads·hd) | v (kv_heads·hd)] row (kv_heads = heads: the usual [q | k | v]).
//
// - forward: grid (8-row query tiles, batch·heads), a warp per query row whose lanes take 32 keys at a time
//   (stick_breaking_forward_kernel); the running softplus suffix is kept in double, so
//   p_j = exp(log σ(z_j) − suffix) needs no second pass. A row stops computing once the suffix passes the
//   cutoff (every earlier weight is 0 in T), as on the CPU.
// - backward: two passes (FlashAttention-2's split; the maths above stick_breaking_backward_dq_kernel): dQ by
//   query rows (a warp each, lanes over 32 keys at a time), then dK, dV by key tiles of 64 (a block each, owning
//   its keys' sums: no atomics, deterministic), which continue each query row's softplus and g·p suffixes from a
//   table the first pass wrote (in the context's workspace, sized by the op).
// - decode: one thread per (row, query head), keys from the row's position down in the cache.
#include <cstddef>
#include <type_traits>

#include "mom/backend/cuda/kernels/attention.cuh"  // HeadLayout
#include "mom/backend/cuda/kernels/common.cuh"
#include "mom/backend/cuda/kernels/decode.cuh"  // decode_row: the decode ops' cache-row check

namespace mom::cuda {

namespace dev {

__device__ __forceinline__ float sb_log1p(float x) { return log1pf(x); }
__device__ __forceinline__ double sb_log1p(double x) { return log1p(x); }

// The cpu's stick_breaking_cutoff: a softplus suffix past which exp(log σ − suffix) is 0 in T.
template <class T>
inline constexpr double sb_cutoff = sizeof(T) == 4 ? 110.0 : 750.0;

// log σ(z), softplus(z) = −log(1 − σ(z)) and σ(z) from e = exp(−|z|) and l = log1p(e) (no overflow).
template <class T>
struct SbTerms {
  T lsig, sp, sig;
};
template <class T>
__device__ __forceinline__ SbTerms<T> sb_terms(T z) {
  const T e = exp_(z < T(0) ? z : -z);
  const T l = sb_log1p(e);
  SbTerms<T> r;
  r.lsig = (z < T(0) ? z : T(0)) - l;
  r.sp = (z > T(0) ? z : T(0)) + l;
  r.sig = (z >= T(0) ? T(1) : e) / (T(1) + e);
  return r;
}

// HeadLayout (attention.cuh; d = heads·hd, the query width) and the key/value heads.
struct SbLayout {
  HeadLayout head;
  index_t kv_heads;
  __host__ __device__ index_t group() const { return head.heads / kv_heads; }
  __host__ __device__ index_t k(index_t h) const { return head.d + (h / group()) * head.hd; }
  __host__ __device__ index_t v(index_t h) const { return head.d + (kv_heads + h / group()) * head.hd; }
};

// a · b over HD elements in four independent chains of FMAs (the chains' latency, not the FMA rate, bounds these
// kernels), added as (c0 + c1) + (c2 + c3): the forward and both backward passes compute z (and g) so, bit for bit.
template <class T, int HD>
__device__ __forceinline__ T sb_dot(const T* a, const T* b) {
  T c[4] = {T(0), T(0), T(0), T(0)};
#pragma unroll
  for (int k = 0; k < HD; ++k) c[k % 4] += a[k] * b[k];
  return (c[0] + c[1]) + (c[2] + c[3]);
}

// A warp's suffix sums over the 32 keys of a chunk (lane l's key jlo + l): lane l's value v goes to scratch; returns
// run + Σ over the lanes above l, added from the top lane down (the CPU's order over keys); run moves past the whole
// chunk in the same order (the same in every lane). Every lane of the warp calls it.
__device__ __forceinline__ double sb_suffix_scan(double v, double& run, double* scratch) {
  const int lane = int(threadIdx.x) % 32;
  scratch[lane] = v;
  __syncwarp();
  double above = run;
  for (int l = 31; l > lane; --l) above += scratch[l];
  for (int l = 31; l >= 0; --l) run += scratch[l];
  __syncwarp();  // scratch is free for the next call
  return above;
}

// Forward: a warp per query row (8 rows of one (sequence, head) a block), its 32 lanes over 32 keys at a time. The
// block stages 32 key rows (aligned to 32) in shared memory from its last row's diagonal down; lane l takes key
// jlo + l: z, log σ and softplus; the row's softplus suffix above each key is summed in double from the top key down
// (the CPU's order, so the same suffix bits), and p_j = exp(log σ_j − suffix_j). Then every lane adds Σ_j p_j v_j
// (keys top down, as the CPU) to its columns lane, lane + 32, ... of o, reading v's rows from memory (coalesced). A
// row stops once its suffix passes the cutoff (every earlier weight is 0 in T), the block once all its rows have.
inline constexpr int sb_forward_rows = 8, sb_forward_keys = 32;
template <class T, int HD>
__global__ void stick_breaking_forward_kernel(MatrixView<T> out, MatrixView<const T> qkv, SbLayout G, T scale) {
  static_assert(HD % 32 == 0, "head dims are padded to 32, 64 or 128");
  constexpr int W = sb_forward_rows, CH = sb_forward_keys, PER = HD / 32;
  const HeadLayout& L = G.head;
  __shared__ T sq[W][HD];
  __shared__ T sk[CH][HD + 1];
  __shared__ double ssp[W][CH];  // softplus(z) of each lane's key (0 for keys outside the row's causal range)
  __shared__ T sp[W][CH];        // p of each lane's key
  __shared__ int sdone[W];
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const index_t bh = blockIdx.y, b = bh / L.heads, h = bh % L.heads;
  const index_t i0 = index_t(blockIdx.x) * W, i = i0 + warp;
  const T* base = qkv.data + b * L.seq * L.qkv_ld;
  load_tile<T, W, HD, HD>(sq, base, L.qkv_ld, i0, L.seq, h * L.hd, L.hd);
  if (lane == 0) sdone[warp] = i >= L.seq;
  T o[PER];
#pragma unroll
  for (int q = 0; q < PER; ++q) o[q] = T(0);
  double suffix = 0;  // Σ softplus(z_j) over the keys above the current chunk
  // Chunks of keys [jlo, jlo + CH) aligned to CH (as the backward's), from the block's last row's diagonal down.
  for (index_t jlo = (min(i0 + W - 1, L.seq - 1) / CH) * CH; jlo >= 0; jlo -= CH) {
    __syncthreads();  // the previous chunk's readers are done with sk; sdone is current
    bool all_done = true;
#pragma unroll
    for (int w = 0; w < W; ++w) all_done = all_done && sdone[w];
    if (all_done) break;  // the same for every thread
    load_tile<T, CH, HD, HD + 1>(sk, base, L.qkv_ld, jlo, L.seq, G.k(h), L.hd);
    __syncthreads();
    if (sdone[warp] || jlo > i) continue;  // the same for the whole warp
    const bool valid = jlo + lane <= i;
    const SbTerms<T> t = sb_terms(sb_dot<T, HD>(sq[warp], sk[lane]) * scale);
    const double above = sb_suffix_scan(valid ? double(t.sp) : 0.0, suffix, ssp[warp]);  // the suffix above key j
    sp[warp][lane] = valid && above <= sb_cutoff<T> ? exp_(t.lsig - T(above)) : T(0);
    __syncwarp();
    for (int l = CH - 1; l >= 0; --l) {
      const T p = sp[warp][l];
      if (p == T(0)) continue;  // the same for the whole warp
      const T* vrow = base + (jlo + l) * L.qkv_ld + G.v(h);
#pragma unroll
      for (int q = 0; q < PER; ++q)
        if (lane + 32 * q < L.hd) o[q] += p * vrow[lane + 32 * q];
    }
    if (lane == 0) sdone[warp] = suffix > sb_cutoff<T>;
  }
  if (i >= L.seq) return;
  T* orow = out.data + (b * L.seq + i) * out.ld + h * L.hd;
#pragma unroll
  for (int q = 0; q < PER; ++q)
    if (lane + 32 * q < L.hd) orow[lane + 32 * q] = o[q];
}

// ---- backward: two passes, FlashAttention-2's split (dQ by query rows, dK / dV by key tiles) ----------------------
//
// For query row i and key j <= i (z = q_i·k_j, p_j = σ(z_j) Π_{j<j'<=i} (1 − σ(z_j')), g_j = dO_i·v_j,
// D_i = dO_i·o_i = Σ_j g_j p_j, G_{>j} = Σ_{j'>j} g_j' p_j'): dz_j = g_j p_j − σ_j (D_i − G_{>j}) (the prefix sum of
// g p from D, as softmax attention's backward), dq_i = scale Σ_j dz_j k_j, dk_j = scale Σ_i dz_ij q_i,
// dv_j = Σ_i p_ij dO_i. Both passes walk keys in chunks of 32 (a lane each) aligned to 32, from the row's diagonal
// down; pass 1 (a warp per query row) writes dQ and, at the top of every key tile of sb_key_tile keys, the row's
// running softplus and g·p suffixes (double) into `table`; pass 2 (a block per key tile and key/value head) takes
// each query row's suffixes at its tile from there and recomputes the tile's p and dz with the same code and the
// same order of additions (the same bits), so that every block owns its keys' dK, dV: no atomics, deterministic.
inline constexpr int sb_key_tile = int(stick_breaking_key_tile);  // keys of pass 2's tiles (kernels.hpp): two chunks of 32
// The table (stick_breaking_table_bytes): for sequence b, query head h and row i, at ((b·heads + h)·seq + i)·
// sb_table_stride(seq): D_i, then (softplus suffix, g·p suffix) above each key tile t <= i / sb_key_tile.
__host__ __device__ inline index_t sb_table_stride(index_t seq) { return 1 + 2 * ((seq + sb_key_tile - 1) / sb_key_tile); }

// One chunk of 32 keys of query row i, lane l taking key jlo + l (its k and v rows at krow, vrow; the row's q and
// dO at q, dO; valid: jlo + l <= i): p and scale·dz of the lane's key, 0 past the cutoff. suffix and gsum are the
// softplus and g·p sums above the chunk; each lane's sums above its key continue them from the chunk's top down (the
// CPU's order), and both move past the chunk (the same in every lane). ssp, sgp: the warp's 32 doubles of scratch.
template <class T, int HD>
__device__ void sb_backward_chunk(const T* q, const T* dO, const T* krow, const T* vrow, bool valid, T scale, double di,
                                  double& suffix, double& gsum, double* ssp, double* sgp, T& p, T& dz) {
  const T g = sb_dot<T, HD>(dO, vrow);
  const SbTerms<T> t = sb_terms(sb_dot<T, HD>(q, krow) * scale);
  const double above = sb_suffix_scan(valid ? double(t.sp) : 0.0, suffix, ssp);
  const bool live = valid && above <= sb_cutoff<T>;
  p = live ? exp_(t.lsig - T(above)) : T(0);
  const double gp = live ? double(g) * double(p) : 0.0;
  const double g_above = sb_suffix_scan(gp, gsum, sgp);
  dz = live ? T(double(scale) * (gp - double(t.sig) * (di - g_above))) : T(0);
}

inline constexpr int sb_rows = 8;  // query rows (warps) of a backward block
// A backward pass's dynamic shared memory: the warps' suffix scratch (doubles), q and dO of the block's query rows,
// k and v of Keys keys, and Vals per-key values of each row (pass 1: scale·dz of a chunk; pass 2: p, scale·dz).
template <class T, int HD, int Keys, int Vals>
struct SbSmem {
  static constexpr std::size_t bytes =
      sizeof(double) * 2 * sb_rows * 32 + sizeof(T) * (2 * sb_rows * HD + 2 * Keys * (HD + 1) + Vals * sb_rows * Keys);
  double (*ssp)[32], (*sgp)[32];
  T (*sq)[HD], (*sdo)[HD], (*sk)[HD + 1], (*sv)[HD + 1], (*vals)[sb_rows][Keys];
  __device__ explicit SbSmem(unsigned char* raw) {
    double* const d = reinterpret_cast<double*>(raw);
    ssp = reinterpret_cast<double(*)[32]>(d);
    sgp = reinterpret_cast<double(*)[32]>(d + sb_rows * 32);
    T* const t = reinterpret_cast<T*>(d + 2 * sb_rows * 32);
    sq = reinterpret_cast<T(*)[HD]>(t);
    sdo = reinterpret_cast<T(*)[HD]>(t + sb_rows * HD);
    sk = reinterpret_cast<T(*)[HD + 1]>(t + 2 * sb_rows * HD);
    sv = reinterpret_cast<T(*)[HD + 1]>(t + 2 * sb_rows * HD + Keys * (HD + 1));
    vals = reinterpret_cast<T(*)[sb_rows][Keys]>(t + 2 * sb_rows * HD + 2 * Keys * (HD + 1));
  }
};
template <class T, int HD>
using SbDqSmem = SbSmem<T, HD, 32, 1>;
template <class T, int HD>
using SbDkvSmem = SbSmem<T, HD, sb_key_tile, 2>;

// Pass 1: grid (8-row query tiles, batch·heads), a warp per query row: dQ_i += Σ_j scale·dz_j k_j over the lane's
// columns; D_i and the suffixes at each key tile's top into the table.
template <class T, int HD>
__global__ void stick_breaking_backward_dq_kernel(MatrixView<T> dqkv, MatrixView<const T> dout, MatrixView<const T> out,
                                                  MatrixView<const T> qkv, SbLayout G, T scale, double* table) {
  constexpr int W = sb_rows, CH = 32, PER = HD / 32;
  const HeadLayout& L = G.head;
  const SbDqSmem<T, HD> sm(dynamic_smem());
  const auto sq = sm.sq, sdo = sm.sdo;
  const auto sk = sm.sk, sv = sm.sv;
  const auto sdz = sm.vals[0];
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const index_t bh = blockIdx.y, b = bh / L.heads, h = bh % L.heads;
  const index_t i0 = index_t(blockIdx.x) * W, i = i0 + warp;
  const T* base = qkv.data + b * L.seq * L.qkv_ld;
  const T* dbase = dout.data + b * L.seq * dout.ld;
  load_tile<T, W, HD, HD>(sq, base, L.qkv_ld, i0, L.seq, h * L.hd, L.hd);
  load_tile<T, W, HD, HD>(sdo, dbase, dout.ld, i0, L.seq, h * L.hd, L.hd);
  __syncthreads();
  double* const trow = table + (bh * L.seq + i) * sb_table_stride(L.seq);
  T di = T(0);  // D_i = dO_i·o_i, every lane the same
  if (i < L.seq) {
    const T* orow = out.data + (b * L.seq + i) * out.ld + h * L.hd;
    for (index_t c = 0; c < L.hd; ++c) di += sdo[warp][c] * orow[c];
    if (lane == 0) trow[0] = double(di);
  }
  T dq[PER];
#pragma unroll
  for (int q = 0; q < PER; ++q) dq[q] = T(0);
  double suffix = 0, gsum = 0;
  for (index_t jlo = (min(i0 + W - 1, L.seq - 1) / CH) * CH; jlo >= 0; jlo -= CH) {
    __syncthreads();  // the previous chunk's readers are done with sk, sv
    load_tile<T, CH, HD, HD + 1>(sk, base, L.qkv_ld, jlo, L.seq, G.k(h), L.hd);
    load_tile<T, CH, HD, HD + 1>(sv, base, L.qkv_ld, jlo, L.seq, G.v(h), L.hd);
    __syncthreads();
    if (i >= L.seq || jlo > i) continue;  // the same for the whole warp
    if (lane == 0 && ((jlo + CH) % sb_key_tile == 0 || jlo + CH > i)) {  // the top of a key tile, or the diagonal's
      trow[1 + 2 * (jlo / sb_key_tile)] = suffix;
      trow[2 + 2 * (jlo / sb_key_tile)] = gsum;
    }
    T p, dz;
    sb_backward_chunk<T, HD>(sq[warp], sdo[warp], sk[lane], sv[lane], jlo + lane <= i, scale, double(di), suffix, gsum,
                             sm.ssp[warp], sm.sgp[warp], p, dz);
    sdz[warp][lane] = dz;
    __syncwarp();
    for (int l = CH - 1; l >= 0; --l) {
      const T d = sdz[warp][l];
      if (d == T(0)) continue;  // the same for the whole warp
#pragma unroll
      for (int q = 0; q < PER; ++q) dq[q] += d * sk[l][lane + 32 * q];
    }
    __syncwarp();
  }
  if (i >= L.seq) return;
  T* qrow = dqkv.data + (b * L.seq + i) * dqkv.ld + h * L.hd;
#pragma unroll
  for (int q = 0; q < PER; ++q)
    if (lane + 32 * q < L.hd) qrow[lane + 32 * q] += dq[q];
}

// Pass 2: grid (key tiles, batch·kv_heads), 8 warps. The block stages its tile's k, v rows once; for each query head
// of the key/value head and each 8 query rows from the tile's first key on, a warp per row recomputes the tile's p
// and scale·dz from the row's suffixes in the table, then thread (warp w, lane l) adds the 8 rows' p·dO and dz·q to
// its keys w·8 .. w·8 + 7 at columns l, l + 32, ... in registers (rows in order: deterministic).
template <class T, int HD>
__global__ void stick_breaking_backward_dkv_kernel(MatrixView<T> dqkv, MatrixView<const T> dout, MatrixView<const T> qkv,
                                                   SbLayout G, T scale, const double* table) {
  constexpr int W = sb_rows, CH = 32, BK = sb_key_tile, KPW = BK / W, PER = HD / 32;
  const HeadLayout& L = G.head;
  const SbDkvSmem<T, HD> sm(dynamic_smem());
  const auto sq = sm.sq, sdo = sm.sdo;
  const auto sk = sm.sk, sv = sm.sv;
  const auto sp = sm.vals[0], sdz = sm.vals[1];
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const index_t tile = blockIdx.x, j0 = tile * BK, bk = blockIdx.y, b = bk / G.kv_heads, kh = bk % G.kv_heads;
  const index_t h0 = kh * G.group(), stride = sb_table_stride(L.seq);
  const T* base = qkv.data + b * L.seq * L.qkv_ld;
  const T* dbase = dout.data + b * L.seq * dout.ld;
  load_tile<T, BK, HD, HD + 1>(sk, base, L.qkv_ld, j0, L.seq, G.k(h0), L.hd);
  load_tile<T, BK, HD, HD + 1>(sv, base, L.qkv_ld, j0, L.seq, G.v(h0), L.hd);
  T dk[KPW][PER], dv[KPW][PER];
#pragma unroll
  for (int kk = 0; kk < KPW; ++kk)
#pragma unroll
    for (int q = 0; q < PER; ++q) dk[kk][q] = dv[kk][q] = T(0);
  for (index_t h = h0; h < h0 + G.group(); ++h)
    for (index_t r0 = j0; r0 < L.seq; r0 += W) {
      __syncthreads();  // the previous rows' readers are done with sq, sdo, sp, sdz
      load_tile<T, W, HD, HD>(sq, base, L.qkv_ld, r0, L.seq, h * L.hd, L.hd);
      load_tile<T, W, HD, HD>(sdo, dbase, dout.ld, r0, L.seq, h * L.hd, L.hd);
      __syncthreads();
      const index_t i = r0 + warp;
      if (i < L.seq) {
        const double* trow = table + ((b * L.heads + h) * L.seq + i) * stride;
        double suffix = trow[1 + 2 * tile], gsum = trow[2 + 2 * tile];
        for (int c = BK / CH - 1; c >= 0; --c) {  // the tile's chunks, top first (above the diagonal: all zeros)
          T p, dz;
          sb_backward_chunk<T, HD>(sq[warp], sdo[warp], sk[c * CH + lane], sv[c * CH + lane], j0 + c * CH + lane <= i,
                                   scale, trow[0], suffix, gsum, sm.ssp[warp], sm.sgp[warp], p, dz);
          sp[warp][c * CH + lane] = p;
          sdz[warp][c * CH + lane] = dz;
        }
      } else {
        for (int c = lane; c < BK; c += 32) sp[warp][c] = sdz[warp][c] = T(0);
      }
      __syncthreads();
      for (int r = 0; r < W; ++r)
#pragma unroll
        for (int kk = 0; kk < KPW; ++kk) {
          const T pv = sp[r][warp * KPW + kk], dzv = sdz[r][warp * KPW + kk];
#pragma unroll
          for (int q = 0; q < PER; ++q) {
            dv[kk][q] += pv * sdo[r][lane + 32 * q];
            dk[kk][q] += dzv * sq[r][lane + 32 * q];
          }
        }
    }
#pragma unroll
  for (int kk = 0; kk < KPW; ++kk) {
    const index_t j = j0 + warp * KPW + kk;
    if (j >= L.seq) continue;
    T* krow = dqkv.data + (b * L.seq + j) * dqkv.ld + G.k(h0);
    T* vrow = dqkv.data + (b * L.seq + j) * dqkv.ld + G.v(h0);
#pragma unroll
    for (int q = 0; q < PER; ++q)
      if (lane + 32 * q < L.hd) {
        krow[lane + 32 * q] += dk[kk][q];
        vrow[lane + 32 * q] += dv[kk][q];
      }
  }
}

// Thread = (row r, head h): sequence slot[r] at position pos[r], keys pos[r] down to 0 from the cache.
template <class T, int HD>
__global__ void stick_breaking_decode_kernel(MatrixView<T> out, MatrixView<const T> qkv, MatrixView<const T> k_cache,
                                             MatrixView<const T> v_cache, const index_t* slot, const index_t* pos,
                                             index_t max_len, index_t heads, index_t kv_heads, index_t hd, T scale,
                                             int* error) {
  const index_t rh = index_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (rh >= qkv.rows * heads) return;
  const index_t r = rh / heads, h = rh % heads, slots = k_cache.rows / max_len, kc = (h / (heads / kv_heads)) * hd;
  if (!decode_row(slot, pos, r, slots, max_len, h == 0, error, DeviceError::decode_position)) return;
  const index_t s = slot[r], p = pos[r];
  T q[HD], o[HD];
#pragma unroll
  for (int c = 0; c < HD; ++c) {
    q[c] = c < hd ? qkv.data[r * qkv.ld + h * hd + c] : T(0);
    o[c] = T(0);
  }
  double suffix = 0;
  for (index_t j = p; j >= 0 && suffix <= sb_cutoff<T>; --j) {
    const T* k = k_cache.data + (s * max_len + j) * k_cache.ld + kc;
    const T* v = v_cache.data + (s * max_len + j) * v_cache.ld + kc;
    T z = T(0);
#pragma unroll
    for (int c = 0; c < HD; ++c)
      if (c < hd) z += q[c] * k[c];
    const SbTerms<T> t = sb_terms(z * scale);
    const T w = exp_(t.lsig - T(suffix));
    suffix += double(t.sp);
#pragma unroll
    for (int c = 0; c < HD; ++c)
      if (c < hd) o[c] += w * v[c];
  }
  T* orow = out.data + r * out.ld + h * hd;
#pragma unroll
  for (int c = 0; c < HD; ++c)
    if (c < hd) orow[c] = o[c];
}

template <class T, int HD>
void stick_breaking_forward_hd(const Context& ctx, MatrixView<T> out, MatrixView<const T> qkv, SbLayout G,
                               index_t batch) {
  const dim3 grid(blocks_exact(G.head.seq, sb_forward_rows), static_cast<unsigned>(batch * G.head.heads));
  launch("stick_breaking_forward", ctx, grid, sb_forward_rows * 32, stick_breaking_forward_kernel<T, HD>, out, qkv, G,
         T(1) / std::sqrt(T(G.head.hd)));
}
template <class T, int HD>
void stick_breaking_backward_hd(const Context& ctx, MatrixView<T> dqkv, MatrixView<const T> dout,
                                MatrixView<const T> out, MatrixView<const T> qkv, SbLayout G, index_t batch) {
  const T scale = T(1) / std::sqrt(T(G.head.hd));
  constexpr auto dq_kernel = stick_breaking_backward_dq_kernel<T, HD>;
  constexpr auto dkv_kernel = stick_breaking_backward_dkv_kernel<T, HD>;
  constexpr std::size_t dq_smem = SbDqSmem<T, HD>::bytes, dkv_smem = SbDkvSmem<T, HD>::bytes;
  MOM_CHECK(smem_fits<dq_kernel>(ctx, dq_smem) && smem_fits<dkv_kernel>(ctx, dkv_smem),
            "stick_breaking_backward: head dim ", HD, " needs ", dkv_smem / 1024,
            " KiB of shared memory a block, more than this GPU gives");
  auto* table = static_cast<double*>(ctx.workspace);  // sized by the op (stick_breaking_table_bytes)
  launch_smem("stick_breaking_backward", ctx, dim3(blocks_exact(G.head.seq, sb_rows), unsigned(batch * G.head.heads)),
              sb_rows * 32, dq_smem, dq_kernel, dqkv, dout, out, qkv, G, scale, table);
  launch_smem("stick_breaking_backward", ctx, dim3(blocks_exact(G.head.seq, sb_key_tile), unsigned(batch * G.kv_heads)),
              sb_rows * 32, dkv_smem, dkv_kernel, dqkv, dout, qkv, G, scale,
              static_cast<const double*>(table));
}
template <class T, int HD>
void stick_breaking_decode_hd(const Context& ctx, MatrixView<T> out, MatrixView<const T> qkv,
                              MatrixView<const T> k_cache, MatrixView<const T> v_cache, const index_t* slot,
                              const index_t* pos, index_t max_len, index_t heads, index_t kv_heads, index_t hd) {
  constexpr int per_block = 64;
  launch("stick_breaking_decode", ctx, dim3(blocks_exact(qkv.rows * heads, per_block)), per_block,
         stick_breaking_decode_kernel<T, HD>, out, qkv, k_cache, v_cache, slot, pos, max_len, heads, kv_heads, hd,
         T(1) / std::sqrt(T(hd)), ctx.error);
}

}  // namespace dev

template <class T>
void Kernels<T>::stick_breaking_forward(const Context& ctx, M out, CM qkv, index_t batch, index_t seq, index_t heads,
                                        index_t kv_heads) {
  const index_t hd = qkv.cols / (heads + 2 * kv_heads);
  const dev::SbLayout G{{seq, heads, heads * hd, hd, qkv.ld, out.ld}, kv_heads};
  if (hd <= 32) dev::stick_breaking_forward_hd<T, 32>(ctx, out, qkv, G, batch);
  else if (hd <= 64) dev::stick_breaking_forward_hd<T, 64>(ctx, out, qkv, G, batch);
  else dev::stick_breaking_forward_hd<T, 128>(ctx, out, qkv, G, batch);
}
template <class T>
void Kernels<T>::stick_breaking_backward(const Context& ctx, M dqkv, CM dout, CM out, CM qkv, index_t batch,
                                         index_t seq, index_t heads, index_t kv_heads) {
  const index_t hd = qkv.cols / (heads + 2 * kv_heads);
  const dev::SbLayout G{{seq, heads, heads * hd, hd, qkv.ld, out.ld}, kv_heads};
  if (hd <= 32) dev::stick_breaking_backward_hd<T, 32>(ctx, dqkv, dout, out, qkv, G, batch);
  else if (hd <= 64) dev::stick_breaking_backward_hd<T, 64>(ctx, dqkv, dout, out, qkv, G, batch);
  else dev::stick_breaking_backward_hd<T, 128>(ctx, dqkv, dout, out, qkv, G, batch);
}
template <class T>
void Kernels<T>::stick_breaking_decode(const Context& ctx, M out, CM qkv, CM k_cache, CM v_cache, const index_t* slot,
                                       const index_t* pos, index_t max_len, index_t heads, index_t kv_heads) {
  const index_t hd = k_cache.cols / kv_heads;
  if (hd <= 32)
    dev::stick_breaking_decode_hd<T, 32>(ctx, out, qkv, k_cache, v_cache, slot, pos, max_len, heads, kv_heads, hd);
  else if (hd <= 64)
    dev::stick_breaking_decode_hd<T, 64>(ctx, out, qkv, k_cache, v_cache, slot, pos, max_len, heads, kv_heads, hd);
  else
    dev::stick_breaking_decode_hd<T, 128>(ctx, out, qkv, k_cache, v_cache, slot, pos, max_len, heads, kv_heads, hd);
}

}  // namespace mom::cuda

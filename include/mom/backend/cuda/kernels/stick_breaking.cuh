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
// - backward: one block per (sequence, key/value head), so that the block owns its dK, dV columns (no
//   atomics, deterministic): its query heads in turn, for each the query tiles in turn, per query tile the
//   key tiles from the diagonal down (tiles of 64 rows in float, sb_backward_tile_large). Each thread (a query
//   row i) recomputes z, p and σ, and with D_i = dO_i·o_i = Σ_j g_j p_j (read from forward's out, as softmax
//   attention's backward does) gets the prefix Σ_{j'<=j} g_j' p_j' = D_i − Σ_{j'>j} g_j' p_j' from the suffix
//   it has walked: dz_j = g_j p_j − σ_j (D_i − G_{>j}), dq_i += scale dz_j k_j in registers. The tile's p and scale·dz go
//   to shared memory; then thread t takes key j0 + t and adds Σ_i p_{j,i} dO_i and Σ_i scale·dz_{j,i} q_i
//   to dV_j and dK_j (key j is always thread j % BT's, whichever query head: no race).
// - decode: one thread per (row, query head), keys from the row's position down in the cache.
#include <cstddef>
#include <type_traits>

#include "mom/backend/cuda/kernels/attention.cuh"  // HeadLayout, load_tile
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

// Backward's tile of BT rows: q, dO, k, v rows plus two [BT × BT] blocks, in dynamic shared memory. Float takes
// 64 rows (34 KB at head dim 32, 164 KB at 128) where the device allows it: each block's chain of dependent work
// is about S²·HD / BT per thread, so BT sets its speed (the block count is batch · kv_heads, often below the SM
// count). Double, or a device with less opt-in shared memory, takes the rows that fit the 48 KB every device gives.
template <class T, int HD>
inline constexpr int sb_backward_tile_small = std::min(32, 6144 / (HD * int(sizeof(T))));
inline constexpr int sb_backward_tile_large = 64;
template <class T, int HD, int BT>
inline constexpr std::size_t sb_backward_smem = sizeof(T) * (2 * BT * (HD + 1) + 2 * BT * HD + 2 * BT * (BT + 1));

// Forward: a warp per query row (8 rows of one (sequence, head) a block), its 32 lanes over 32 keys at a time. The
// block stages 32 key rows in shared memory from the top row's diagonal down; lane l takes key j0 + l: z, log σ and
// softplus; the row's softplus suffix above each key is summed in double from the top key down (the CPU's order, so
// the same suffix bits), and p_j = exp(log σ_j − suffix_j). Then every lane adds Σ_j p_j v_j (keys top down, as
// the CPU) to its columns lane, lane + 32, ... of o, reading v's rows from memory (coalesced). A row stops once its
// suffix passes the cutoff (every earlier weight is 0 in T), the block once all its rows have.
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
  for (int e = int(threadIdx.x); e < W * HD; e += W * 32) {
    const index_t r = i0 + e / HD, c = e % HD;
    sq[e / HD][c] = r < L.seq && c < L.hd ? base[r * L.qkv_ld + h * L.hd + c] : T(0);
  }
  if (lane == 0) sdone[warp] = i >= L.seq;
  T o[PER];
#pragma unroll
  for (int q = 0; q < PER; ++q) o[q] = T(0);
  double suffix = 0;  // Σ softplus(z_j) over the keys above the current chunk
  const index_t top = min(i0 + W - 1, L.seq - 1);
  for (index_t jhi = top; jhi >= 0; jhi -= CH) {  // chunks of keys [jhi − CH + 1, jhi], from the diagonal down
    __syncthreads();  // the previous chunk's readers are done with sk; sdone is current
    bool all_done = true;
#pragma unroll
    for (int w = 0; w < W; ++w) all_done = all_done && sdone[w];
    if (all_done) break;  // the same for every thread
    const index_t jlo = jhi - CH + 1;
    for (int e = int(threadIdx.x); e < CH * HD; e += W * 32) {
      const index_t j = jlo + e / HD, c = e % HD;
      sk[e / HD][c] = j >= 0 && c < L.hd ? base[j * L.qkv_ld + G.k(h) + c] : T(0);
    }
    __syncthreads();
    if (sdone[warp]) continue;  // the same for the whole warp
    const index_t j = jlo + lane;
    const bool valid = j >= 0 && j <= i;
    T z4[4] = {T(0), T(0), T(0), T(0)};  // four independent FMA chains
#pragma unroll
    for (int c = 0; c < HD; ++c) z4[c % 4] += sq[warp][c] * sk[lane][c];
    const SbTerms<T> t = sb_terms(((z4[0] + z4[1]) + (z4[2] + z4[3])) * scale);
    ssp[warp][lane] = valid ? double(t.sp) : 0.0;
    __syncwarp();
    double above = suffix;  // the suffix above key j, summed from the top key down
    for (int l = CH - 1; l > lane; --l) above += ssp[warp][l];
    sp[warp][lane] = valid && above <= sb_cutoff<T> ? exp_(t.lsig - T(above)) : T(0);
    for (int l = CH - 1; l >= 0; --l) suffix += ssp[warp][l];  // every lane: the same sum in the same order
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

template <class T, int HD, int BT>
__global__ void stick_breaking_backward_kernel(MatrixView<T> dqkv, MatrixView<const T> dout, MatrixView<const T> out,
                                               MatrixView<const T> qkv, SbLayout G, T scale) {
  const HeadLayout& L = G.head;
  T* const smem = reinterpret_cast<T*>(dynamic_smem());  // sb_backward_smem<T, HD, BT> bytes
  const auto sq = reinterpret_cast<T(*)[HD + 1]>(smem);
  const auto sdo = reinterpret_cast<T(*)[HD + 1]>(smem + BT * (HD + 1));
  const auto sk = reinterpret_cast<T(*)[HD]>(smem + 2 * BT * (HD + 1));
  const auto sv = reinterpret_cast<T(*)[HD]>(smem + 2 * BT * (HD + 1) + BT * HD);
  const auto sp = reinterpret_cast<T(*)[BT + 1]>(smem + 2 * BT * (HD + 1) + 2 * BT * HD);  // p_{j0+jj, i0+ii} at [ii][jj]
  const auto sdz = reinterpret_cast<T(*)[BT + 1]>(smem + 2 * BT * (HD + 1) + 2 * BT * HD + BT * (BT + 1));  // scale·dz
  const index_t bk = blockIdx.x, b = bk / G.kv_heads, kh = bk % G.kv_heads;
  const T* base = qkv.data + b * L.seq * L.qkv_ld;
  const T* dbase = dout.data + b * L.seq * dout.ld;
  // Key j is always thread j % BT's in the key role, so the query heads' dK, dV sums never race.
  for (index_t h = kh * G.group(); h < (kh + 1) * G.group(); ++h)
  for (index_t i0 = 0; i0 < L.seq; i0 += BT) {
    __syncthreads();  // the previous query tile's key pass is done with sq, sdo
    load_tile<T, BT, HD, HD + 1>(sq, base, L.qkv_ld, i0, L.seq, h * L.hd, L.hd);
    load_tile<T, BT, HD, HD + 1>(sdo, dbase, dout.ld, i0, L.seq, h * L.hd, L.hd);
    __syncthreads();
    const index_t i = i0 + threadIdx.x;
    T di = T(0);  // D_i = dO_i·o_i = Σ_j g_j p_j
    if (i < L.seq) {
      const T* orow = out.data + (b * L.seq + i) * out.ld + h * L.hd;
      for (index_t c = 0; c < L.hd; ++c) di += sdo[threadIdx.x][c] * orow[c];
    }
    double suffix = 0, g_above = 0;  // Σ softplus and Σ g p over the keys above the current one
    T dq[HD];
#pragma unroll
    for (int c = 0; c < HD; ++c) dq[c] = T(0);
    for (index_t j0 = i0; j0 >= 0; j0 -= BT) {
      __syncthreads();  // the previous key pass is done with sp, sdz
      load_tile<T, BT, HD, HD>(sk, base, L.qkv_ld, j0, L.seq, G.k(h), L.hd);
      load_tile<T, BT, HD, HD>(sv, base, L.qkv_ld, j0, L.seq, G.v(h), L.hd);
      __syncthreads();
      for (int jj = BT - 1; jj >= 0; --jj) {
        T pv = T(0), dzv = T(0);
        if (i < L.seq && j0 + jj <= i && suffix <= sb_cutoff<T>) {
          // Four partial sums each: independent chains of FMAs (the chain's latency, not the FMA rate, bounds
          // a block of so few warps).
          T z4[4] = {T(0), T(0), T(0), T(0)}, g4[4] = {T(0), T(0), T(0), T(0)};
#pragma unroll
          for (int c = 0; c < HD; ++c) {
            z4[c % 4] += sq[threadIdx.x][c] * sk[jj][c];
            g4[c % 4] += sdo[threadIdx.x][c] * sv[jj][c];
          }
          const T z = (z4[0] + z4[1]) + (z4[2] + z4[3]), g = (g4[0] + g4[1]) + (g4[2] + g4[3]);
          const SbTerms<T> t = sb_terms(z * scale);
          pv = exp_(t.lsig - T(suffix));
          suffix += double(t.sp);
          const double gp = double(g) * double(pv);
          dzv = T(double(scale) * (gp - double(t.sig) * (double(di) - g_above)));  // prefix = D − G_{>j}
          g_above += gp;
#pragma unroll
          for (int c = 0; c < HD; ++c) dq[c] += dzv * sk[jj][c];
        }
        sp[threadIdx.x][jj] = pv;
        sdz[threadIdx.x][jj] = dzv;
      }
      __syncthreads();
      const index_t j = j0 + threadIdx.x;  // key role: this thread's key of the tile
      if (j < L.seq) {
        T* krow = dqkv.data + (b * L.seq + j) * dqkv.ld + G.k(h);
        T* vrow = dqkv.data + (b * L.seq + j) * dqkv.ld + G.v(h);
        for (index_t c = 0; c < L.hd; ++c) {
          T ak = T(0), av = T(0);
          for (int ii = 0; ii < BT; ++ii) {
            ak += sdz[ii][threadIdx.x] * sq[ii][c];
            av += sp[ii][threadIdx.x] * sdo[ii][c];
          }
          krow[c] += ak;
          vrow[c] += av;
        }
      }
    }
    if (i < L.seq) {
      T* qrow = dqkv.data + (b * L.seq + i) * dqkv.ld + h * L.hd;
#pragma unroll
      for (int c = 0; c < HD; ++c)
        if (c < L.hd) qrow[c] += dq[c];
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
  const dim3 grid(static_cast<unsigned>(batch * G.kv_heads));
  const T scale = T(1) / std::sqrt(T(G.head.hd));
  if constexpr (std::is_same_v<T, float>) {
    constexpr int BT = sb_backward_tile_large;
    constexpr auto kernel = stick_breaking_backward_kernel<T, HD, BT>;
    if (smem_fits<kernel>(ctx, sb_backward_smem<T, HD, BT>)) {
      launch_smem("stick_breaking_backward", ctx, grid, BT, sb_backward_smem<T, HD, BT>, kernel, dqkv, dout, out, qkv,
                  G, scale);
      return;
    }
  }
  constexpr int BT = sb_backward_tile_small<T, HD>;
  launch_smem("stick_breaking_backward", ctx, grid, BT, sb_backward_smem<T, HD, BT>,
              stick_breaking_backward_kernel<T, HD, BT>, dqkv, dout, out, qkv, G, scale);
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

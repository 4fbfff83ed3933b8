#pragma once
// The grouped GEMMs' bf16 tile on mma.sync (Precision::BF16; grouped_linear.cuh's gemm_run takes it for gemm_bf16):
// C(m0 + i, n0 + j) = Σ_{k<K} A(m0 + i, k) · B(k, n0 + j) for i, j < BM (128, or 64 for small weight gradients), the
// operands rounded to bf16 (nearest even) when staged, fp32 accumulation; the same operand layouts (KC or not, a row
// list fused into the loads) and epilogue epi(i, j, value) as gemm_tile.cuh's tiles.
//
// 256 threads; k steps of 32 through two shared-memory stages (one barrier a step; the next step's operands are
// loaded into registers while the current step is multiplied). Each thread loads float4s along an operand's
// contiguous dimension (16-byte loads where the rows allow: ld a multiple of 4 and a 16-byte aligned base; else
// element by element, out-of-range elements as 0) and stores them as bf16 in the same orientation: KC operands
// [i][k] with rows of bk + 8, the others [k][i] with rows of BM + 8 (ldmatrix's eight 16-byte rows fall in distinct
// banks either way). Fragments come through ldmatrix, transposed where the stored orientation is the other one
// (mma.cuh's mma_lane_a / mma_lane_b): a warp owns BM / 2 × BM / 4 of the tile (the 8 warps are 2 rows × 4
// columns), BM / 32 × BM / 32 accumulators of 16 × 8, and issues BM² / 512 · 2 products a step (32 at BM = 128; the
// wmma tile issued 8 a barrier). The epilogue reads the accumulators in place (no shared-memory staging). Each
// output is the same k-ordered chain of 16-deep products at either BM (the same bits). want_asum (A not KC): the
// thread's 4 columns of A are summed in full precision from its loaded values (the fused bias gradient), the
// partial sums met in shared memory in a fixed order.
#include <cstdint>

#include "mom/backend/cuda/kernels/gemm_tile.cuh"
#include "mom/backend/cuda/kernels/mma.cuh"

namespace mom::cuda {

namespace dev {

template <int BM>
struct MmaGemmTile {
  static_assert(BM == 128 || BM == 64, "the mma tile is 128 x 128 or 64 x 64");
  static constexpr int bk = 32;
  static constexpr int fi = BM / 32, fj = BM / 32;  // a warp's 16-row and 8-column accumulator tiles
  static constexpr int ld_kc = bk + 8, ld_kn = BM + 8;  // stored rows: [i][k] (KC) and [k][i]
  static constexpr int stage = BM * ld_kc > bk * ld_kn ? BM * ld_kc : bk * ld_kn;  // one operand's elements
  static constexpr int chunks = BM * bk / 4 / gemm_threads;  // float4s a thread loads per operand and step
  template <bool KC>
  static constexpr int per_line = (KC ? bk : BM) / 4;  // float4s along a stored row
  template <bool KC>
  static constexpr int ld = KC ? ld_kc : ld_kn;
  static_assert(BM * bk % (4 * gemm_threads) == 0 && gemm_threads % per_line<false> == 0);
};

#if defined(MOM_MMA_BF16)
// The thread's float4s of the operand tile at (i0, k0): chunk q is stored line e / per_line (a row of A or column of
// B when KC, else a k), elements 4 (e % per_line) .. + 3 along it (e = thread + 256 q).
template <bool KC, int BM>
__device__ __forceinline__ void mma_gemm_load(float4 (&r)[MmaGemmTile<BM>::chunks], const float* p, index_t ld,
                                              index_t ni, index_t nk, index_t i0, index_t k0, RowList rl, bool vec) {
  using Tile = MmaGemmTile<BM>;
  constexpr int PL = Tile::template per_line<KC>;
#pragma unroll
  for (int q = 0; q < Tile::chunks; ++q) {
    const int e = int(threadIdx.x) + q * gemm_threads;
    const index_t line = (KC ? i0 : k0) + e / PL, lines = KC ? ni : nk;
    const index_t c0 = (KC ? k0 : i0) + 4 * (e % PL), cn = KC ? nk : ni;
    float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (line < lines) {
      index_t row = line;
      if (rl.rows) row = rl.rows[line];
      if (!rl.rows || (row >= 0 && row < rl.bound)) {
        const float* src = p + row * ld + c0;
        if (vec && c0 + 4 <= cn) {
          const float4 f = *reinterpret_cast<const float4*>(src);
          v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
        } else {
#pragma unroll
          for (int j = 0; j < 4; ++j)
            if (c0 + j < cn) v[j] = src[j];
        }
      }
    }
    r[q] = float4{v[0], v[1], v[2], v[3]};
  }
}
template <bool KC, int BM>
__device__ __forceinline__ void mma_gemm_store(bf16_t* s, const float4 (&r)[MmaGemmTile<BM>::chunks]) {
  using Tile = MmaGemmTile<BM>;
  constexpr int PL = Tile::template per_line<KC>, LD = Tile::template ld<KC>;
  struct alignas(8) Four {
    u32 lo, hi;
  };
#pragma unroll
  for (int q = 0; q < Tile::chunks; ++q) {
    const int e = int(threadIdx.x) + q * gemm_threads;
    *reinterpret_cast<Four*>(s + (e / PL) * LD + 4 * (e % PL)) =
        Four{pack_bf16x2(r[q].x, r[q].y), pack_bf16x2(r[q].z, r[q].w)};
  }
}
#endif

template <bool AKC, bool BKC, int BM, class Epi>
__device__ void gemm_tile_mma(float& asum, bool want_asum, const float* A, index_t lda, const float* B, index_t ldb,
                              index_t M, index_t N, index_t K, index_t m0, index_t n0, RowList arows, RowList brows,
                              Epi&& epi) {
#if defined(MOM_MMA_BF16)
  using Tile = MmaGemmTile<BM>;
  constexpr int BK = Tile::bk, ST = Tile::stage, Q = Tile::chunks, FI = Tile::fi, FJ = Tile::fj;
  constexpr int LDA = Tile::template ld<AKC>, LDB = Tile::template ld<BKC>;
  alignas(128) __shared__ bf16_t Ops[2][2][ST];  // [stage][A, B]
  constexpr int stage_bytes = int(sizeof(Ops[0]));
  const int t = int(threadIdx.x), warp = t / 32, lane = t % 32;
  const int wr = (warp % 2) * (BM / 2), wc = (warp / 2) * (BM / 4);  // the warp's rows and columns in the tile
  // The lane's ldmatrix addresses in stage 0 (the warp's first blocks); a block (i, kk) is mma_block further.
  const smem_addr a_lane = mma_lane_a(&Ops[0][0][0], LDA, !AKC) + (AKC ? mma_block(wr, 0, LDA) : mma_block(0, wr, LDA));
  const smem_addr b_lane = mma_lane_b(&Ops[0][1][0], LDB, !BKC) + (BKC ? mma_block(wc, 0, LDB) : mma_block(0, wc, LDB));
  const bool avec = lda % 4 == 0 && (reinterpret_cast<std::uintptr_t>(A) & 15) == 0;
  const bool bvec = ldb % 4 == 0 && (reinterpret_cast<std::uintptr_t>(B) & 15) == 0;
  float c[FI][FJ][4];
#pragma unroll
  for (int i = 0; i < FI; ++i)
#pragma unroll
    for (int j = 0; j < FJ; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) c[i][j][e] = 0.0f;
  float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const auto add_part = [&](const float4 (&r)[Q]) {
    if (AKC || !want_asum) return;
#pragma unroll
    for (int q = 0; q < Q; ++q) part[0] += r[q].x, part[1] += r[q].y, part[2] += r[q].z, part[3] += r[q].w;
  };
  const index_t steps = (K + BK - 1) / BK;
  if (steps > 0) {
    float4 ra[Q], rb[Q];
    mma_gemm_load<AKC, BM>(ra, A, lda, M, K, m0, 0, arows, avec);
    add_part(ra);
    mma_gemm_store<AKC, BM>(Ops[0][0], ra);
    mma_gemm_load<BKC, BM>(rb, B, ldb, N, K, n0, 0, brows, bvec);
    mma_gemm_store<BKC, BM>(Ops[0][1], rb);
    __syncthreads();
    for (index_t s = 0; s < steps; ++s) {
      const int cur = int(s & 1);
      const bool next = s + 1 < steps;
      if (next) {
        mma_gemm_load<AKC, BM>(ra, A, lda, M, K, m0, (s + 1) * BK, arows, avec);
        add_part(ra);
        mma_gemm_load<BKC, BM>(rb, B, ldb, N, K, n0, (s + 1) * BK, brows, bvec);
      }
      const smem_addr as = a_lane + cur * stage_bytes, bs = b_lane + cur * stage_bytes;
#pragma unroll
      for (int kk = 0; kk < BK; kk += 16) {
        u32 af[FI][4], bf[FJ / 2][4];
#pragma unroll
        for (int i = 0; i < FI; ++i) {
          if constexpr (AKC) ldmatrix_x4(af[i], as + mma_block(16 * i, kk, LDA));
          else ldmatrix_x4_trans(af[i], as + mma_block(kk, 16 * i, LDA));
        }
#pragma unroll
        for (int j = 0; j < FJ / 2; ++j) {
          if constexpr (BKC) ldmatrix_x4(bf[j], bs + mma_block(16 * j, kk, LDB));
          else ldmatrix_x4_trans(bf[j], bs + mma_block(kk, 16 * j, LDB));
        }
#pragma unroll
        for (int i = 0; i < FI; ++i)
#pragma unroll
          for (int j = 0; j < FJ; ++j) mma_bf16(c[i][j], af[i], bf[j / 2][2 * (j % 2)], bf[j / 2][2 * (j % 2) + 1]);
      }
      if (next) {
        mma_gemm_store<AKC, BM>(Ops[cur ^ 1][0], ra);
        mma_gemm_store<BKC, BM>(Ops[cur ^ 1][1], rb);
      }
      __syncthreads();  // step s's stage is free and step s + 1's is complete
    }
  }
  const int g = lane / 4, tq = lane % 4;
#pragma unroll
  for (int i = 0; i < FI; ++i)
#pragma unroll
    for (int j = 0; j < FJ; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) epi(wr + 16 * i + g + 8 * (e / 2), wc + 8 * j + 2 * tq + (e & 1), c[i][j][e]);
  if constexpr (!AKC) {
    if (want_asum) {  // the same for every thread of the block; the operand stages are free (the loop's last barrier)
      constexpr int PL = Tile::template per_line<false>, L = gemm_threads / PL;  // thread t: columns 4 (t % PL) ..
      float(*red)[BM] = reinterpret_cast<float(*)[BM]>(&Ops[0][0][0]);
      static_assert(sizeof(float) * L * BM <= sizeof(Ops));
#pragma unroll
      for (int j = 0; j < 4; ++j) red[t / PL][4 * (t % PL) + j] = part[j];
      __syncthreads();
      if (t < BM) {
        float s = red[0][t];
#pragma unroll
        for (int l = 1; l < L; ++l) s += red[l][t];
        asum += s;
      }
    }
  }
#else
  (void)asum, (void)want_asum, (void)A, (void)lda, (void)B, (void)ldb, (void)M, (void)N, (void)K, (void)m0, (void)n0,
      (void)arows, (void)brows, (void)epi;  // never launched (with_gemm_path)
#endif
}

}  // namespace dev

}  // namespace mom::cuda

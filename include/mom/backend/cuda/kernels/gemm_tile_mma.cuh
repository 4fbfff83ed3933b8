#pragma once
// The grouped GEMMs' tensor-core tile on mma.sync (Precision::BF16 and TF32; grouped_linear.cuh's gemm_run):
// C(m0 + i, n0 + j) = Σ_{k<K} A(m0 + i, k) · B(k, n0 + j) for i, j < BM (128, or 64 for small weight gradients), the
// operands rounded when staged (bf16: nearest even; tf32: cvt.rna), fp32 accumulation; the same operand layouts (KC
// or not, a row list fused into the loads) and epilogue epi(i, j, value) as gemm_tile.cuh's SIMT tile.
//
// 256 threads; k steps (bf16 32, tf32 16) through two shared-memory stages (one barrier a step; the next step's
// operands are loaded into registers while the current step is multiplied). Each thread loads float4s along an
// operand's contiguous dimension (16-byte loads where the rows allow: ld a multiple of 4 and a 16-byte aligned base;
// else element by element, out-of-range elements as 0) and stores them rounded in the same orientation: KC operands
// [i][k], the others [k][i], rows padded so that the fragment reads fall in distinct banks. bf16 fragments come
// through ldmatrix, transposed where the stored orientation is the other one (mma.cuh's mma_lane_a / mma_lane_b);
// tf32 ones by 32-bit loads (mma.cuh's m16n8k8 layout). A warp owns BM / 2 × BM / 4 of the tile (the 8 warps are 2
// rows × 4 columns), BM / 32 × BM / 32 accumulators of 16 × 8, and issues 32 products a step at BM = 128 (the wmma
// tile it replaced issued 8 (bf16) or 16 (tf32) a barrier, its loads scalar). The epilogue reads the accumulators in
// place (no shared-memory staging). Each output is the same k-ordered chain of products at either BM (the same
// bits). want_asum (A not KC): the thread's 4 columns of A are summed in full precision from its loaded values (the
// fused bias gradient), the partial sums met in shared memory in a fixed order.
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "mom/backend/cuda/kernels/gemm_tile.cuh"
#include "mom/backend/cuda/kernels/mma.cuh"

namespace mom::cuda {

namespace dev {

// Path: gemm_bf16 (stored bf16, m16n8k16 from ldmatrix, k steps of 32) or gemm_tf32 (stored fp32 rounded by
// cvt.rna, m16n8k8 from 32-bit shared loads, k steps of 16: two stages of fp32 fit the 48 KB of static shared memory).
template <int Path, int BM>
struct MmaGemmTile {
  static_assert(Path == gemm_bf16 || Path == gemm_tf32, "the mma tile is bf16's or tf32's");
  static_assert(BM == 128 || BM == 64, "the mma tile is 128 x 128 or 64 x 64");
  static constexpr bool bf16 = Path == gemm_bf16;
  using E = std::conditional_t<bf16, bf16_t, float>;  // a stored element
  static constexpr int bk = bf16 ? 32 : 16, kf = bf16 ? 16 : 8;  // a step's k, one product's k
  static constexpr int fi = BM / 32, fj = BM / 32;              // a warp's 16-row and 8-column accumulator tiles
  // Stored rows: [i][k] (KC) and [k][i]. KC rows of 80 bytes (bf16 40, fp32 20 elements) put ldmatrix's 8 rows and
  // the tf32 fragments' (g, t) reads in distinct banks; [k][i] rows of BM + 8 elements (a row 4 banks on from the last
  // for bf16, 8 for fp32: again distinct).
  static constexpr int ld_kc = bk + (bf16 ? 8 : 4), ld_kn = BM + 8;
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
template <bool KC, class Tile>
__device__ __forceinline__ void mma_gemm_load(float4 (&r)[Tile::chunks], const float* p, index_t ld, index_t ni,
                                              index_t nk, index_t i0, index_t k0, RowList rl, bool vec) {
  constexpr int PL = Tile::template per_line<KC>;
#pragma unroll
  for (int q = 0; q < Tile::chunks; ++q) {
    const int e = int(threadIdx.x) + q * gemm_threads;
    const index_t line = (KC ? i0 : k0) + e / PL, lines = KC ? ni : nk;
    const index_t c0 = (KC ? k0 : i0) + 4 * (e % PL), cn = KC ? nk : ni;
    float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (line < lines) {
      index_t row;
      if (rl.memory_row(line, row)) {
        const float* src = p + row * ld + c0;
        if (vec && c0 + 4 <= cn) {
          const float4 f = load16<float4>(src);
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
// The loaded float4s into a stage, rounded: bf16 pairs as one 8-byte store, tf32 as one 16-byte store.
template <bool KC, class Tile>
__device__ __forceinline__ void mma_gemm_store(typename Tile::E* s, const float4 (&r)[Tile::chunks]) {
  constexpr int PL = Tile::template per_line<KC>, LD = Tile::template ld<KC>;
  struct alignas(8) Four {
    u32 lo, hi;
  };
#pragma unroll
  for (int q = 0; q < Tile::chunks; ++q) {
    const int e = int(threadIdx.x) + q * gemm_threads;
    typename Tile::E* d = s + (e / PL) * LD + 4 * (e % PL);
    if constexpr (Tile::bf16)
      *reinterpret_cast<Four*>(d) = Four{pack_bf16x2(r[q].x, r[q].y), pack_bf16x2(r[q].z, r[q].w)};
    else
      store16(d, float4{to_tf32(r[q].x), to_tf32(r[q].y), to_tf32(r[q].z), to_tf32(r[q].w)});
  }
}

// The warp's fragments of the kf-deep slice at kk of a stage: A's fi tiles of 16 rows (from row wr), B's fj tiles of
// 8 columns (from column wc); a, b: the stage's A and B. bf16 through ldmatrix (mma.cuh's lane addresses, a_lane /
// b_lane: this lane's address of the warp's first block in stage 0, plus `stage` bytes), tf32 by 32-bit loads of
// the elements mma.cuh's m16n8k8 layout names.
template <bool AKC, bool BKC, class Tile>
struct MmaGemmFrags {
  u32 a[Tile::fi][4], b[Tile::fj][2];
  __device__ __forceinline__ void load(smem_addr a_lane, smem_addr b_lane, int stage, const typename Tile::E* as,
                                       const typename Tile::E* bs, int wr, int wc, int kk) {
    constexpr int LDA = Tile::template ld<AKC>, LDB = Tile::template ld<BKC>;
    if constexpr (Tile::bf16) {
      (void)as, (void)bs, (void)wr, (void)wc;
#pragma unroll
      for (int i = 0; i < Tile::fi; ++i) {
        if constexpr (AKC) ldmatrix_x4(a[i], a_lane + stage + mma_block(16 * i, kk, LDA));
        else ldmatrix_x4_trans(a[i], a_lane + stage + mma_block(kk, 16 * i, LDA));
      }
#pragma unroll
      for (int j = 0; j < Tile::fj / 2; ++j) {
        u32 r[4];
        if constexpr (BKC) ldmatrix_x4(r, b_lane + stage + mma_block(16 * j, kk, LDB));
        else ldmatrix_x4_trans(r, b_lane + stage + mma_block(kk, 16 * j, LDB));
        b[2 * j][0] = r[0], b[2 * j][1] = r[1], b[2 * j + 1][0] = r[2], b[2 * j + 1][1] = r[3];
      }
    } else {
      (void)a_lane, (void)b_lane, (void)stage;
      const int lane = int(threadIdx.x) % 32, g = lane / 4, t = lane % 4;
      const auto at = [](const float* s, int ld, bool kc, int i, int k) {  // element (i, k) of a stored operand
        float v = kc ? s[i * ld + k] : s[k * ld + i];
        u32 r;
        memcpy(&r, &v, sizeof r);
        return r;
      };
#pragma unroll
      for (int i = 0; i < Tile::fi; ++i)
#pragma unroll
        for (int h = 0; h < 4; ++h) a[i][h] = at(as, LDA, AKC, wr + 16 * i + g + 8 * (h & 1), kk + t + 4 * (h >> 1));
#pragma unroll
      for (int j = 0; j < Tile::fj; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) b[j][h] = at(bs, LDB, BKC, wc + 8 * j + g, kk + t + 4 * h);
    }
  }
};
#endif

template <bool AKC, bool BKC, int Path, int BM, class Epi>
__device__ void gemm_tile_mma(float& asum, bool want_asum, const float* A, index_t lda, const float* B, index_t ldb,
                              index_t M, index_t N, index_t K, index_t m0, index_t n0, RowList arows, RowList brows,
                              Epi&& epi) {
#if defined(MOM_MMA_BF16)
  using Tile = MmaGemmTile<Path, BM>;
  using E = typename Tile::E;
  constexpr int BK = Tile::bk, ST = Tile::stage, Q = Tile::chunks, FI = Tile::fi, FJ = Tile::fj;
  constexpr int LDA = Tile::template ld<AKC>, LDB = Tile::template ld<BKC>;
  alignas(128) __shared__ E Ops[2][2][ST];  // [stage][A, B]
  constexpr int stage_bytes = int(sizeof(Ops[0]));
  const int t = int(threadIdx.x), warp = t / 32, lane = t % 32;
  const int wr = (warp % 2) * (BM / 2), wc = (warp / 2) * (BM / 4);  // the warp's rows and columns in the tile
  smem_addr a_lane{}, b_lane{};  // bf16: the lane's ldmatrix addresses of the warp's first blocks in stage 0
  if constexpr (Tile::bf16) {
    a_lane = mma_lane_a(&Ops[0][0][0], LDA, !AKC) + (AKC ? mma_block(wr, 0, LDA) : mma_block(0, wr, LDA));
    b_lane = mma_lane_b(&Ops[0][1][0], LDB, !BKC) + (BKC ? mma_block(wc, 0, LDB) : mma_block(0, wc, LDB));
  }
  const bool avec = lda % 4 == 0 && aligned16(A);
  const bool bvec = ldb % 4 == 0 && aligned16(B);
  float c[FI][FJ][4];
#pragma unroll
  for (int i = 0; i < FI; ++i)
#pragma unroll
    for (int j = 0; j < FJ; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) c[i][j][e] = 0.0f;
  float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const auto add_part = [&](const float4 (&r)[Q]) {
    if constexpr (!AKC) {
      if (!want_asum) return;
#pragma unroll
      for (int q = 0; q < Q; ++q) part[0] += r[q].x, part[1] += r[q].y, part[2] += r[q].z, part[3] += r[q].w;
    } else {
      (void)r;
    }
  };
  const index_t steps = (K + BK - 1) / BK;
  if (steps > 0) {
    float4 ra[Q], rb[Q];
    mma_gemm_load<AKC, Tile>(ra, A, lda, M, K, m0, 0, arows, avec);
    add_part(ra);
    mma_gemm_store<AKC, Tile>(Ops[0][0], ra);
    mma_gemm_load<BKC, Tile>(rb, B, ldb, N, K, n0, 0, brows, bvec);
    mma_gemm_store<BKC, Tile>(Ops[0][1], rb);
    __syncthreads();
    for (index_t s = 0; s < steps; ++s) {
      const int cur = int(s & 1);
      const bool next = s + 1 < steps;
      if (next) {
        mma_gemm_load<AKC, Tile>(ra, A, lda, M, K, m0, (s + 1) * BK, arows, avec);
        add_part(ra);
        mma_gemm_load<BKC, Tile>(rb, B, ldb, N, K, n0, (s + 1) * BK, brows, bvec);
      }
#pragma unroll
      for (int kk = 0; kk < BK; kk += Tile::kf) {
        MmaGemmFrags<AKC, BKC, Tile> f;
        f.load(a_lane, b_lane, cur * stage_bytes, Ops[cur][0], Ops[cur][1], wr, wc, kk);
#pragma unroll
        for (int i = 0; i < FI; ++i)
#pragma unroll
          for (int j = 0; j < FJ; ++j) {
            if constexpr (Tile::bf16) mma_bf16(c[i][j], f.a[i], f.b[j][0], f.b[j][1]);
            else mma_tf32(c[i][j], f.a[i], f.b[j][0], f.b[j][1]);
          }
      }
      if (next) {
        mma_gemm_store<AKC, Tile>(Ops[cur ^ 1][0], ra);
        mma_gemm_store<BKC, Tile>(Ops[cur ^ 1][1], rb);
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

#pragma once
// Warp-level bf16 and tf32 matrix products through PTX (mma.sync m16n8k16 / m16n8k8, ldmatrix) with the fragment
// layouts the PTX ISA documents, for kernels that work on their accumulators in registers: attention_mma.cuh keeps
// the softmax on the score fragments and feeds P from registers to the next product (FlashAttention-2's way,
// arXiv:2307.08691), which wmma's opaque fragment layout does not allow; gemm_tile_mma.cuh (the grouped GEMMs' tile)
// reads its accumulators in place in the epilogue. g = lane / 4, t = lane % 4; a 32-bit register holds two bf16, the
// lower index in the low half:
//   A (16 × 16, row major)  a[0]: (g, 2t..2t+1)   a[1]: (g + 8, 2t..)   a[2]: (g, 2t + 8..)   a[3]: (g + 8, 2t + 8..)
//   B (16 × 8, "col")       b[0]: (2t..2t+1, g)   b[1]: (2t + 8.., g)
//   C, D (16 × 8, fp32)     c[0], c[1]: (g, 2t), (g, 2t + 1)         c[2], c[3]: (g + 8, 2t), (g + 8, 2t + 1)
// and for mma.sync m16n8k8 tf32 (one element a register; gemm_tile_mma.cuh loads them without ldmatrix):
//   A (16 × 8)  a[0]: (g, t)   a[1]: (g + 8, t)   a[2]: (g, t + 4)   a[3]: (g + 8, t + 4)
//   B (8 × 8)   b[0]: (t, g)   b[1]: (t + 4, g)                      C, D as above
// The C fragments of two adjacent 8-column tiles are, packed to bf16, the A fragment of their 16 columns
// (mma_a_from_c). ldmatrix x4: lanes 8i .. 8i + 7 give the addresses of matrix i's 8 rows (8 bf16, 16 bytes each);
// register i of lane l gets matrix i's (l / 4, 2(l % 4)..+1), or with .trans its (2(l % 4), l / 4) and
// (2(l % 4) + 1, l / 4). The address helpers below name which 8 × 8 blocks a fragment takes.
//
// Under MOM_CUDA_EMULATE the same functions exchange the warp's registers (emulate.hpp's emu_warp_all) and compute
// what the hardware does (each product's sum in fp32, k in order, from the accumulator). Needs sm_80 (bf16 mma):
// code compiled for older targets is empty (MOM_MMA_BF16 undefined) and its kernels are never launched.
#include <cstdint>
#include <cstring>

#include "mom/backend/cuda/kernels/common.cuh"
#include "mom/backend/cuda/kernels/linear.cuh"  // bf16_bits

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define MOM_MMA_BF16 1
#endif

namespace mom::cuda {

namespace dev {

#if defined(MOM_MMA_BF16)
using u32 = std::uint32_t;

#if defined(MOM_CUDA_EMULATE)
inline u32 pack_bf16x2(float lo, float hi) { return u32(bf16_bits(lo)) | u32(bf16_bits(hi)) << 16; }
inline float bf16_half(u32 r, int hi) {
  const u32 u = hi ? (r & 0xffff0000u) : r << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
// A lane's shared-memory address: a 32-bit shared-window address on the GPU (so the unrolled loops' addresses are a
// base register plus constants), a pointer here. smem_addr + bytes moves it either way.
using smem_addr = const unsigned char*;
inline smem_addr smem_address(const void* p) { return static_cast<smem_addr>(p); }
// row: this lane's row address (16-byte aligned, 8 bf16) of matrix lane / 8.
// Each lane's row address must be 16-byte aligned (the PTX ISA's ldmatrix rule): checked (common.cuh).
template <bool Trans>
inline void ldmatrix_x4_impl(u32 (&r)[4], smem_addr row) {
  check_aligned16(row, "an ldmatrix row address");
  smem_addr rows[32];
  emu_warp_all(row, rows);
  const int l = threadIdx.x % 32;
  for (int i = 0; i < 4; ++i) {
    if constexpr (Trans) {
      const auto* p0 = reinterpret_cast<const std::uint16_t*>(rows[8 * i + 2 * (l % 4)]);
      const auto* p1 = reinterpret_cast<const std::uint16_t*>(rows[8 * i + 2 * (l % 4) + 1]);
      r[i] = u32(p0[l / 4]) | u32(p1[l / 4]) << 16;
    } else {
      const auto* p = reinterpret_cast<const std::uint16_t*>(rows[8 * i + l / 4]);
      r[i] = u32(p[2 * (l % 4)]) | u32(p[2 * (l % 4) + 1]) << 16;
    }
  }
}
inline void ldmatrix_x4(u32 (&r)[4], smem_addr row) { ldmatrix_x4_impl<false>(r, row); }
inline void ldmatrix_x4_trans(u32 (&r)[4], smem_addr row) { ldmatrix_x4_impl<true>(r, row); }
// d += a b (16 × 8 × 16).
inline void mma_bf16(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  struct Regs {
    u32 a[4], b[2];
  };
  Regs all[32];
  emu_warp_all(Regs{{a[0], a[1], a[2], a[3]}, {b0, b1}}, all);
  const int l = threadIdx.x % 32, g = l / 4, t = l % 4;
  for (int e = 0; e < 4; ++e) {
    const int row = g + 8 * (e / 2), col = 2 * t + (e & 1);
    float s = d[e];
    for (int k = 0; k < 16; ++k) {
      const float av = bf16_half(all[4 * (row % 8) + (k % 8) / 2].a[(row >= 8) + 2 * (k >= 8)], k % 2);
      const float bv = bf16_half(all[4 * col + (k % 8) / 2].b[k >= 8], k % 2);
      s += av * bv;
    }
    d[e] = s;
  }
}
// d += a b (16 × 8 × 8, tf32: each register one element, already rounded to tf32).
inline void mma_tf32(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  struct Regs {
    u32 a[4], b[2];
  };
  Regs all[32];
  emu_warp_all(Regs{{a[0], a[1], a[2], a[3]}, {b0, b1}}, all);
  const auto f = [](u32 r) {
    float v;
    std::memcpy(&v, &r, sizeof v);
    return v;
  };
  const int l = threadIdx.x % 32, g = l / 4, t = l % 4;
  for (int e = 0; e < 4; ++e) {
    const int row = g + 8 * (e / 2), col = 2 * t + (e & 1);
    float s = d[e];
    for (int k = 0; k < 8; ++k)
      s += f(all[4 * (row % 8) + k % 4].a[(row >= 8) + 2 * (k >= 4)]) * f(all[4 * col + k % 4].b[k >= 4]);
    d[e] = s;
  }
}
// cp.async, 16 bytes from global to shared memory (zeros where !valid: the source is then not read), completes at once
// here: commit and wait have nothing to wait for. Both addresses 16-byte aligned (checked).
inline void cp_async16(void* smem, const void* gmem, bool valid) {
  check_aligned16(smem, "a cp.async destination");
  if (!valid) {
    std::memset(smem, 0, 16);
    return;
  }
  check_aligned16(gmem, "a cp.async source");
  std::memcpy(smem, gmem, 16);
}
inline void cp_async_commit() {}
template <int N>
inline void cp_async_wait() {}
#else
__device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (lo) in the low half
  u32 r;
  memcpy(&r, &v, sizeof r);
  return r;
}
using smem_addr = unsigned;
__device__ __forceinline__ smem_addr smem_address(const void* p) {
  return static_cast<smem_addr>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void ldmatrix_x4(u32 (&r)[4], smem_addr row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(row));
}
__device__ __forceinline__ void ldmatrix_x4_trans(u32 (&r)[4], smem_addr row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(row));
}
__device__ __forceinline__ void mma_bf16(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_tf32(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// cp.async.cg (L2 only, 16 bytes; a source size of 0 where !valid: zeros written, nothing read), the commit of the
// copies issued so far as a group, and the wait until at most N groups are pending (then a barrier makes the block's
// copies visible to all its threads).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
#endif

// The A fragment of columns 16f .. 16f + 15 from the fp32 C fragments c[2f], c[2f + 1] (rounded to bf16).
__device__ __forceinline__ void mma_a_from_c(u32 (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
  a[0] = pack_bf16x2(c0[0], c0[1]);
  a[1] = pack_bf16x2(c0[2], c0[3]);
  a[2] = pack_bf16x2(c1[0], c1[1]);
  a[3] = pack_bf16x2(c1[2], c1[3]);
}

// Shared-memory tiles of bf16, rows ld elements apart (ld · 2 bytes a multiple of 16). The lane's ldmatrix address
// for the 16 × 16 block at (0, 0); the block at (r0, c0) is mma_block(r0, c0, ld) bytes further:
//   mma_lane_a:  the A fragment of the block as stored (row major), or with .trans of its transpose;
//   mma_lane_b:  with ldmatrix_x4, the B fragments of the block's transpose: (b0, b1) of the first 8 rows as
//                n-tile 0 and of the next 8 as n-tile 1 (K Qᵀ from K stored [key][d]);
//                with ldmatrix_x4_trans (trans = true), of the block itself: columns 0 .. 7 as n-tile 0, the next 8
//                as n-tile 1 (P V from V stored [key][d]).
__device__ __forceinline__ constexpr int mma_block(int r0, int c0, int ld) { return 2 * (r0 * ld + c0); }
template <class E>
__device__ __forceinline__ smem_addr mma_lane_a(const E* tile, int ld, bool trans = false) {
  static_assert(sizeof(E) == 2);
  const int l = threadIdx.x % 32, i = l / 8;  // matrix i: a[i]
  // a[i] covers rows 8 (i & 1), columns 8 (i >> 1); transposed, the stored rows are A's columns.
  return smem_address(trans ? tile + (l % 8 + 8 * (i >> 1)) * ld + 8 * (i & 1)
                            : tile + (l % 8 + 8 * (i & 1)) * ld + 8 * (i >> 1));
}
template <class E>
__device__ __forceinline__ smem_addr mma_lane_b(const E* tile, int ld, bool trans = false) {
  static_assert(sizeof(E) == 2);
  const int l = threadIdx.x % 32, i = l / 8;
  // Register i = (n-tile i >> 1, b[i & 1]). Not transposed: stored rows 8 (i >> 1), columns 8 (i & 1);
  // transposed: stored rows (k) 8 (i & 1), columns (n) 8 (i >> 1).
  return smem_address(trans ? tile + (l % 8 + 8 * (i & 1)) * ld + 8 * (i >> 1)
                            : tile + (l % 8 + 8 * (i >> 1)) * ld + 8 * (i & 1));
}
#endif

}  // namespace dev

}  // namespace mom::cuda

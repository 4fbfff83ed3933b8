#pragma once
// The shared memory of the mma attention kernels (attention_mma.cuh) and the copies that fill it: their layouts and
// sizes, the staging of Q, K and V from an fp32 qkv (rounded) or a bf16 one (as they are, or with cp.async), and the
// backward's copies of a query tile two buffers deep (cp.async: mma.cuh).
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "mom/backend/cuda/kernels/attention_tc_tile.cuh"  // TcLayout, tc_stage, tc_tile, tc_threads
#include "mom/backend/cuda/kernels/mma.cuh"

namespace mom::cuda {

namespace dev {

#if defined(MOM_MMA_BF16)
// The forward's dynamic shared memory: K and V, twice over for a bf16 qkv (its two-deep copies).
template <int HD>
constexpr std::size_t mma_forward_smem(bool bf16_qkv) {
  return (bf16_qkv ? 4 : 2) * TcLayout<gemm_bf16, HD>::tile;
}

// Shared memory of the backward kernels: the block's K and V, the streamed Q and dO (bf16, [64][ld]), the warps'
// dSᵀ for dQ (bf16, [64 keys][pld]), the streamed rows' lse and D (fp32).
template <int HD>
struct MmaBackwardSmem {
  bf16_t *k, *v, *q, *dout, *ds;
  float *lse, *d;
  static constexpr std::size_t bytes =
      4 * TcLayout<gemm_bf16, HD>::tile + TcLayout<gemm_bf16, HD>::pstage + 2 * TcLayout<gemm_bf16, HD>::vec;
};
template <int HD>
__device__ __forceinline__ MmaBackwardSmem<HD> mma_backward_smem(unsigned char* sm) {
  using Lay = TcLayout<gemm_bf16, HD>;
  const auto at = [&](std::size_t off) { return reinterpret_cast<bf16_t*>(sm + off); };
  float* lse = reinterpret_cast<float*>(sm + 4 * Lay::tile + Lay::pstage);
  return {at(0), at(Lay::tile), at(2 * Lay::tile), at(3 * Lay::tile), at(4 * Lay::tile), lse, lse + tc_tile};
}

// A sequence's rows of qkv from element `at` on: fp32 (f32) or, with Q16, bf16 bits (f16), rows L.qkv_ld apart. A
// template parameter, not a branch: a kernel that reads an fp32 qkv has no bf16 code to keep registers for.
template <bool Q16>
struct QkvRows {
  const float* f32;
  const std::uint16_t* f16;
  index_t at;
  template <int HD, int Batch = 8>
  __device__ __forceinline__ void stage(bf16_t* dst, const HeadLayout& L, index_t r0, index_t col0) const {
    if constexpr (Q16) tc_stage<gemm_bf16, HD, Batch>(dst, f16 + at, L.qkv_ld, r0, L.seq, col0);
    else tc_stage<gemm_bf16, HD, Batch>(dst, f32 + at, L.qkv_ld, r0, L.seq, col0);
  }
  // The bf16 rows' tile as cp.async copies of 16 bytes (zeros past seq), issued by every thread; the caller commits
  // and waits. The bf16 layout's rows are 16-byte aligned (attention_ops.hpp: qkv dense, 3d a multiple of 8, columns
  // at multiples of the head dim).
  template <int HD>
  __device__ __forceinline__ void stage_async(bf16_t* dst, const HeadLayout& L, index_t r0, index_t col0) const {
    static_assert(Q16, "cp.async copies a bf16 qkv");
    constexpr int LD = TcLayout<gemm_bf16, HD>::ld, H8 = HD / 8, per = tc_tile * H8 / tc_threads;
    std::uint16_t* const d16 = reinterpret_cast<std::uint16_t*>(dst);
    const std::uint16_t* const base = f16 + at + col0;
#pragma unroll
    for (int k = 0; k < per; ++k) {
      const int e = int(threadIdx.x) + k * tc_threads, rr = e / H8, c = (e % H8) * 8;
      const bool in = r0 + rr < L.seq;  // else zeros, from a row that exists (not read)
      cp_async16(d16 + rr * LD + c, base + (in ? r0 + rr : 0) * L.qkv_ld + c, in);
    }
  }
};

// The backward's second set of buffers for a bf16 qkv (after MmaBackwardSmem's region): each query tile's Q, dO (fp32,
// rows ld32 apart), O (bf16) and lse, two deep (index 0 or 1; Q's first buffer is MmaBackwardSmem's q).
template <int HD>
struct MmaBackwardPipe {
  static constexpr int ld32 = HD + 4;  // fp32 rows: 16-byte aligned, off the same banks
  static constexpr std::size_t f32_tile = round128(std::size_t(tc_tile) * ld32 * sizeof(float));
  static constexpr std::size_t bytes = MmaBackwardSmem<HD>::bytes + 3 * TcLayout<gemm_bf16, HD>::tile + 2 * f32_tile +
                                       2 * TcLayout<gemm_bf16, HD>::vec;
  bf16_t* q[2];
  std::uint16_t* out[2];
  float* dout[2];
  float* lse[2];
};
template <int HD>
__device__ __forceinline__ MmaBackwardPipe<HD> mma_backward_pipe(unsigned char* sm) {
  using Lay = TcLayout<gemm_bf16, HD>;
  using P = MmaBackwardPipe<HD>;
  unsigned char* at = sm + MmaBackwardSmem<HD>::bytes;
  const MmaBackwardSmem<HD> base = mma_backward_smem<HD>(sm);
  const auto u16 = [&](std::size_t off) { return reinterpret_cast<std::uint16_t*>(at + off); };
  const auto f32 = [&](std::size_t off) { return reinterpret_cast<float*>(at + off); };
  return {{base.q, reinterpret_cast<bf16_t*>(at)},
          {u16(Lay::tile), u16(2 * Lay::tile)},
          {f32(3 * Lay::tile), f32(3 * Lay::tile + P::f32_tile)},
          {f32(3 * Lay::tile + 2 * P::f32_tile), f32(3 * Lay::tile + 2 * P::f32_tile + Lay::vec)}};
}
// The backward kernel's dynamic shared memory: with a bf16 qkv and O at head dim 64, the pipelined form's (the second
// set of buffers; at 128 it would leave one block a multiprocessor: the bf16 qkv is for head dim 64 only).
template <int HD>
constexpr std::size_t mma_backward_smem_bytes(bool pipelined) {
  return pipelined && HD == 64 ? MmaBackwardPipe<HD>::bytes : MmaBackwardSmem<HD>::bytes;
}
// Whether the backward runs its pipelined form (for a bf16 qkv and O at head dim 64: the kernel asks only then): dO's
// and O's rows 16-byte aligned (the same for the whole block).
__device__ __forceinline__ bool mma_backward_pipelined(const float* dbase, index_t dout_ld, const std::uint16_t* obase,
                                                       const HeadLayout& L) {
  const index_t col0 = index_t(blockIdx.y) % L.heads * L.hd;
  return dout_ld % 4 == 0 && L.out_ld % 8 == 0 && aligned16(dbase + col0) && aligned16(obase + col0);
}
// The copies of query tile i0 (rows i0 .. i0 + 63, zeros past seq) into buffer `buf`: Q from the bf16 qkv, dO (fp32)
// and O (bf16) of the head at column col0, each row in 16-byte copies; the caller commits.
template <int HD>
__device__ __forceinline__ void mma_backward_copies(const MmaBackwardPipe<HD>& pp, int buf, const QkvRows<true>& src,
                                                    const float* dbase, index_t dout_ld, const std::uint16_t* obase,
                                                    const HeadLayout& L, index_t i0, index_t col0) {
  constexpr int LD = TcLayout<gemm_bf16, HD>::ld, D4 = HD / 4, O8 = HD / 8;
  src.stage_async<HD>(pp.q[buf], L, i0, col0);
#pragma unroll
  for (int k = 0; k < tc_tile * D4 / tc_threads; ++k) {
    const int e = int(threadIdx.x) + k * tc_threads, rr = e / D4, c = (e % D4) * 4;
    const bool in = i0 + rr < L.seq;
    cp_async16(pp.dout[buf] + rr * MmaBackwardPipe<HD>::ld32 + c, dbase + (in ? i0 + rr : 0) * dout_ld + col0 + c, in);
  }
#pragma unroll
  for (int k = 0; k < tc_tile * O8 / tc_threads; ++k) {
    const int e = int(threadIdx.x) + k * tc_threads, rr = e / O8, c = (e % O8) * 8;
    const bool in = i0 + rr < L.seq;
    cp_async16(pp.out[buf] + rr * LD + c, obase + (in ? i0 + rr : 0) * L.out_ld + col0 + c, in);
  }
}

#endif

}  // namespace dev

}  // namespace mom::cuda

#pragma once
// Dense causal attention on tensor cores (nvcuda::wmma) for cuda::Backend<float> with
// Precision::TF32 or BF16 and head dim 64 or 128: the path Kernels<float>::attention_forward /
// attention_backward (attention.cuh) take when attention_tc_forward / attention_tc_backward below
// accept the call; everything else (double, Precision::FP32, other head dims, GPUs without the
// shared memory) keeps the SIMT kernels of attention.cuh. Same contract as those: out and lse written
// (lse[(b·heads + h)·seq + i], natural log), dqkv accumulated (+=), no [S × S] buffer.
//
// FlashAttention-2 structure. A block is 4 warps (128 threads) and owns a tile of 64 rows (queries
// in the forward, keys in the backward); warp w owns rows 16w .. 16w + 15 of it. The other side
// streams through shared memory in tiles of 64 rows; causal tiles wholly above the diagonal are
// never visited, and inside the diagonal tile a warp only multiplies the 16-column blocks that
// hold a key <= its last query. Operands are rounded when staged into shared memory, as the
// grouped GEMM does (grouped_linear.cuh): TF32 (cvt.rna, wmma m16n16k8) or bf16 (nearest even,
// m16n16k16), fp32 accumulate. Scores, softmax statistics, D = rowsum(dO ∘ O) and the output stay
// fp32; the probabilities P (and dS in the backward) are rounded like the operands before their
// products, since they are the A operand of the next wmma.
//
// Softmax through shared memory: the fragment layout of an accumulator is opaque, so a warp
// stores its 16 × 64 score block to an fp32 scratch; lanes 2r and 2r + 1 own row r (32 columns
// each, combined by one shuffle) for the online max / sum, and write the rounded P next to it.
// The output accumulator stays in registers; rescaling it by a per-row factor uses a row-index
// fragment: an accumulator fragment loaded from a table whose (r, c) entry is r. load_matrix_sync,
// store_matrix_sync and mma_sync share one element mapping per fragment type (a store of a
// loaded fragment reproduces the memory), so x[e] of that fragment is the row of x[e] in every
// accumulator of the same type.
//
// Shared memory is dynamic (up to 167 KB for the backward at head dim 128 in TF32): the launchers
// fall back to the SIMT kernels when the device allows less per block.
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "mom/backend/cuda/kernels/attention.cuh"
#include "mom/backend/cuda/kernels/attention_mma.cuh"     // BF16: the softmax in registers (mma.sync)
#include "mom/backend/cuda/kernels/attention_tc_tile.cuh"  // layouts, staging, a warp's work on a tile
#include "mom/backend/cuda/kernels/grouped_linear.cuh"

namespace mom::cuda {

namespace dev {

template <int Path, int HD>
__global__ void attention_tc_forward_kernel(MatrixView<float> out, float* lse, MatrixView<const float> qkv,
                                            HeadLayout L, float scale) {
#if defined(MOM_TC_ATTENTION_BODY)
  using Lay = TcLayout<Path, HD>;
  using S = typename Lay::S;
  constexpr int SLD = Lay::sld, PLD = Lay::pld, NO = HD / 16;
  unsigned char* sm = dynamic_smem();
  const auto [sK, sV, sS, sP, sCorr, sRows] = tc_forward_smem<Path, HD>(sm);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const index_t bh = blockIdx.y, b = bh / L.heads, h = bh % L.heads;
  const index_t i0 = index_t(blockIdx.x) * tc_tile, w0 = i0 + 16 * warp;
  const float* base = qkv.data + b * L.seq * L.qkv_ld;
  const index_t last = min(L.seq, i0 + tc_tile) - 1;  // the block's last query: keys [0, last] matter
  const index_t wlast = min(L.seq, w0 + 16) - 1;      // the warp's last query
  const bool active = w0 < L.seq;                      // the same for the whole warp

  tc_stage<Path, HD, 1>(sK, base, L.qkv_ld, i0, L.seq, h * L.hd);  // Q, through K's buffer
  TcQFrags<Path, HD> qf;
  TcAcc<Path> rows, o[NO];
  tc_forward_start<Path, HD>(qf, rows, o, sK, sRows);

  const int r = lane >> 1, half = lane & 1;  // this lane's row of the warp's 16, and half of the 64 columns
  const index_t i = w0 + r;
  float* ss = sS + 16 * warp * SLD;
  S* sp = sP + 16 * warp * PLD;
  float* corr_w = sCorr + 16 * warp;
  float m = neg_inf<float>(), l = 0.0f;
  for (index_t j0 = 0; j0 <= last; j0 += tc_tile) {
    __syncthreads();  // Q (first tile) or the previous K, V consumed
    tc_stage<Path, HD, 1>(sK, base, L.qkv_ld, j0, L.seq, L.d + h * L.hd);
    tc_stage<Path, HD, 1>(sV, base, L.qkv_ld, j0, L.seq, 2 * L.d + h * L.hd);
    __syncthreads();
    if (!active) continue;
    // 16-key column blocks holding a key <= the warp's last query (j0 <= i0 <= w0: at least one).
    const int nf = static_cast<int>(min(index_t(4), (wlast - j0) / 16 + 1));
    tc_scores<Path, HD>(ss, qf, sK, 0, nf);
    __syncwarp();
    const float corr = tc_softmax<Path, HD>(ss, sp, r, 32 * half, min(32 * half + 32, 16 * nf), j0, 0, i + 1, scale, m, l);
    if (half == 0) corr_w[r] = corr;
    __syncwarp();
    tc_scale_rows<Path, HD>(o, rows, corr_w);
    tc_accumulate<Path, HD>(o, sp, PLD, sV, 0, 16 * nf);  // O += P V over the multiplied keys
  }
  __syncthreads();  // K, V consumed: their space stages the output
  if (!active) return;
  if (half == 0) corr_w[r] = 1.0f / l;
  __syncwarp();
  tc_scale_rows<Path, HD>(o, rows, corr_w);
  tc_write_rows<Path, HD>(o, reinterpret_cast<float*>(sm) + 16 * warp * Lay::old, [&](int rr, int c, float v) {
    if (w0 + rr < L.seq) out.data[(b * L.seq + w0 + rr) * L.out_ld + h * L.hd + c] = v;
  });
  if (half == 0 && i < L.seq) lse[bh * L.seq + i] = m + log_(l);
#else
  (void)out, (void)lse, (void)qkv, (void)L, (void)scale;
#endif
}

// The backward, FlashAttention-2's way: one kernel, 5 products per tile pair. Block = 64 keys, streaming query
// tiles i0 >= its first key. Per tile and warp (16 keys): Sᵀ = K Qᵀ, dPᵀ = V dOᵀ (wmma), Pᵀ = exp(scale·Sᵀ − lse),
// dSᵀ = Pᵀ ∘ (dPᵀ − D) (fp32 scratch), both rounded, dV += Pᵀ dO, dK += dSᵀ Q (wmma); then, every warp's dSᵀ
// published by a barrier, warp w adds scale · dS K for the tile's queries 16w .. 16w + 15 to dqkv[q] (atomicAdd:
// the blocks of every key tile at or before those queries add to the same rows, so dQ's float sums are in no fixed
// order; docs/cuda.md, "Determinism"). At the end dqkv[k] += scale · dK, dqkv[v] += dV. (Until the twenty-seventh
// session dQ had its own kernel over query blocks, which computed S and dP again: 7 products per tile pair.)
template <int Path, int HD>
__global__ void attention_tc_backward_kernel(MatrixView<float> dqkv, MatrixView<const float> dout,
                                             MatrixView<const float> out, const float* lse, MatrixView<const float> qkv,
                                             HeadLayout L, float scale, index_t dqkv_ld, index_t dout_ld) {
#if defined(MOM_TC_ATTENTION_BODY)
  using Lay = TcLayout<Path, HD>;
  using S = typename Lay::S;
  constexpr int LD = Lay::ld, SLD = Lay::sld, PLD = Lay::pld, NO = HD / 16;
  unsigned char* sm = dynamic_smem();
  const auto [sK, sV, sQ, sdO, sS, sdP, sP, sdS, sLse, sD] = tc_backward_smem<Path, HD>(sm);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const index_t bh = blockIdx.y, b = bh / L.heads, h = bh % L.heads;
  const index_t j0 = index_t(blockIdx.x) * tc_tile, w0 = j0 + 16 * warp;
  const float* base = qkv.data + b * L.seq * L.qkv_ld;
  const float* dbase = dout.data + b * L.seq * dout_ld;
  const float* obase = out.data + b * L.seq * L.out_ld;
  const bool active = w0 < L.seq;
  // dQ's vector atomics need every row's head slice 16-byte aligned (the usual layouts: ld and head dim multiples of 4).
  const bool dq_aligned = dqkv_ld % 4 == 0 && aligned16(dqkv.data + h * L.hd);

  tc_stage<Path, HD>(sK, base, L.qkv_ld, j0, L.seq, L.d + h * L.hd);
  tc_stage<Path, HD>(sV, base, L.qkv_ld, j0, L.seq, 2 * L.d + h * L.hd);
  TcAcc<Path> dk[NO], dv[NO];
#pragma unroll
  for (int n = 0; n < NO; ++n) {
    wm::fill_fragment(dk[n], 0.0f);
    wm::fill_fragment(dv[n], 0.0f);
  }
  const int r = lane >> 1, half = lane & 1;
  const index_t j = w0 + r;  // this lane's key
  float* ss = sS + 16 * warp * SLD;
  float* sdp = sdP + 16 * warp * SLD;
  S* sp = sP + 16 * warp * PLD;
  S* sds = sdS + 16 * warp * PLD;
  const S* sk = sK + 16 * warp * LD;
  const S* sv = sV + 16 * warp * LD;
  for (index_t i0 = j0; i0 < L.seq; i0 += tc_tile) {  // query tiles at or after this key tile
    __syncthreads();
    tc_stage<Path, HD>(sQ, base, L.qkv_ld, i0, L.seq, h * L.hd);
    tc_stage_dout<Path, HD>(sdO, sD, sLse, dbase, dout_ld, obase, L.out_ld, lse + bh * L.seq, i0, L.seq, h * L.hd);
    __syncthreads();
    if (active) {
      // 16-query column blocks with a query >= the warp's first key and < seq.
      const int f_lo = i0 == j0 ? warp : 0;
      const int f_hi = static_cast<int>(min(index_t(4), (L.seq - i0 + 15) / 16));
      tc_products<Path, HD, true>(ss, sk, sQ, sdp, sv, sdO, f_lo, f_hi);
      __syncwarp();
      {
        const int c0 = max(32 * half, 16 * f_lo), c1 = min(32 * half + 32, 16 * f_hi);
        for (int c = c0; c < c1; ++c) {
          const index_t iq = i0 + c;
          const float p = (iq >= j && iq < L.seq && j < L.seq) ? exp_(ss[r * SLD + c] * scale - sLse[c]) : 0.0f;
          const float ds = p * (sdp[r * SLD + c] - sD[c]);
          sp[r * PLD + c] = stage_value<float, Path>(p);
          sds[r * PLD + c] = stage_value<float, Path>(ds);
        }
      }
      __syncwarp();
      tc_accumulate_dkdv<Path, HD>(dk, dv, sp, sds, sdO, sQ, 16 * f_lo, 16 * f_hi);
    }
    __syncthreads();  // every warp's dSᵀ rows written (and its P and dS read): dQ reads them across warps
    // dQ of queries q0 .. q0 + 15 over the key blocks whose warps wrote their dSᵀ columns: the keys < seq, and on the
    // diagonal tile the blocks at or before the queries' own (a warp's written columns start at its block there).
    const index_t q0 = i0 + 16 * warp;
    if (q0 < L.seq) {
      const int kb = i0 == j0 ? warp + 1 : static_cast<int>(min(index_t(4), (L.seq - j0 + 15) / 16));
      tc_dq_from_dst<Path, HD>(sdS, sK, (1u << kb) - 1u, scale, ss, [&](int rr, int c, float4 v) {
        if (q0 + rr < L.seq) atomic_add4(dqkv.data + (b * L.seq + q0 + rr) * dqkv_ld + h * L.hd + c, v, dq_aligned);
      });
    }
  }
  __syncthreads();  // K, V consumed: their space stages dK, then dV
  if (!active) return;
  float* so = reinterpret_cast<float*>(sm) + 16 * warp * Lay::old;
  tc_write_rows<Path, HD>(dk, so, [&](int rr, int c, float v) {
    if (w0 + rr < L.seq) dqkv.data[(b * L.seq + w0 + rr) * dqkv_ld + L.d + h * L.hd + c] += scale * v;
  });
  tc_write_rows<Path, HD>(dv, so, [&](int rr, int c, float v) {
    if (w0 + rr < L.seq) dqkv.data[(b * L.seq + w0 + rr) * dqkv_ld + 2 * L.d + h * L.hd + c] += v;
  });
#else
  (void)dqkv, (void)dout, (void)out, (void)lse, (void)qkv, (void)L, (void)scale, (void)dqkv_ld, (void)dout_ld;
#endif
}

// Whether kernel can run here with smem bytes of dynamic shared memory: compiled for sm_80 or later
// (the empty pre-sm_80 body must never run) and within the device's per-block opt-in limit (common.cuh).
template <auto kernel>
bool tc_kernel_usable(const Context& ctx, std::size_t smem) {
  return smem_fits<kernel>(ctx, smem, 80);
}

// Calls f(path, head dim) as integral constants when the tensor-core path applies: float,
// Precision::TF32 or BF16, head dim 64 or 128.
template <class T, class F>
bool with_tc_attention(const Context& ctx, index_t hd, F&& f) {
  if constexpr (!std::is_same_v<T, float>) {
    (void)ctx, (void)hd, (void)f;
    return false;
  } else {
    if (ctx.precision == Precision::FP32 || (hd != 64 && hd != 128)) return false;
    const auto with_hd = [&](auto path) {
      return hd == 64 ? f(path, std::integral_constant<int, 64>{}) : f(path, std::integral_constant<int, 128>{});
    };
    return ctx.precision == Precision::BF16 ? with_hd(std::integral_constant<int, gemm_bf16>{})
                                            : with_hd(std::integral_constant<int, gemm_tf32>{});
  }
}

template <class T>
bool attention_tc_forward(const Context& ctx, MatrixView<T> out, T* lse, MatrixView<const T> qkv, HeadLayout L,
                          index_t batch) {
  return with_tc_attention<T>(ctx, L.hd, [&](auto path, auto hd) {
    constexpr int P = decltype(path)::value, HD = decltype(hd)::value;
    const dim3 grid(blocks_exact(L.seq, tc_tile), static_cast<unsigned>(batch * L.heads));
    const float scale = 1.0f / std::sqrt(float(L.hd));
    if constexpr (P == gemm_bf16) {  // attention_mma.cuh: K and V tiles only
      constexpr std::size_t smem = mma_forward_smem<HD>(false);
      constexpr auto kernel = attention_mma_forward_kernel<HD, float>;
      if (tc_kernel_usable<kernel>(ctx, smem)) {
        launch_smem("attention_forward", ctx, grid, tc_threads, smem, kernel, out.data, lse, qkv,
                    static_cast<const std::uint16_t*>(nullptr), L, scale);
        return true;
      }
    }
    constexpr std::size_t smem = TcLayout<P, HD>::fwd_bytes;
    constexpr auto kernel = attention_tc_forward_kernel<P, HD>;
    if (!tc_kernel_usable<kernel>(ctx, smem)) return false;
    launch_smem("attention_forward", ctx, grid, tc_threads, smem, kernel, out, lse, qkv, L, scale);
    return true;
  });
}

template <class T>
bool attention_tc_backward(const Context& ctx, MatrixView<T> dqkv, MatrixView<const T> dout, MatrixView<const T> out,
                           const T* lse, MatrixView<const T> qkv, HeadLayout L, index_t batch) {
  return with_tc_attention<T>(ctx, L.hd, [&](auto path, auto hd) {
    constexpr int P = decltype(path)::value, HD = decltype(hd)::value;
    const dim3 grid(blocks_exact(L.seq, tc_tile), static_cast<unsigned>(batch * L.heads));
    const float scale = 1.0f / std::sqrt(float(L.hd));
    if constexpr (P == gemm_bf16) {  // attention_mma.cuh
      constexpr std::size_t smem = MmaBackwardSmem<HD>::bytes;
      constexpr auto kernel = attention_mma_backward_kernel<HD, float, float>;
      if (tc_kernel_usable<kernel>(ctx, smem)) {
        launch_smem("attention_backward", ctx, grid, tc_threads, smem, kernel, dqkv.data, dqkv.ld, dqkv.data + L.d,
                    dqkv.ld, dout, out.data, lse, qkv, static_cast<const std::uint16_t*>(nullptr), L, scale, dout.ld);
        return true;
      }
    }
    constexpr std::size_t smem = TcLayout<P, HD>::bwd_bytes;
    constexpr auto kernel = attention_tc_backward_kernel<P, HD>;
    if (!tc_kernel_usable<kernel>(ctx, smem)) return false;
    launch_smem("attention_backward", ctx, grid, tc_threads, smem, kernel, dqkv, dout, out, lse, qkv, L, scale,
                dqkv.ld, dout.ld);
    return true;
  });
}

// The attention-linear pair's bf16 layout (attention_ops.hpp): O written and read as bf16 bits by the mma kernels.
// f(head dim) where it applies (BF16, head dim 64 or 128, both kernels launchable); false otherwise.
template <class F>
bool with_mma_bf16_out(const Context& ctx, index_t hd, F&& f) {
  if (ctx.precision != Precision::BF16 || (hd != 64 && hd != 128)) return false;
  const auto usable = [&](auto hdc) {
    constexpr int HD = decltype(hdc)::value;
    return tc_kernel_usable<attention_mma_forward_kernel<HD, std::uint16_t>>(ctx, mma_forward_smem<HD>(false)) &&
           tc_kernel_usable<attention_mma_backward_kernel<HD, std::uint16_t, float>>(ctx, MmaBackwardSmem<HD>::bytes) &&
           tc_kernel_usable<attention_mma_backward_kernel<HD, std::uint16_t, std::uint16_t>>(
               ctx, MmaBackwardSmem<HD>::bytes) &&
           (f(hdc), true);
  };
  return hd == 64 ? usable(std::integral_constant<int, 64>{}) : usable(std::integral_constant<int, 128>{});
}
// The attention pair's qkv layout (norm_ops.hpp, attention_ops.hpp): Q, K and V read as bf16 bits by the mma kernels'
// Q16 instances, at head dim 64 (GPT-2's) only. f(head dim) where they apply (BF16, head dim 64, every instance a
// qkv in bf16 may run launchable: O in bf16 or fp32, both gradient layouts); false otherwise.
template <class F>
bool with_mma_bf16_qkv(const Context& ctx, index_t hd, F&& f) {
  if (ctx.precision != Precision::BF16 || hd != 64) return false;
  using u16 = std::uint16_t;
  constexpr std::size_t bwd = MmaBackwardSmem<64>::bytes;
  const bool usable =
      tc_kernel_usable<attention_mma_forward_kernel<64, u16, true>>(ctx, mma_forward_smem<64>(true)) &&
      tc_kernel_usable<attention_mma_forward_kernel<64, float, true>>(ctx, mma_forward_smem<64>(true)) &&
      tc_kernel_usable<attention_mma_backward_kernel<64, u16, float, true>>(ctx, mma_backward_smem_bytes<64>(true)) &&
      tc_kernel_usable<attention_mma_backward_kernel<64, u16, u16, true>>(ctx, mma_backward_smem_bytes<64>(true)) &&
      tc_kernel_usable<attention_mma_backward_kernel<64, float, float, true>>(ctx, bwd);
  if (usable) f(std::integral_constant<int, 64>{});
  return usable;
}

}  // namespace dev

#if defined(MOM_CUDA_FLOAT_UNIT)  // non-template: defined in mom_cuda.cu alone (kernels/all.cuh)
namespace dev {
// The launches of the Q16 instances (a bf16 qkv at head dim 64, rows qkv.cols apart: with_mma_bf16_qkv), O as OE: bf16
// bits, or fp32 where att's bf16 layout does not fit. The forward; the backward with dK and dV as GE, in its pipelined
// form for a bf16 O. False, nothing launched, where they do not apply.
template <class OE>
bool mma_forward_q16(const Context& ctx, OE* out, index_t out_ld, float* lse, MatrixView<const float> qkv,
                     index_t batch, index_t seq, index_t heads, const std::uint16_t* qkv16) {
  const index_t d = qkv.cols / 3, hd = d / heads;
  const HeadLayout L{seq, heads, d, hd, qkv.cols, out_ld};
  return with_mma_bf16_qkv(ctx, hd, [&](auto hdc) {
    constexpr int HD = decltype(hdc)::value;
    launch_smem("attention_forward", ctx, dim3(blocks_exact(seq, tc_tile), static_cast<unsigned>(batch * heads)),
                tc_threads, mma_forward_smem<HD>(true), attention_mma_forward_kernel<HD, OE, true>, out, lse, qkv,
                qkv16, L, 1.0f / std::sqrt(float(hd)));
  });
}
template <class OE, class GE>
bool mma_backward_q16(const Context& ctx, float* dq, index_t dq_ld, GE* dkv, index_t dkv_ld,
                      MatrixView<const float> dout, const OE* out, index_t out_ld, const float* lse,
                      MatrixView<const float> qkv, const std::uint16_t* qkv16, index_t batch, index_t seq,
                      index_t heads) {
  const index_t d = qkv.cols / 3, hd = d / heads;
  const HeadLayout L{seq, heads, d, hd, qkv.cols, out_ld};
  return with_mma_bf16_qkv(ctx, hd, [&](auto hdc) {
    constexpr int HD = decltype(hdc)::value;
    launch_smem("attention_backward", ctx, dim3(blocks_exact(seq, tc_tile), static_cast<unsigned>(batch * heads)),
                tc_threads, mma_backward_smem_bytes<HD>(std::is_same_v<OE, std::uint16_t>),
                attention_mma_backward_kernel<HD, OE, GE, true>, dq, dq_ld, dkv, dkv_ld, dout, out, lse, qkv, qkv16, L,
                1.0f / std::sqrt(float(hd)), dout.ld);
  });
}
}  // namespace dev

bool attention_forward_bf16(const Context& ctx, std::uint16_t* out, index_t out_ld, float* lse,
                            MatrixView<const float> qkv, index_t batch, index_t seq, index_t heads,
                            const std::uint16_t* qkv16) {
  if (qkv16) return dev::mma_forward_q16(ctx, out, out_ld, lse, qkv, batch, seq, heads, qkv16);
  const index_t d = qkv.cols / 3, hd = d / heads;
  const dev::HeadLayout L{seq, heads, d, hd, qkv.ld, out_ld};
  return dev::with_mma_bf16_out(ctx, hd, [&](auto hdc) {
    constexpr int HD = decltype(hdc)::value;
    const dim3 grid(dev::blocks_exact(seq, dev::tc_tile), static_cast<unsigned>(batch * heads));
    dev::launch_smem("attention_forward", ctx, grid, dev::tc_threads, dev::mma_forward_smem<HD>(false),
                     dev::attention_mma_forward_kernel<HD, std::uint16_t>, out, lse, qkv,
                     static_cast<const std::uint16_t*>(nullptr), L, 1.0f / std::sqrt(float(hd)));
  });
}
bool attention_takes_bf16_qkv(const Context& ctx, index_t hd) {
  return dev::with_mma_bf16_qkv(ctx, hd, [](auto) {});
}
void attention_forward_bf16(const Context& ctx, MatrixView<float> out, float* lse, MatrixView<const float> qkv,
                            index_t batch, index_t seq, index_t heads, const std::uint16_t* qkv16) {
  MOM_CHECK(dev::mma_forward_q16(ctx, out.data, out.ld, lse, qkv, batch, seq, heads, qkv16),
            "attention_forward: a bf16 qkv's kernels do not apply (precision changed since norm_linear_forward?)");
}
void attention_backward_bf16(const Context& ctx, MatrixView<float> dqkv, MatrixView<const float> dout,
                             MatrixView<const float> out, const float* lse, MatrixView<const float> qkv, index_t batch,
                             index_t seq, index_t heads, const std::uint16_t* qkv16) {
  const index_t d = qkv.cols / 3;
  MOM_CHECK(dev::mma_backward_q16(ctx, dqkv.data, dqkv.ld, dqkv.data + d, dqkv.ld, dout, out.data, out.ld, lse, qkv,
                                  qkv16, batch, seq, heads),
            "attention_backward: a bf16 qkv's kernels do not apply (precision changed since forward?)");
}
namespace dev {
// attention_backward_bf16's two gradient layouts: GE = float (added) or std::uint16_t (bf16 bits, written).
template <class GE>
void attention_backward_bf16_into(const Context& ctx, float* dq, index_t dq_ld, GE* dkv, index_t dkv_ld,
                                  MatrixView<const float> dout, const std::uint16_t* out, index_t out_ld,
                                  const float* lse, MatrixView<const float> qkv, const std::uint16_t* qkv16,
                                  index_t batch, index_t seq, index_t heads) {
  const index_t d = qkv.cols / 3, hd = d / heads;
  const HeadLayout L{seq, heads, d, hd, qkv.ld, out_ld};
  const bool ran =
      qkv16 ? mma_backward_q16(ctx, dq, dq_ld, dkv, dkv_ld, dout, out, out_ld, lse, qkv, qkv16, batch, seq, heads)
            : with_mma_bf16_out(ctx, hd, [&](auto hdc) {
                constexpr int HD = decltype(hdc)::value;
                const dim3 grid(blocks_exact(seq, tc_tile), static_cast<unsigned>(batch * heads));
                launch_smem("attention_backward", ctx, grid, tc_threads, MmaBackwardSmem<HD>::bytes,
                            attention_mma_backward_kernel<HD, std::uint16_t, GE>, dq, dq_ld, dkv, dkv_ld, dout, out,
                            lse, qkv, static_cast<const std::uint16_t*>(nullptr), L, 1.0f / std::sqrt(float(hd)),
                            dout.ld);
              });
  MOM_CHECK(ran, "attention_backward_bf16: the bf16 output's kernels do not apply (precision changed since forward?)");
}
}  // namespace dev

void attention_backward_bf16(const Context& ctx, MatrixView<float> dqkv, MatrixView<const float> dout,
                             const std::uint16_t* out, index_t out_ld, const float* lse, MatrixView<const float> qkv,
                             index_t batch, index_t seq, index_t heads, const std::uint16_t* qkv16) {
  const index_t d = qkv.cols / 3;
  dev::attention_backward_bf16_into(ctx, dqkv.data, dqkv.ld, dqkv.data + d, dqkv.ld, dout, out, out_ld, lse, qkv,
                                    qkv16, batch, seq, heads);
}
void attention_backward_bf16(const Context& ctx, float* dq, index_t dq_ld, std::uint16_t* dkv, index_t dkv_ld,
                             MatrixView<const float> dout, const std::uint16_t* out, index_t out_ld, const float* lse,
                             MatrixView<const float> qkv, index_t batch, index_t seq, index_t heads,
                             const std::uint16_t* qkv16) {
  dev::attention_backward_bf16_into(ctx, dq, dq_ld, dkv, dkv_ld, dout, out, out_ld, lse, qkv, qkv16, batch, seq,
                                    heads);
}
#endif

}  // namespace mom::cuda

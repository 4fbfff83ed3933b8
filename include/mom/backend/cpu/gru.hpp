#pragma once
// GRU cell, PyTorch convention (torch.nn.GRUCell), gate order (r, z, n):
//   gi = x·w_ihᵀ + b_ih,  gh = h·w_hhᵀ + b_hh           (each [n × 3H], blocks r | z | n)
//   r = σ(gi_r + gh_r),  z = σ(gi_z + gh_z),  ñ = tanh(gi_n + r ∘ gh_n)
//   h' = (1 - z) ∘ ñ + z ∘ h
// The MoM router (Mixture-of-Modules, §3.3) is this cell run over the assembly steps.
// Forward saves gates = [gi | gh] ([n × 6H]); backward recomputes r, z, ñ from them.
#include <algorithm>
#include <cmath>
#include <span>

#include <Eigen/Core>

#include "mom/backend/cpu/gemm.hpp"
#include "mom/backend/cpu/linear.hpp"
#include "mom/backend/shape_checks.hpp"
#include "mom/core/check.hpp"
#include "mom/core/tensor.hpp"

namespace mom::cpu {

namespace detail {
template <class T>
T sigmoid(T a) {
  return T(1) / (T(1) + std::exp(-a));
}

// The gate math runs on column chunks of at most kGruChunk as Eigen arrays: Eigen's vectorised
// logistic and tanh (float: AVX-512 rational approximations within a few ulp) instead of scalar
// std::exp / std::tanh, which cost more than the cell's two GEMMs at width 256 (measured:
// 15 ms of gate math vs 8.5 ms of GEMMs per 4096-row forward). Fixed-capacity arrays: no heap.
inline constexpr index_t kGruChunk = 64;
template <class T>
using GruChunk = Eigen::Array<T, Eigen::Dynamic, 1, 0, kGruChunk, 1>;
template <class T>
using GruIn = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>;
template <class T>
using GruOut = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>;
}  // namespace detail

template <class T>
void gru_cell_forward(MatrixView<T> h_out, MatrixView<T> gates, MatrixView<const T> x, MatrixView<const T> h,
                      MatrixView<const T> w_ih, MatrixView<const T> w_hh, std::span<const T> b_ih,
                      std::span<const T> b_hh) {
  const index_t n = h_out.rows, H = h_out.cols;
  checks::gru_shapes<T>("gru_cell_forward", n, H, gates, x, h, w_ih, w_hh, ssize(b_ih), ssize(b_hh));
  linear_forward<T>(gates.col_block(0, 3 * H), x, w_ih, b_ih);
  linear_forward<T>(gates.col_block(3 * H, 3 * H), h, w_hh, b_hh);
#pragma omp parallel for schedule(static) if (n * H > (1 << 14))
  for (index_t i = 0; i < n; ++i) {
    const T* gi = gates.row(i);
    const T* gh = gi + 3 * H;
    const T* hp = h.row(i);
    T* ho = h_out.row(i);
    for (index_t j = 0; j < H; j += detail::kGruChunk) {
      using detail::GruIn;
      const index_t c = std::min(detail::kGruChunk, H - j);
      const detail::GruChunk<T> r = (GruIn<T>(gi + j, c) + GruIn<T>(gh + j, c)).logistic();
      const detail::GruChunk<T> z = (GruIn<T>(gi + H + j, c) + GruIn<T>(gh + H + j, c)).logistic();
      const detail::GruChunk<T> nn = (GruIn<T>(gi + 2 * H + j, c) + r * GruIn<T>(gh + 2 * H + j, c)).tanh();
      detail::GruOut<T>(ho + j, c) = (T(1) - z) * nn + z * GruIn<T>(hp + j, c);
    }
  }
}

// Accumulates every gradient (dx, dh, dw_ih, dw_hh, db_ih, db_hh; each may be empty) from dh_out.
// scratch [n × 6H] receives the pre-activation gradients [dgi | dgh] (overwritten).
template <class T>
void gru_cell_backward(MatrixView<T> dx, MatrixView<T> dh, MatrixView<T> dw_ih, MatrixView<T> dw_hh,
                       std::span<T> db_ih, std::span<T> db_hh, MatrixView<T> scratch, MatrixView<const T> dh_out,
                       MatrixView<const T> gates, MatrixView<const T> x, MatrixView<const T> h,
                       MatrixView<const T> w_ih, MatrixView<const T> w_hh) {
  const index_t n = dh_out.rows, H = dh_out.cols;
  checks::gru_shapes<T>("gru_cell_backward", n, H, gates, x, h, w_ih, w_hh, db_ih.empty() ? 3 * H : ssize(db_ih),
                              db_hh.empty() ? 3 * H : ssize(db_hh));
  checks::gru_backward_extra_shapes<T>(n, H, scratch, dh, h);
#pragma omp parallel for schedule(static) if (n * H > (1 << 14))
  for (index_t i = 0; i < n; ++i) {
    const T* gi = gates.row(i);
    const T* gh = gi + 3 * H;
    const T* hp = h.row(i);
    const T* g = dh_out.row(i);
    T* dgi = scratch.row(i);
    T* dgh = dgi + 3 * H;
    T* dhp = dh.empty() ? nullptr : dh.row(i);
    for (index_t j = 0; j < H; j += detail::kGruChunk) {
      using detail::GruIn, detail::GruOut;
      const index_t c = std::min(detail::kGruChunk, H - j);
      const auto ghn = GruIn<T>(gh + 2 * H + j, c), gj = GruIn<T>(g + j, c);
      const detail::GruChunk<T> r = (GruIn<T>(gi + j, c) + GruIn<T>(gh + j, c)).logistic();
      const detail::GruChunk<T> z = (GruIn<T>(gi + H + j, c) + GruIn<T>(gh + H + j, c)).logistic();
      const detail::GruChunk<T> nn = (GruIn<T>(gi + 2 * H + j, c) + r * ghn).tanh();
      const detail::GruChunk<T> dn_pre = gj * (T(1) - z) * (T(1) - nn * nn);  // through ñ = tanh(.)
      const detail::GruChunk<T> dz_pre = gj * (GruIn<T>(hp + j, c) - nn) * z * (T(1) - z);
      const detail::GruChunk<T> dr_pre = dn_pre * ghn * r * (T(1) - r);
      GruOut<T>(dgi + j, c) = dr_pre;
      GruOut<T>(dgh + j, c) = dr_pre;
      GruOut<T>(dgi + H + j, c) = dz_pre;
      GruOut<T>(dgh + H + j, c) = dz_pre;
      GruOut<T>(dgi + 2 * H + j, c) = dn_pre;
      GruOut<T>(dgh + 2 * H + j, c) = dn_pre * r;
      if (dhp) GruOut<T>(dhp + j, c) += gj * z;  // the direct path h' = ... + z ∘ h
    }
  }
  const MatrixView<const T> dgi = scratch.col_block(0, 3 * H), dgh = scratch.col_block(3 * H, 3 * H);
  linear_backward<T>(dx, dw_ih, db_ih, dgi, x, w_ih);
  linear_backward<T>(dh, dw_hh, db_hh, dgh, h, w_hh);
}

}  // namespace mom::cpu

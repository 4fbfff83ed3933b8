#pragma once
// Rotary position embedding (RoPE, arXiv 2104.09864; cpu/rope.hpp has the formulas and the layout),
// forward and backward in one kernel: backward is the rotation by the opposite angle, in place.
//   θ_i = base^(−2i/head_dim),
//   x'_i = x_i cos(pθ_i) − x_{i+h} sin(pθ_i),  x'_{i+h} = x_{i+h} cos(pθ_i) + x_i sin(pθ_i)
// One thread per (row, pair i): it computes the angle, cos and sin in double once (the same expression
// as the CPU op), then rotates pair i of every head of its row (the q and k heads of a qkv block alike).
// No table: nothing to size or allocate. The grouped form reads the row groups' offsets on the device
// (kernels/grouped.cuh) and touches only the rows [offsets[0], offsets[count]).
#include "mom/backend/cuda/kernels/common.cuh"
#include "mom/backend/cuda/kernels/grouped.cuh"

namespace mom::cuda {

namespace dev {

template <class T>
__global__ void rope_kernel(MatrixView<T> x, const index_t* pos, const token_t* idx, RowGroups g, bool grouped,
                            index_t seq, index_t head_dim, double base, double sign, int* error) {
  RowRange rows{0, x.rows};
  if (grouped) {
    check_offsets(g, x.rows, error);
    rows = grouped_rows(g, x.rows);
  }
  const index_t half = head_dim / 2;
  MOM_GRID_STRIDE(e, (rows.hi - rows.lo) * half) {
    const index_t r = rows.lo + e / half, i = e % half;
    index_t p = pos ? pos[r] : idx ? index_t(idx[r]) : r;
    if (p < 0 || (pos && p >= seq)) {
      if (i == 0) report(error, DeviceError::rope_position, r, p, seq);
      continue;
    }
    if (!pos) p %= seq;
    const double a = double(p) * pow(base, -2.0 * double(i) / double(head_dim));
    const T c = T(cos(a)), s = T(sign * sin(a));
    T* at = x.data + r * x.ld + i;
    for (index_t h0 = 0; h0 < x.cols; h0 += head_dim) {
      const T x1 = at[h0], x2 = at[h0 + half];
      at[h0] = x1 * c - x2 * s;
      at[h0 + half] = x2 * c + x1 * s;
    }
  }
}

}  // namespace dev

// ---- launcher ---------------------------------------------------------------------------------

template <class T>
void Kernels<T>::rope(const Context& ctx, M x, const index_t* pos, const token_t* idx, RowGroups g, bool grouped,
                      index_t seq, index_t head_dim, double base, bool inverse) {
  if (grouped && g.count == 0) return;
  dev::launch(inverse ? "rope_backward" : "rope_forward", ctx, dev::blocks_for(x.rows * (head_dim / 2)), dev::threads,
              dev::rope_kernel<T>, x, pos, idx, g, grouped, seq, head_dim, base, inverse ? -1.0 : 1.0, ctx.error);
}

}  // namespace mom::cuda

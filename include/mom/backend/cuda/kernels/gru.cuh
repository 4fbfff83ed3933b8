#pragma once
// The GRU cell's pointwise parts (cpu/gru.hpp; its GEMMs run through cuBLAS in ops.hpp).
#include "mom/backend/cuda/kernels/common.cuh"

namespace mom::cuda {

namespace dev {

// ---- GRU cell pointwise parts (gate order r, z, n; see cpu/gru.hpp) ---------------------------

template <class T>
__global__ void gru_forward_kernel(MatrixView<T> h_out, MatrixView<const T> gates, MatrixView<const T> h) {
  const index_t H = h_out.cols;
  MOM_GRID_STRIDE(e, h_out.rows * H) {
    const index_t i = e / H, j = e % H;
    const T* gi = gates.data + i * gates.ld;
    const T* gh = gi + 3 * H;
    const T r = sigmoid_(gi[j] + gh[j]);
    const T z = sigmoid_(gi[H + j] + gh[H + j]);
    const T nn = tanh_(gi[2 * H + j] + r * gh[2 * H + j]);
    h_out.data[i * h_out.ld + j] = (T(1) - z) * nn + z * h.data[i * h.ld + j];
  }
}

template <class T>
__global__ void gru_backward_kernel(MatrixView<T> scratch, MatrixView<T> dh, MatrixView<const T> dh_out,
                                    MatrixView<const T> gates, MatrixView<const T> h) {
  const index_t H = dh_out.cols;
  MOM_GRID_STRIDE(e, dh_out.rows * H) {
    const index_t i = e / H, j = e % H;
    const T* gi = gates.data + i * gates.ld;
    const T* gh = gi + 3 * H;
    const T g = dh_out.data[i * dh_out.ld + j];
    const T hp = h.data[i * h.ld + j];
    const T r = sigmoid_(gi[j] + gh[j]);
    const T z = sigmoid_(gi[H + j] + gh[H + j]);
    const T nn = tanh_(gi[2 * H + j] + r * gh[2 * H + j]);
    const T dn_pre = g * (T(1) - z) * (T(1) - nn * nn);
    const T dz_pre = g * (hp - nn) * z * (T(1) - z);
    const T dr_pre = dn_pre * gh[2 * H + j] * r * (T(1) - r);
    T* dgi = scratch.data + i * scratch.ld;
    T* dgh = dgi + 3 * H;
    dgi[j] = dr_pre;
    dgh[j] = dr_pre;
    dgi[H + j] = dz_pre;
    dgh[H + j] = dz_pre;
    dgi[2 * H + j] = dn_pre;
    dgh[2 * H + j] = dn_pre * r;
    if (dh.data) dh.data[i * dh.ld + j] += g * z;
  }
}

}  // namespace dev

// ---- launchers --------------------------------------------------------------------------------

template <class T>
void Kernels<T>::gru_pointwise_forward(const Context& ctx, M h_out, CM gates, CM h) {
  dev::launch("gru_cell_forward", ctx, dev::blocks_for(h_out.rows * h_out.cols), dev::threads,
              dev::gru_forward_kernel<T>, h_out, gates, h);
}
template <class T>
void Kernels<T>::gru_pointwise_backward(const Context& ctx, M scratch, M dh, CM dh_out, CM gates, CM h) {
  dev::launch("gru_cell_backward", ctx, dev::blocks_for(dh_out.rows * dh_out.cols), dev::threads,
              dev::gru_backward_kernel<T>, scratch, dh, dh_out, gates, h);
}

}  // namespace mom::cuda

#pragma once
// Token + position embedding, forward and backward (cpu/embedding.hpp); an empty wpe: token embedding only. The
// forward takes row t's position as t mod seq, or pos[t] (device memory) for rows at positions of their own.
#include "mom/backend/cuda/kernels/common.cuh"

namespace mom::cuda {

namespace dev {

// ---- embedding --------------------------------------------------------------------------------

template <class T>
__global__ void embedding_forward_kernel(MatrixView<T> out, const token_t* tokens, MatrixView<const T> wte,
                                         MatrixView<const T> wpe, index_t seq, const index_t* pos, int* error) {
  const index_t d = out.cols;
  MOM_GRID_STRIDE(e, out.rows * d) {
    const index_t t = e / d, c = e % d;
    const token_t tok = tokens[t];
    if (tok < 0 || tok >= wte.rows) {
      if (c == 0) report(error, DeviceError::embedding_token, t, tok, wte.rows);
      continue;
    }
    const T e_tok = wte.data[index_t(tok) * wte.ld + c];
    if (!wpe.data) {  // no wpe: RoPE model
      out.data[t * out.ld + c] = e_tok;
      continue;
    }
    const index_t p = pos ? pos[t] : t % seq;
    if (p < 0 || p >= wpe.rows) {
      if (c == 0) report(error, DeviceError::embedding_position, t, p, wpe.rows);
      continue;
    }
    out.data[t * out.ld + c] = e_tok + wpe.data[p * wpe.ld + c];
  }
}

template <class T>
__global__ void embedding_backward_kernel(MatrixView<T> dwte, MatrixView<T> dwpe, MatrixView<const T> dout,
                                          const token_t* tokens, index_t seq, index_t vocab, int* error) {
  const index_t d = dout.cols;
  MOM_GRID_STRIDE(e, dout.rows * d) {
    const index_t t = e / d, c = e % d;
    const T g = dout.data[t * dout.ld + c];
    if (dwte.data) {
      const token_t tok = tokens[t];
      if (tok < 0 || tok >= vocab) {
        if (c == 0) report(error, DeviceError::embedding_backward_token, t, tok, vocab);
      } else {
        atomicAdd(dwte.data + index_t(tok) * dwte.ld + c, g);
      }
    }
    if (dwpe.data) atomicAdd(dwpe.data + (t % seq) * dwpe.ld + c, g);
  }
}

}  // namespace dev

// ---- launchers --------------------------------------------------------------------------------

template <class T>
void Kernels<T>::embedding_forward(const Context& ctx, M out, const token_t* tokens, CM wte, CM wpe, index_t seq,
                                   const index_t* pos) {
  dev::launch("embedding_forward", ctx, dev::blocks_for(out.rows * out.cols), dev::threads,
              dev::embedding_forward_kernel<T>, out, tokens, wte, wpe, seq, pos, ctx.error);
}
template <class T>
void Kernels<T>::embedding_backward(const Context& ctx, M dwte, M dwpe, CM dout, const token_t* tokens, index_t seq,
                                    index_t vocab) {
  if (dwte.empty() && dwpe.empty()) return;
  dev::launch("embedding_backward", ctx, dev::blocks_for(dout.rows * dout.cols), dev::threads,
              dev::embedding_backward_kernel<T>, dwte, dwpe, dout, tokens, seq, vocab, ctx.error);
}

}  // namespace mom::cuda

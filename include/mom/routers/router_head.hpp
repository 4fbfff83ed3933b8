#pragma once
// The front every MoE gate here shares (TopK<Softmax>, TopK<Sigmoid>, TopC<Softmax>): the router's own
// pre-norm and one linear map to its C scores,
//   z = LN_r(in),  logits = W z   (W [C × d], no bias)
// with parameters ln.w, ln.b [d] and W at the start of the gate's block (routers/topk.hpp says why a router
// normalises for itself). Forward and backward side by side; the gates add their selection around it.
#include <array>

#include "mom/core/layout.hpp"
#include "mom/core/tensor.hpp"
#include "mom/modules/module.hpp"

namespace mom::detail {

template <index_t d, index_t C>
struct NormedRouterHead {
  static constexpr index_t o_ln_w = 0, o_ln_b = d, o_w = 2 * d, params = 2 * d + C * d;
  struct Saved {
    index_t ln = 0, mean = 0, rstd = 0;  // z [rows × d] and LN_r's statistics
  };
  static constexpr Saved plan(Arena& a, index_t rows) {
    Saved s{};
    s.ln = a.take(rows * d);
    s.mean = a.take(rows);
    s.rstd = a.take(rows);
    return s;
  }
  static constexpr std::array<TensorSpec, 3> tensors(index_t layer) {  // h.<layer>.router.*
    return {{{"router.ln.w", layer, 1, d, Init::One},
             {"router.ln.b", layer, 1, d, Init::Zero},
             {"router.w", layer, C, d, Init::Normal}}};
  }
  static constexpr index_t scratch(index_t rows) { return rows * d; }  // dL/dz
  static constexpr index_t flops_per_token() { return 2 * d * C; }

  template <class Be, class T>
  static void forward(Be& be, const T* p, T* ws, const Saved& s, MatrixView<const T> in, MatrixView<T> logits) {
    const index_t rows = in.rows;
    const MatrixView<T> z{ws + s.ln, rows, d};
    be.layernorm_forward(z, vec(ws, s.mean, rows), vec(ws, s.rstd, rows), in, vec(p, o_ln_w, d), vec(p, o_ln_b, d));
    be.linear_forward(logits, MatrixView<const T>(z), mat(p, o_w, C, d), std::span<const T>{});
  }
  // din += dL/din through W and LN_r for dlogits [rows × C]; the parameter gradients into g. scratch: rows·d.
  template <class Be, class T>
  static void backward(Be& be, const T* p, T* g, const T* ws, const Saved& s, MatrixView<const T> in,
                       MatrixView<T> din, MatrixView<const T> dlogits, T* scratch) {
    const index_t rows = in.rows;
    const MatrixView<T> dz{scratch, rows, d};
    be.zero(dz.flat());
    be.linear_backward(dz, mat(g, o_w, C, d), std::span<T>{}, dlogits, MatrixView<const T>{ws + s.ln, rows, d},
                       mat(p, o_w, C, d));
    be.layernorm_backward(din, vec(g, o_ln_w, d), vec(g, o_ln_b, d), MatrixView<const T>(dz), in, vec(ws, s.mean, rows),
                          vec(ws, s.rstd, rows), vec(p, o_ln_w, d));
  }
};

}  // namespace mom::detail

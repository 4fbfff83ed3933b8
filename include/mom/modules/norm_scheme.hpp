#pragma once
// Where a module puts its LayerNorm (MoEUT, arXiv 2405.16039, §2.4, Figs. 3 and 8), for the modules that
// offer the choice (SigmaMoE, SwitchHead):
//   PreNorm   LN(x) feeds every projection of the module (GPT-2's pre-norm, paper eq. (4) of MoM)
//   PeriNorm  LN(x) feeds only the linear layers followed by a sigmoid or softmax: the expert selections,
//             and attention's query and key projections; the value path and the experts read x itself
//   PostNorm  no LayerNorm inside: the module reads x itself everywhere and its output is normalised
//             after the residual addition, x ↦ LN(x + f(x)) (the original Transformer). φ adds the
//             residual, so the module returns LN(x + f(x)) − x (post_norm_forward below); its
//             LayerNorm tensors are then the post-norm's gain and bias.
#include <span>
#include <type_traits>

#include "mom/core/tensor.hpp"

namespace mom {

struct PreNorm {};
struct PeriNorm {};
struct PostNorm {};

template <class N>
inline constexpr bool is_norm_scheme =
    std::is_same_v<N, PreNorm> || std::is_same_v<N, PeriNorm> || std::is_same_v<N, PostNorm>;

namespace detail {
// PostNorm's output: f_out holds y = f(x) on entry; z = x + y (kept for backward), then
// f_out = LN(z) − x, so that φ's residual x + f_out is LN(x + f(x)).
template <class Be, class T>
void post_norm_forward(Be& be, MatrixView<T> f_out, MatrixView<T> z, std::span<T> mean, std::span<T> rstd,
                       MatrixView<const T> x, std::span<const T> gamma, std::span<const T> beta) {
  be.add_forward(z.flat(), x.flat(), std::span<const T>(f_out.flat()));
  be.layernorm_forward(f_out, mean, rstd, MatrixView<const T>(z), gamma, beta);
  be.axpy(f_out.flat(), T(-1), x.flat());
}
// Its backward: dz = LN'(z)ᵀ·df (written; the inner module's output gradient, since z = x + y), the
// gain and bias gradients accumulated, and dx += dz − df (z's identity path and the −x term). df may
// alias dx: it is read before dx is written.
template <class Be, class T>
void post_norm_backward(Be& be, MatrixView<T> dz, std::span<T> dgamma, std::span<T> dbeta, MatrixView<const T> df,
                        MatrixView<const T> z, std::span<const T> mean, std::span<const T> rstd,
                        std::span<const T> gamma, MatrixView<T> dx) {
  be.zero(dz);
  be.layernorm_backward(dz, dgamma, dbeta, df, z, mean, rstd, gamma);
  be.axpy(dx.flat(), T(-1), df.flat());
  be.axpy(dx.flat(), T(1), std::span<const T>(dz.flat()));
}
}  // namespace detail

}  // namespace mom

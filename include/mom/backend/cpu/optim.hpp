#pragma once
// AdamW over one flat parameter buffer (Loshchilov & Hutter, decoupled weight decay) and the
// global gradient L2 norm used for clipping. Both are single passes over the flat buffers.
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>

#include "mom/backend/cpu/parallel.hpp"
#include "mom/backend/shape_checks.hpp"
#include "mom/core/check.hpp"
#include "mom/core/tensor.hpp"

namespace mom::cpu {

struct AdamWConfig {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

// *norm_out = sqrt(Σ g²) (summed in double). norm_out is backend memory, so a GPU backend can
// hand it straight to adamw_step without a host round trip.
template <class T>
void grad_norm(std::span<const T> grads, T* norm_out) {
  checks::grad_norm_args<T>(grads, norm_out);
  const index_t n = ssize(grads);
  const T* g = grads.data();
  const double sum = detail::ordered_sum<double>(n, n > (1 << 16), [g](index_t begin, index_t end) {
    double acc = 0;
#pragma omp simd reduction(+ : acc)
    for (index_t i = begin; i < end; ++i) acc += double(g[i]) * double(g[i]);
    return acc;
  });
  *norm_out = T(std::sqrt(sum));
}

// The clipping factor c = min(1, max_norm / norm) (1 when max_norm == 0: clipping off).
template <class T>
constexpr T clip_factor(T norm, T max_norm) {
  return max_norm > T(0) && norm > max_norm ? max_norm / norm : T(1);
}

// True when AdamW must skip the step whose global gradient norm is `norm`: the norm is inf or NaN (a
// diverged step), or the clipped gradient is so large that g² overflows T in the second moment v
// (|g_i| <= norm · c, so norm · c < sqrt(max T) keeps every v finite; without clipping a float gradient
// of 2e19 would otherwise leave +Inf in v, and a dead parameter behind it). The one rule of the
// optimizer contract: the CPU op, the CUDA kernel (kernels/optim.cuh) and the Trainer's count of
// skipped steps all apply it.
template <class T>
constexpr bool adamw_skips(T norm, T max_norm) {
  if (!(norm - norm == T(0))) return true;  // inf or NaN (and no -ffast-math isfinite pitfalls)
  return norm * clip_factor(norm, max_norm) >= std::sqrt(std::numeric_limits<T>::max());
}

// One AdamW step, step >= 1 (bias correction 1 - β^step):
//   g = grads · c,  c = clip_factor(*grad_norm, max_norm) when grad_norm, else 1
// A step that adamw_skips (inf or NaN gradients, or a gradient whose square overflows T) is skipped:
// parameters and moments stay as they were, so a trainer that notices the divergence lost nothing.
//   m = β1 m + (1-β1) g,  v = β2 v + (1-β2) g²
//   p -= lr · ( (m / (1-β1^t)) / (sqrt(v / (1-β2^t)) + eps) + weight_decay · p )
template <class T>
void adamw_step(std::span<T> params, std::span<const T> grads, std::span<T> m, std::span<T> v, const AdamWConfig& cfg,
                std::int64_t step, const T* grad_norm = nullptr, T max_norm = T(0)) {
  checks::adamw_step_args<T>(params, grads, m, v, step);
  if (grad_norm != nullptr && adamw_skips(*grad_norm, max_norm)) return;
  const T clip = grad_norm != nullptr ? clip_factor(*grad_norm, max_norm) : T(1);
  const T b1 = T(cfg.beta1), b2 = T(cfg.beta2), eps = T(cfg.eps);
  const T decay = T(cfg.lr * cfg.weight_decay);
  const T step_size = T(cfg.lr / (1.0 - std::pow(cfg.beta1, double(step))));  // lr / bias correction 1
  const T inv_sqrt_bc2 = T(1.0 / std::sqrt(1.0 - std::pow(cfg.beta2, double(step))));
  const index_t n = ssize(params);
  T* p = params.data();
  const T* g = grads.data();
  T* mm = m.data();
  T* vv = v.data();
#pragma omp parallel for simd schedule(static) if (n > (1 << 16))
  for (index_t i = 0; i < n; ++i) {
    const T gi = g[i] * clip;
    const T mi = b1 * mm[i] + (T(1) - b1) * gi;
    const T vi = b2 * vv[i] + (T(1) - b2) * gi * gi;
    mm[i] = mi;
    vv[i] = vi;
    p[i] -= step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + eps) + decay * p[i];
  }
}

}  // namespace mom::cpu

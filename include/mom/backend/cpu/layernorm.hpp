#pragma once
// LayerNorm over the last dimension: out = (x - mean) * rstd * gamma + beta,
// rstd = 1 / sqrt(var + eps) (biased variance, as PyTorch). mean and rstd are saved for backward.
#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

#include "mom/backend/cpu/eigen_map.hpp"
#include "mom/backend/cpu/parallel.hpp"
#include "mom/backend/shape_checks.hpp"
#include "mom/core/check.hpp"
#include "mom/core/tensor.hpp"

namespace mom::cpu {

namespace detail {
// Row r of the LayerNorm's input: x's row xi[r] (a routed layer's token rows, read in place of a gathered copy), or
// x's own row r where xi is empty. The shapes are checked by the callers. The same values as a gathered copy, so the
// same bits where the rows sit at the same alignment (Eigen's vectorised sums start at a 64-byte boundary): rows of
// a multiple of 16 floats in the 64-byte aligned buffers of every model here; otherwise rounding-level differences.
template <class T>
const T* norm_row(MatrixView<const T> x, std::span<const token_t> xi, index_t r) {
  return xi.empty() ? x.row(r) : x.row(xi[r]);
}

template <class T>
void layernorm_forward(MatrixView<T> out, std::span<T> mean, std::span<T> rstd, MatrixView<const T> x,
                       std::span<const token_t> xi, std::span<const T> gamma, std::span<const T> beta, T eps) {
  const index_t d = x.cols;
  const auto g = map_vec(gamma).array();
  const auto b = map_vec(beta).array();
#pragma omp parallel for schedule(static) if (out.rows * d > (1 << 15))
  for (index_t r = 0; r < out.rows; ++r) {
    // The row sits in L1 after the first read, so the two-pass (mean, then centred variance)
    // form costs one trip to memory and avoids the cancellation of E[x²] - E[x]².
    const auto xr = map_vec(std::span<const T>(norm_row(x, xi, r), d)).array();
    const T mu = xr.sum() / T(d);
    const T var = (xr - mu).square().sum() / T(d);
    const T rs = T(1) / std::sqrt(var + eps);
    map_vec(std::span<T>(out.row(r), d)).array() = (xr - mu) * rs * g + b;
    mean[r] = mu;
    rstd[r] = rs;
  }
}
}  // namespace detail

template <class T>
void layernorm_forward(MatrixView<T> out, std::span<T> mean, std::span<T> rstd, MatrixView<const T> x,
                       std::span<const T> gamma, std::span<const T> beta, T eps = T(1e-5)) {
  checks::layernorm_forward_shapes<T>(out, mean, rstd, x, gamma, beta);
  detail::layernorm_forward<T>(out, mean, rstd, x, {}, gamma, beta, eps);
}

namespace detail {
// x's rows through xi as detail::layernorm_forward; dx, dout, mean and rstd have one row per normalised row.
template <class T>
void layernorm_backward(MatrixView<T> dx, std::span<T> dgamma, std::span<T> dbeta, MatrixView<const T> dout,
                        MatrixView<const T> x, std::span<const token_t> xi, std::span<const T> mean,
                        std::span<const T> rstd, std::span<const T> gamma, Store dx_store) {
  const index_t d = x.cols, rows = dout.rows;
  const bool want_params = !dgamma.empty() || !dbeta.empty();
  const auto g = map_vec(gamma).array();
  // Each thread sums dgamma / dbeta over its static chunk of rows into its own slice of the
  // caller's partial buffer; slices are added in thread order (deterministic, parallel.hpp).
  const int nt = region_threads(rows * d > (1 << 15));
  T* partial = want_params ? partial_buffer<T>(static_cast<std::size_t>(nt) * 2 * d) : nullptr;
  if (partial) std::fill_n(partial, nt * 2 * d, T(0));  // a slice the runtime gave no thread stays 0
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    const int t = omp_get_thread_num(), m = omp_get_num_threads();
    const index_t begin = rows * t / m, end = rows * (t + 1) / m;
    using Vec = Eigen::Array<T, Eigen::Dynamic, 1>;
    Eigen::Map<Vec> pg(partial ? partial + 2 * d * t : nullptr, want_params ? d : 0),
        pb(partial ? partial + 2 * d * t + d : nullptr, want_params ? d : 0);
    for (index_t r = begin; r < end; ++r) {
      const auto xr = map_vec(std::span<const T>(norm_row(x, xi, r), d)).array();
      const auto dr = map_vec(std::span<const T>(dout.row(r), d)).array();
      const T mu = mean[r], rs = rstd[r];
      if (want_params) {
        pg += dr * (xr - mu) * rs;
        pb += dr;
      }
      if (!dx.empty()) {
        // xhat and dxhat are recomputed on the fly: two reductions, then one fused write.
        const T mean_dxhat = (dr * g).sum() / T(d);
        const T mean_dxhat_xhat = (dr * g * (xr - mu)).sum() * rs / T(d);
        auto out = map_vec(std::span<T>(dx.row(r), d)).array();
        const auto v = rs * (dr * g - mean_dxhat - (xr - mu) * rs * mean_dxhat_xhat);  // evaluated by the store
        if (dx_store == Store::add) out += v;
        else out = v;
      }
    }
  }
  for (int t = 0; t < nt && want_params; ++t) {
    using CVec = Eigen::Array<T, Eigen::Dynamic, 1>;
    if (!dgamma.empty()) map_vec(dgamma).array() += Eigen::Map<const CVec>(partial + 2 * d * t, d);
    if (!dbeta.empty()) map_vec(dbeta).array() += Eigen::Map<const CVec>(partial + 2 * d * t + d, d);
  }
}
}  // namespace detail

// Accumulates dx += rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat ∘ xhat)) with dxhat = dout ∘ gamma
// (Store::overwrite: dx = that, its old values never read), dgamma += Σ_rows dout ∘ xhat, dbeta += Σ_rows dout.
// dx, dgamma, dbeta may each be empty.
// The column sums are reduced through one thread_local partial per thread (grown once, reused by
// every later call), so the step allocates nothing after warm-up.
template <class T>
void layernorm_backward(MatrixView<T> dx, std::span<T> dgamma, std::span<T> dbeta, MatrixView<const T> dout,
                        MatrixView<const T> x, std::span<const T> mean, std::span<const T> rstd,
                        std::span<const T> gamma, Store dx_store = Store::add) {
  checks::layernorm_backward_shapes<T>(dx, dgamma, dbeta, dout, x, mean, rstd, gamma);
  detail::layernorm_backward<T>(dx, dgamma, dbeta, dout, x, {}, mean, rstd, gamma, dx_store);
}

}  // namespace mom::cpu

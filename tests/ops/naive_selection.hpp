#pragma once
// Naive double references shared by the selection and MoEUT module tests (tests/ops/selection_entropy_test.cpp,
// tests/models/sigma_moe_test.cpp, tests/models/switch_head_test.cpp): written as the equations read, one
// loop per sum, so that they share nothing with the ops they check.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include <mom/core/tensor.hpp>

namespace mom::test::naive {

// LayerNorm of every row of x [n × d] (eps 1e-5) with gain w and bias b (d values each).
inline std::vector<double> layernorm(const std::vector<double>& x, index_t n, index_t d, const double* w,
                                     const double* b) {
  std::vector<double> y(std::size_t(n * d));
  for (index_t r = 0; r < n; ++r) {
    double mean = 0, var = 0;
    for (index_t c = 0; c < d; ++c) mean += x[std::size_t(r * d + c)];
    mean /= double(d);
    for (index_t c = 0; c < d; ++c) var += std::pow(x[std::size_t(r * d + c)] - mean, 2);
    const double rstd = 1.0 / std::sqrt(var / double(d) + 1e-5);
    for (index_t c = 0; c < d; ++c) y[std::size_t(r * d + c)] = (x[std::size_t(r * d + c)] - mean) * rstd * w[c] + b[c];
  }
  return y;
}

// Post-LayerNorm as a module output (modules/norm_scheme.hpp): out holds y = f(x); it becomes LN(x + y) − x.
inline void post_norm(std::vector<double>& out, const std::vector<double>& x, index_t n, index_t d, const double* w,
                      const double* b) {
  std::vector<double> z(out.size());
  for (std::size_t i = 0; i < z.size(); ++i) z[i] = x[i] + out[i];
  const std::vector<double> ln = layernorm(z, n, d, w, b);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = ln[i] - x[i];
}

// The ids of the k largest of z[0..C), largest first, ties to the lower id.
inline std::vector<int> top_k(const double* z, int C, int k) {
  std::vector<int> order(static_cast<std::size_t>(C));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return z[a] > z[b]; });
  order.resize(std::size_t(k));
  return order;
}

// MoEUT's regulariser without its coefficient (arXiv 2405.16039, eq. (4)): the mean over the B sequences of
// Σ_e p[e] log p[e], p = the mean over the sequence's T rows of softmax(logits row) [B·T × C].
inline double sequence_neg_entropy(const std::vector<double>& logits, index_t B, index_t T, index_t C) {
  double L = 0;
  for (index_t b = 0; b < B; ++b) {
    std::vector<double> p(std::size_t(C), 0.0);
    for (index_t t = 0; t < T; ++t) {
      const double* z = &logits[std::size_t((b * T + t) * C)];
      const double mx = *std::max_element(z, z + C);
      double sum = 0;
      for (index_t e = 0; e < C; ++e) sum += std::exp(z[e] - mx);
      for (index_t e = 0; e < C; ++e) p[std::size_t(e)] += std::exp(z[e] - mx) / sum / double(T);
    }
    for (double pe : p) L += pe * std::log(pe);
  }
  return L / double(B);
}

}  // namespace mom::test::naive

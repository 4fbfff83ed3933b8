#pragma once
// Fused log-softmax + cross-entropy over the vocabulary, mean over the non-ignored targets.
// Forward saves only the row log-sum-exp; backward writes dlogits straight from logits and lse.
#include <algorithm>
#include <cmath>
#include <limits>
#include <span>

#include "mom/backend/cpu/eigen_map.hpp"
#include "mom/backend/cpu/parallel.hpp"
#include "mom/backend/shape_checks.hpp"
#include "mom/core/check.hpp"
#include "mom/core/tensor.hpp"

namespace mom::cpu {

namespace detail {
// log Σ_j exp(row[j]) in one pass over memory: blocks of the row (hot in L1) update a running
// (max, sum) pair, rescaling the sum when the max grows (online softmax).
template <class T>
T row_logsumexp(const T* row, index_t n) {
  constexpr index_t block = 512;
  T m = -std::numeric_limits<T>::infinity();
  T s = T(0);
  for (index_t o = 0; o < n; o += block) {
    const index_t len = std::min(block, n - o);
    const auto b = map_vec(std::span<const T>(row + o, static_cast<std::size_t>(len))).array();
    const T bm = b.maxCoeff();
    if (bm > m) {
      s *= std::exp(m - bm);
      m = bm;
    }
    s += (b - m).exp().sum();
  }
  return m + std::log(s);
}

template <class T>
index_t count_targets(const char* op, std::span<const token_t> targets, index_t vocab, token_t ignore_index) {
  index_t count = 0;
  for (index_t i = 0; i < ssize(targets); ++i) {
    const token_t t = targets[i];
    if (t == ignore_index) continue;
    MOM_CHECK(t >= 0 && t < vocab, op, ": target ", t, " at row ", i, " is out of range for vocab ", vocab,
              " (ignore_index ", ignore_index, ")");
    ++count;
  }
  return count;
}
}  // namespace detail

// loss_out[0] = mean over rows with targets[i] != ignore_index of (lse[i] - logits[i, targets[i]]),
// lse[i] = log Σ_j exp(logits[i, j]) (written for every row). No counted row gives loss 0.
template <class T>
void cross_entropy_forward(std::span<T> loss_out, std::span<T> lse, MatrixView<const T> logits,
                           std::span<const token_t> targets, token_t ignore_index = -1) {
  checks::cross_entropy_forward_shapes<T>(loss_out, lse, logits, targets);
  const index_t count = detail::count_targets<T>("cross_entropy_forward", targets, logits.cols, ignore_index);
  // Summed in double (thousands of rows of float losses), in a fixed order (backend/cpu/parallel.hpp).
  const double total = detail::ordered_sum<double>(logits.rows, logits.rows * logits.cols > (1 << 15),
                                                   [&](index_t begin, index_t end) {
                                                     double sum = 0;
                                                     for (index_t i = begin; i < end; ++i) {
                                                       const T* row = logits.row(i);
                                                       const T l = detail::row_logsumexp(row, logits.cols);
                                                       lse[i] = l;
                                                       if (targets[i] != ignore_index) sum += double(l - row[targets[i]]);
                                                     }
                                                     return sum;
                                                   });
  loss_out[0] = count > 0 ? T(total / double(count)) : T(0);
}

// dlogits = dloss · (softmax(logits) - onehot(target)) / count; rows with an ignored target are 0.
// Writes dlogits, which may alias logits (each element is read once, then overwritten).
template <class T>
void cross_entropy_backward(MatrixView<T> dlogits, MatrixView<const T> logits, std::span<const T> lse,
                            std::span<const token_t> targets, T dloss, token_t ignore_index = -1) {
  checks::cross_entropy_backward_shapes<T>(dlogits, logits, lse, targets);
  const index_t count = detail::count_targets<T>("cross_entropy_backward", targets, logits.cols, ignore_index);
  const T s = count > 0 ? dloss / T(count) : T(0);
  const index_t V = logits.cols;
#pragma omp parallel for schedule(static) if (logits.rows * V > (1 << 15))
  for (index_t i = 0; i < logits.rows; ++i) {
    auto out = map_vec(std::span<T>(dlogits.row(i), static_cast<std::size_t>(V))).array();
    if (targets[i] == ignore_index) {
      out.setZero();
      continue;
    }
    const auto in = map_vec(std::span<const T>(logits.row(i), static_cast<std::size_t>(V))).array();
    out = s * (in - lse[i]).exp();
    dlogits(i, targets[i]) -= s;
  }
}

}  // namespace mom::cpu

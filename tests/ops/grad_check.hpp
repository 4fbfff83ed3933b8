#pragma once
// Shared helpers for the op tests: random data, central finite differences, error measures.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include <mom/core/tensor.hpp>

namespace mom::test {

struct Rng {
  std::mt19937_64 gen;
  explicit Rng(std::uint64_t seed) : gen(seed) {}
  double uniform(double lo = -1, double hi = 1) { return std::uniform_real_distribution<double>(lo, hi)(gen); }
  int integer(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(gen); }  // inclusive
};

template <class T = double>
std::vector<T> random_vec(std::size_t n, Rng& rng, double lo = -1, double hi = 1) {
  std::vector<T> v(n);
  for (auto& x : v) x = T(rng.uniform(lo, hi));
  return v;
}

template <class T>
MatrixView<T> mat(std::vector<T>& v, index_t rows, index_t cols) {
  return {v.data(), rows, cols};
}
template <class T>
MatrixView<const T> cmat(const std::vector<T>& v, index_t rows, index_t cols) {
  return {v.data(), rows, cols};
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// d loss / d p[i] by central differences, perturbing p[i] in place (restored afterwards).
inline double central_difference(std::vector<double>& p, std::size_t i, const std::function<double()>& loss,
                                 double h = 1e-5) {
  const double saved = p[i];
  p[i] = saved + h;
  const double up = loss();
  p[i] = saved - h;
  const double down = loss();
  p[i] = saved;
  return (up - down) / (2 * h);
}
// d loss / d p, every entry.
inline std::vector<double> numeric_grad(std::vector<double>& p, const std::function<double()>& loss, double h = 1e-5) {
  std::vector<double> g(p.size());
  for (std::size_t i = 0; i < p.size(); ++i) g[i] = central_difference(p, i, loss, h);
  return g;
}
// d loss / d p on the entries idx only (a sample of a large input).
inline std::vector<double> numeric_grad_at(std::vector<double>& p, const std::vector<std::size_t>& idx,
                                           const std::function<double()>& loss, double h = 1e-5) {
  std::vector<double> g;
  for (const std::size_t i : idx) g.push_back(central_difference(p, i, loss, h));
  return g;
}

// max |a - b| / max |b|: the error of a relative to the scale of the reference b.
template <class A, class B>
double rel_error(const std::vector<A>& a, const std::vector<B>& b) {
  double num = 0, den = 1e-300;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::abs(double(a[i]) - double(b[i])));
    den = std::max(den, std::abs(double(b[i])));
  }
  return num / den;
}

// Tolerances: finite differences in double, and float ops against a double-accumulated loop.
inline constexpr double fd_tol = 1e-6;
inline constexpr double float_tol = 2e-5;

}  // namespace mom::test

#pragma once
// Elementwise ops over flat buffers: GELU (tanh approximation, as GPT-2), ReLU, add, scale, axpy.
// Each runs over fixed-size chunks so OpenMP can split long buffers; a chunk is an Eigen array
// expression (vectorised tanh / max), or for float GELU the run-time dispatched kernels of vecmath.hpp.
#include <algorithm>
#include <cmath>
#include <numbers>
#include <span>
#include <type_traits>

#include "mom/backend/cpu/eigen_map.hpp"
#include "mom/backend/cpu/vecmath.hpp"
#include "mom/backend/shape_checks.hpp"
#include "mom/core/check.hpp"
#include "mom/core/tensor.hpp"

namespace mom::cpu {

namespace detail {
inline constexpr index_t elementwise_chunk = 8192;
inline constexpr index_t elementwise_parallel_min = 1 << 16;

// f(offset, length) over [0, n) in chunks, in parallel for long buffers.
template <class F>
void for_chunks(index_t n, F&& f) {
  const index_t nchunks = (n + elementwise_chunk - 1) / elementwise_chunk;
#pragma omp parallel for schedule(static) if (n > elementwise_parallel_min)
  for (index_t ci = 0; ci < nchunks; ++ci) {
    const index_t o = ci * elementwise_chunk;
    f(o, std::min(elementwise_chunk, n - o));
  }
}

template <class T>
auto chunk(std::span<T> s, index_t o, index_t len) {
  return map_vec(s.subspan(static_cast<std::size_t>(o), static_cast<std::size_t>(len))).array();
}

template <class T>
constexpr T gelu_k = T(0.7978845608028654);  // sqrt(2 / pi)
template <class T>
constexpr T gelu_c = T(0.044715);
}  // namespace detail

// out = 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))). Writes out (may alias x).
template <class T>
void gelu_forward(std::span<T> out, std::span<const T> x) {
  checks::activation_forward_shapes<T>("gelu_forward", out, x);
  constexpr T k = detail::gelu_k<T>, c = detail::gelu_c<T>;
  detail::for_chunks(ssize(x), [&](index_t o, index_t len) {
    if constexpr (std::is_same_v<T, float>) {
      detail::vecmath::gelu_forward(out.data() + o, x.data() + o, len);
    } else {
      const auto xv = detail::chunk(x, o, len);
      detail::chunk(out, o, len) = T(0.5) * xv * (T(1) + (k * (xv + c * xv.cube())).tanh());
    }
  });
}

// dx += dout · gelu'(x),  gelu'(x) = 0.5(1 + t) + 0.5·x·(1 - t²)·√(2/π)·(1 + 3·0.044715·x²), t = tanh(...)
// (Store::overwrite: dx = dout · gelu'(x)).
template <class T>
void gelu_backward(std::span<T> dx, std::span<const T> x, std::span<const T> dout, Store st = Store::add) {
  checks::activation_backward_shapes<T>("gelu_backward", dx, x, dout);
  constexpr T k = detail::gelu_k<T>, c = detail::gelu_c<T>;
  detail::for_chunks(ssize(x), [&](index_t o, index_t len) {
    if constexpr (std::is_same_v<T, float>) {
      detail::vecmath::gelu_backward(dx.data() + o, x.data() + o, dout.data() + o, len, st == Store::add);
    } else {
      const auto xv = detail::chunk(x, o, len);
      const auto t = (k * (xv + c * xv.cube())).tanh();
      const auto dgelu = T(0.5) * (T(1) + t) + T(0.5) * xv * (T(1) - t.square()) * k * (T(1) + T(3) * c * xv.square());
      if (st == Store::add) detail::chunk(dx, o, len) += detail::chunk(dout, o, len) * dgelu;
      else detail::chunk(dx, o, len) = detail::chunk(dout, o, len) * dgelu;
    }
  });
}

// out = max(x, 0). Writes out (may alias x).
template <class T>
void relu_forward(std::span<T> out, std::span<const T> x) {
  checks::activation_forward_shapes<T>("relu_forward", out, x);
  detail::for_chunks(ssize(x), [&](index_t o, index_t len) {
    detail::chunk(out, o, len) = detail::chunk(x, o, len).max(T(0));
  });
}

// dx += dout where x > 0 (the subgradient at 0 is taken as 0); Store::overwrite: dx = that.
template <class T>
void relu_backward(std::span<T> dx, std::span<const T> x, std::span<const T> dout, Store st = Store::add) {
  checks::activation_backward_shapes<T>("relu_backward", dx, x, dout);
  detail::for_chunks(ssize(x), [&](index_t o, index_t len) {
    const auto g = (detail::chunk(x, o, len) > T(0)).select(detail::chunk(dout, o, len), T(0));
    if (st == Store::add) detail::chunk(dx, o, len) += g;
    else detail::chunk(dx, o, len) = g;
  });
}

// out = a + b (residual connection). Writes out (may alias a or b). Its backward is two accumulates.
template <class T>
void add_forward(std::span<T> out, std::span<const T> a, std::span<const T> b) {
  checks::add_forward_shapes<T>(out, a, b);
  detail::for_chunks(ssize(out), [&](index_t o, index_t len) {
    detail::chunk(out, o, len) = detail::chunk(a, o, len) + detail::chunk(b, o, len);
  });
}

// y += alpha · x.
template <class T>
void axpy(std::span<T> y, T alpha, std::span<const T> x) {
  checks::axpy_shapes<T>(y, x);
  detail::for_chunks(ssize(y), [&](index_t o, index_t len) {
    detail::chunk(y, o, len) += alpha * detail::chunk(x, o, len);
  });
}

// y *= alpha.
template <class T>
void scale(std::span<T> y, T alpha) {
  detail::for_chunks(ssize(y), [&](index_t o, index_t len) { detail::chunk(y, o, len) *= alpha; });
}

}  // namespace mom::cpu

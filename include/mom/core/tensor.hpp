#pragma once
// Backend-neutral views over raw buffers. Ops take these (never Eigen types), so the
// same module code calls the CPU (Eigen) and the CUDA backend. A view does not own.
#include <cstdint>
#include <ostream>
#include <span>
#include <type_traits>

namespace mom {

using index_t = std::int64_t;
using token_t = std::int32_t;  // token ids and row indices

// Row-major matrix view: element (r, c) is data[r * ld + c]. ld == cols for the
// dense case; ld > cols views a column block of a wider matrix.
template <class T>
struct MatrixView {
  T* data = nullptr;
  index_t rows = 0;
  index_t cols = 0;
  index_t ld = 0;

  constexpr MatrixView() = default;
  constexpr MatrixView(T* p, index_t r, index_t c) : data(p), rows(r), cols(c), ld(c) {}
  constexpr MatrixView(T* p, index_t r, index_t c, index_t stride) : data(p), rows(r), cols(c), ld(stride) {}
  // MatrixView<T> converts to MatrixView<const T>.
  template <class U>
    requires(std::is_same_v<const U, T> && !std::is_same_v<U, T>)
  constexpr MatrixView(const MatrixView<U>& o) : data(o.data), rows(o.rows), cols(o.cols), ld(o.ld) {}

  constexpr bool empty() const { return data == nullptr; }
  constexpr bool contiguous() const { return ld == cols; }
  constexpr index_t size() const { return rows * cols; }
  constexpr T& operator()(index_t r, index_t c) const { return data[r * ld + c]; }
  constexpr T* row(index_t r) const { return data + r * ld; }
  // Rows [r0, r0 + n).
  constexpr MatrixView row_block(index_t r0, index_t n) const { return {data + r0 * ld, n, cols, ld}; }
  // Columns [c0, c0 + n) of every row.
  constexpr MatrixView col_block(index_t c0, index_t n) const { return {data + c0, rows, n, ld}; }
  // The whole (contiguous) matrix as a flat span.
  std::span<T> flat() const { return {data, static_cast<std::size_t>(rows * cols)}; }
};

template <class T>
MatrixView(T*, index_t, index_t) -> MatrixView<T>;

template <class T>
constexpr MatrixView<const T> as_const(MatrixView<T> m) { return m; }

// How a backward op stores a gradient: add it to what the buffer holds (the default: gradients
// accumulate), or overwrite the buffer (a fresh one: no zeroing pass before the op). Ops that take it say
// which outputs it applies to.
enum class Store : bool { add, overwrite };

// What a product does to its result as it stores it (an optional op form: the CPU's gathered grouped linear).
// relu: max(v, 0) as std::max(v, 0) takes it (a NaN is kept), the bits of relu_forward on the stored product.
enum class Epilogue : bool { none, relu };

// Shapes print as [rows x cols] in error messages.
struct Shape {
  index_t rows, cols;
};
template <class T>
constexpr Shape shape(const MatrixView<T>& m) { return {m.rows, m.cols}; }
inline std::ostream& operator<<(std::ostream& os, Shape s) { return os << '[' << s.rows << 'x' << s.cols << ']'; }

template <class T>
constexpr index_t ssize(std::span<T> s) { return static_cast<index_t>(s.size()); }

}  // namespace mom

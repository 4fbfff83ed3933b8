#pragma once
// The only place where mom's views meet Eigen: map a MatrixView as an Eigen row-major
// matrix with an outer stride. Nothing outside backend/cpu includes this header.
#include <Eigen/Core>

#include "mom/core/tensor.hpp"

namespace mom::cpu {

template <class T>
using EigenRowMajor = Eigen::Matrix<std::remove_const_t<T>, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

template <class T>
using EigenMap = Eigen::Map<std::conditional_t<std::is_const_v<T>, const EigenRowMajor<T>, EigenRowMajor<T>>, Eigen::Unaligned,
                            Eigen::OuterStride<>>;

template <class T>
EigenMap<T> map(MatrixView<T> m) {
  return EigenMap<T>(m.data, m.rows, m.cols, Eigen::OuterStride<>(m.ld));
}

template <class T>
auto map_vec(std::span<T> v) {
  using V = Eigen::Matrix<std::remove_const_t<T>, Eigen::Dynamic, 1>;
  return Eigen::Map<std::conditional_t<std::is_const_v<T>, const V, V>>(v.data(), static_cast<index_t>(v.size()));
}

}  // namespace mom::cpu

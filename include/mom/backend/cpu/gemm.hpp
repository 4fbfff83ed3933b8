#pragma once
// General matrix multiply on row-major views: C = alpha * op(A) * op(B) + beta * C.
// Every linear map in the library goes through here, so this is where CPU speed lives.
#include "mom/backend/cpu/eigen_map.hpp"
#include "mom/core/check.hpp"
#include "mom/core/tensor.hpp"

namespace mom::cpu {

enum class Trans : bool { N = false, T = true };

namespace detail {
template <class T>
void gemm_eigen(MatrixView<T> C, MatrixView<const T> A, Trans ta, MatrixView<const T> B, Trans tb, T alpha, T beta) {
  auto c = map(C);
  if (beta == T(0)) c.setZero();
  else if (beta != T(1)) c *= beta;
  auto a = map(A);
  auto b = map(B);
  if (ta == Trans::N && tb == Trans::N) c.noalias() += alpha * a * b;
  else if (ta == Trans::N && tb == Trans::T) c.noalias() += alpha * a * b.transpose();
  else if (ta == Trans::T && tb == Trans::N) c.noalias() += alpha * a.transpose() * b;
  else c.noalias() += alpha * a.transpose() * b.transpose();
}
}  // namespace detail

template <class T>
void gemm(MatrixView<T> C, MatrixView<const T> A, Trans ta, MatrixView<const T> B, Trans tb, T alpha = T(1),
          T beta = T(0)) {
  const index_t m = ta == Trans::N ? A.rows : A.cols;
  const index_t k = ta == Trans::N ? A.cols : A.rows;
  const index_t kb = tb == Trans::N ? B.rows : B.cols;
  const index_t n = tb == Trans::N ? B.cols : B.rows;
  MOM_CHECK(k == kb && C.rows == m && C.cols == n, "gemm: C ", shape(C), " = op(A) ", shape(A), (ta == Trans::T ? "^T" : ""),
            " * op(B) ", shape(B), (tb == Trans::T ? "^T" : ""), ": shapes do not agree");
  if (m == 0 || n == 0) return;
  detail::gemm_eigen(C, A, ta, B, tb, alpha, beta);
}

}  // namespace mom::cpu

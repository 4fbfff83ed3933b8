#pragma once
// General matrix multiply on row-major views: C = alpha * op(A) * op(B) + beta * C.
// Every linear map in the library goes through here, so this is where CPU speed lives.
//
// float: mom's own packed AVX-512 (or AVX2) kernel, gemm_native.hpp, threaded with
//        OpenMP over all cores, chosen at run time from the CPU whatever the compile flags
//        (gemm_kernel() says which). Define MOM_GEMM_EIGEN (CMake MOM_GEMM=EIGEN or BLAS) to
//        use Eigen's product instead (and, with EIGEN_USE_BLAS, the BLAS it forwards to).
// double, or a CPU with neither AVX-512 nor AVX2+FMA: Eigen's product.
#include <span>
#include <string_view>

#include "mom/backend/cpu/activation.hpp"
#include "mom/backend/cpu/eigen_map.hpp"
#include "mom/backend/cpu/parallel.hpp"
#include "mom/backend/shape_checks.hpp"
#include "mom/core/check.hpp"
#include "mom/core/tensor.hpp"

#if !defined(MOM_GEMM_EIGEN)
#include "mom/backend/cpu/gemm_native.hpp"
#endif

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

template <class T>
void gemm_check(MatrixView<T> C, MatrixView<const T> A, Trans ta, MatrixView<const T> B, Trans tb) {
  checks::gemm_shapes<T>(C, A, ta == Trans::T, B, tb == Trans::T);
}

#if defined(MOM_HAVE_NATIVE_GEMM)
// The views as the native kernel's problem: op(X)(i, j) = data[i*rs + j*cs].
inline native::Problem native_problem(MatrixView<float> C, MatrixView<const float> A, Trans ta, MatrixView<const float> B,
                                      Trans tb, float alpha, float beta) {
  const index_t m = C.rows, n = C.cols;
  const index_t k = ta == Trans::N ? A.cols : A.rows;
  const native::Operand a = ta == Trans::N ? native::Operand{A.data, A.ld, 1} : native::Operand{A.data, 1, A.ld};
  const native::Operand b = tb == Trans::N ? native::Operand{B.data, B.ld, 1} : native::Operand{B.data, 1, B.ld};
  return {m, n, k, a, b, C.data, C.ld, alpha, beta};
}
#endif
}  // namespace detail

// C = alpha * op(A) * op(B) + beta * C, using every OpenMP thread for large products
// (a call from inside a parallel region runs on the calling thread only).
template <class T>
void gemm(MatrixView<T> C, MatrixView<const T> A, Trans ta, MatrixView<const T> B, Trans tb, T alpha = T(1),
          T beta = T(0)) {
  detail::gemm_check(C, A, ta, B, tb);
  if (C.rows == 0 || C.cols == 0) return;
#if defined(MOM_HAVE_NATIVE_GEMM)
  if constexpr (std::is_same_v<T, float>) {
    if (detail::native::gemm_parallel(detail::native_problem(C, A, ta, B, tb, alpha, beta))) return;
  }
#endif
  detail::gemm_eigen(C, A, ta, B, tb, alpha, beta);
}

// Same product on the calling thread only, with that thread's own packing buffers:
// meant for calls from inside an OpenMP parallel region, e.g. attention running one
// small gemm per (sequence, head) on each thread. (The Eigen path, used for double,
// is single-threaded inside a parallel region as well.)
template <class T>
void gemm_serial(MatrixView<T> C, MatrixView<const T> A, Trans ta, MatrixView<const T> B, Trans tb, T alpha = T(1),
                 T beta = T(0)) {
  detail::gemm_check(C, A, ta, B, tb);
  if (C.rows == 0 || C.cols == 0) return;
#if defined(MOM_HAVE_NATIVE_GEMM)
  if constexpr (std::is_same_v<T, float>) {
    if (detail::native::gemm_serial(detail::native_problem(C, A, ta, B, tb, alpha, beta))) return;
  }
#endif
  detail::gemm_eigen(C, A, ta, B, tb, alpha, beta);
}

namespace detail {
// Every index of `rows` within table's rows (the gathered operand's own check: callers may check earlier with
// their own names, as the grouped linear does).
template <class T>
void check_gathered_rows(const char* what, std::span<const token_t> rows, MatrixView<const T> table) {
  for (std::size_t i = 0; i < rows.size(); ++i)
    MOM_CHECK(rows[i] >= 0 && rows[i] < table.rows, "gemm_gathered: ", what, " row index ", i, " = ", rows[i],
              " is out of range [0, ", table.rows, ")");
}
// The gathered rows (each times scale[i], if given) copied into this thread's scratch (the Eigen path, e.g.
// double).
template <class T, int Slot>
MatrixView<const T> gathered_copy(std::span<const token_t> rows, MatrixView<const T> table, std::span<const T> scale = {}) {
  T* buf = thread_scratch<T, MatrixView<const T>, Slot>(rows.size() * std::size_t(table.cols));
  for (std::size_t i = 0; i < rows.size(); ++i) {
    T* dst = buf + i * std::size_t(table.cols);
    if (scale.empty()) std::copy_n(table.row(rows[i]), table.cols, dst);
    else
      for (index_t c = 0; c < table.cols; ++c) dst[c] = table.row(rows[i])[c] * scale[i];
  }
  return {buf, index_t(rows.size()), table.cols};
}
}  // namespace detail

// C = alpha·op(A)·op(B) + beta·C with A's and B's memory rows read through index lists, the gather fused into
// the packing (no gathered copy): with a_rows given, A is the matrix whose row i is A's row a_rows[i] (op(A)'s
// row i for ta = N, its column i for ta = T), each times a_scale[i] if a_scale is given; with b_rows given
// (tb = N), op(B)'s row k is B's row b_rows[k]. Empty lists: A or B itself. The routed modules' experts read
// their tokens' rows this way (grouped_linear_forward / _backward with a row list), and W₂'s backward reads
// dL/dy = weight · dout[token] (a_scale) instead of a written copy. Threads as gemm. ep = Epilogue::relu: then
// C = max(C, 0) (core/tensor.hpp), on each tile as it is stored (the native kernels) or in one pass after.
template <class T>
void gemm_gathered(MatrixView<T> C, MatrixView<const T> A, Trans ta, std::span<const token_t> a_rows,
                   std::span<const T> a_scale, MatrixView<const T> B, Trans tb, std::span<const token_t> b_rows,
                   T alpha = T(1), T beta = T(0), Epilogue ep = Epilogue::none) {
  MOM_CHECK(b_rows.empty() || tb == Trans::N, "gemm_gathered: a row list of B indexes an untransposed B's rows");
  MOM_CHECK(a_scale.empty() || a_scale.size() == a_rows.size(), "gemm_gathered: ", a_scale.size(), " scales for ",
            a_rows.size(), " rows of A");
  detail::check_gathered_rows("A", a_rows, A);
  detail::check_gathered_rows("B", b_rows, B);
  const MatrixView<const T> Av = a_rows.empty() ? A : MatrixView<const T>{A.data, ssize(a_rows), A.cols, A.ld};
  const MatrixView<const T> Bv = b_rows.empty() ? B : MatrixView<const T>{B.data, ssize(b_rows), B.cols, B.ld};
  detail::gemm_check(C, Av, ta, Bv, tb);
  if (C.rows == 0 || C.cols == 0) return;
#if defined(MOM_HAVE_NATIVE_GEMM)
  if constexpr (std::is_same_v<T, float>) {
    auto p = detail::native_problem(C, Av, ta, Bv, tb, alpha, beta);
    p.a.rows = a_rows.empty() ? nullptr : a_rows.data();
    p.a.scale = a_scale.empty() ? nullptr : a_scale.data();
    p.a.transposed = ta == Trans::T;
    p.b.rows = b_rows.empty() ? nullptr : b_rows.data();
    p.relu = ep == Epilogue::relu;
    if (detail::native::gemm_parallel(p)) return;
  }
#endif
  detail::gemm_eigen(C, a_rows.empty() ? A : detail::gathered_copy<T, 0>(a_rows, A, a_scale), ta,
                     b_rows.empty() ? B : detail::gathered_copy<T, 1>(b_rows, B), tb, alpha, beta);
  if (ep == Epilogue::relu)  // relu_forward itself, row by row (C may be a column block)
    for (index_t r = 0; r < C.rows; ++r) {
      const std::span<T> row(C.row(r), std::size_t(C.cols));
      relu_forward<T>(row, std::span<const T>(row));
    }
}
template <class T>
void gemm_gathered(MatrixView<T> C, MatrixView<const T> A, Trans ta, std::span<const token_t> a_rows,
                   MatrixView<const T> B, Trans tb, std::span<const token_t> b_rows, T alpha = T(1), T beta = T(0),
                   Epilogue ep = Epilogue::none) {
  gemm_gathered<T>(C, A, ta, a_rows, std::span<const T>{}, B, tb, b_rows, alpha, beta, ep);
}

// The float GEMM kernel this process runs: "avx512" or "avx2" (mom's own, picked at run time from
// the CPU), or "eigen" (MOM_GEMM_EIGEN, or a CPU with neither).
inline const char* gemm_kernel() {
#if defined(MOM_HAVE_NATIVE_GEMM)
  switch (detail::native::isa()) {
    case detail::native::Isa::avx512: return "avx512";
    case detail::native::Isa::avx2: return "avx2";
    default: break;
  }
#endif
  return "eigen";
}
// Use the named kernel ("avx512", "avx2", "eigen") from now on, if this CPU has it: for comparisons
// and tests (the default is the best the CPU has). Returns false, changing nothing, otherwise.
inline bool set_gemm_kernel(const char* name) {
#if defined(MOM_HAVE_NATIVE_GEMM)
  using detail::native::Isa;
  const std::string_view n(name);
  const Isa want = n == "avx512" ? Isa::avx512 : n == "avx2" ? Isa::avx2 : Isa::none;
  if (want == Isa::none && n != "eigen") return false;
  return detail::native::select(want);
#else
  return std::string_view(name) == "eigen";
#endif
}

}  // namespace mom::cpu

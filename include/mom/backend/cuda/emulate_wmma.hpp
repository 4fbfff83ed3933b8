#pragma once
// CPU emulation of the part of CUDA's warp matrix API (nvcuda::wmma, <mma.h>) that the wmma tensor-core paths use
// (the attention's wmma kernels: kernels/attention_tc.cuh, attention_packed_tc.cuh; the mma.sync kernels emulate
// their PTX in kernels/mma.cuh), plus a bf16 storage type: tests only, under MOM_CUDA_EMULATE (see emulate.hpp).
//
// Model: on a GPU a fragment is spread over the 32 lanes of a warp; here every thread holds the
// whole tile (x[] in logical row-major order), loads it whole, multiplies it whole and stores it
// whole. Every lane of a warp computes the same values from the same shared memory, so the stores
// agree. The numerics follow the hardware contract: matrix_a / matrix_b fragments hold their
// elements as floats (tf32 fragments as loaded, rounded only by __float_to_tf32 as on the GPU;
// bf16 fragments widened exactly), mma_sync accumulates in fp32. Fragment element order (x[i] of
// a lane) is NOT the hardware's: kernels may only apply element-wise functions to x[].
#if !defined(MOM_CUDA_EMULATE)
#error "mom/backend/cuda/emulate_wmma.hpp is only for builds with MOM_CUDA_EMULATE"
#endif

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace mom::cuda::dev {
// bf16 as its 16 bits (the top half of the fp32 pattern); the kernels convert with bf16_bits.
struct EmuBf16 {
  std::uint16_t bits;
  float to_float() const {
    const std::uint32_t u = std::uint32_t(bits) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }
};
}  // namespace mom::cuda::dev

namespace nvcuda::wmma {

struct matrix_a;
struct matrix_b;
struct accumulator;
struct row_major;
struct col_major;
namespace precision {
struct tf32;
}
enum layout_t { mem_row_major, mem_col_major };

// cvt.rna.tf32.f32: round to 10 mantissa bits, to nearest, ties away from zero (NaN, inf kept).
inline float __float_to_tf32(float in) {
  std::uint32_t u;
  std::memcpy(&u, &in, sizeof u);
  if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u;
  float out;
  std::memcpy(&out, &u, sizeof out);
  return out;
}

namespace detail {
template <class Use, int M, int N, int K>
struct shape;
template <int M, int N, int K>
struct shape<matrix_a, M, N, K> {
  static constexpr int rows = M, cols = K;
};
template <int M, int N, int K>
struct shape<matrix_b, M, N, K> {
  static constexpr int rows = K, cols = N;
};
template <int M, int N, int K>
struct shape<accumulator, M, N, K> {
  static constexpr int rows = M, cols = N;
};
inline float widen(float v) { return v; }
inline float widen(mom::cuda::dev::EmuBf16 v) { return v.to_float(); }
}  // namespace detail

template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
  static constexpr int rows = detail::shape<Use, M, N, K>::rows, cols = detail::shape<Use, M, N, K>::cols;
  static constexpr int num_elements = rows * cols;
  float x[num_elements];  // (r, c) at x[r * cols + c]
};

template <class Use, int M, int N, int K, class T, class Layout>
void fill_fragment(fragment<Use, M, N, K, T, Layout>& f, float v) {
  for (float& e : f.x) e = v;
}

// matrix_a / matrix_b from memory laid out as Layout (row_major: (r, c) at p[r·ldm + c]).
template <class Use, int M, int N, int K, class T, class Layout, class E>
void load_matrix_sync(fragment<Use, M, N, K, T, Layout>& f, const E* p, unsigned ldm) {
  using F = fragment<Use, M, N, K, T, Layout>;
  for (int r = 0; r < F::rows; ++r)
    for (int c = 0; c < F::cols; ++c)
      f.x[r * F::cols + c] =
          detail::widen(std::is_same_v<Layout, row_major> ? p[std::size_t(r) * ldm + c] : p[std::size_t(c) * ldm + r]);
}

// An accumulator from fp32 memory in either layout.
template <int M, int N, int K>
void load_matrix_sync(fragment<accumulator, M, N, K, float>& f, const float* p, unsigned ldm, layout_t layout) {
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j)
      f.x[i * N + j] = layout == mem_row_major ? p[std::size_t(i) * ldm + j] : p[std::size_t(j) * ldm + i];
}

template <int M, int N, int K, class TA, class LA, class TB, class LB>
void mma_sync(fragment<accumulator, M, N, K, float>& d, const fragment<matrix_a, M, N, K, TA, LA>& a,
              const fragment<matrix_b, M, N, K, TB, LB>& b, const fragment<accumulator, M, N, K, float>& c) {
  float out[M * N];
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      float s = c.x[i * N + j];
      for (int k = 0; k < K; ++k) s += a.x[i * K + k] * b.x[k * N + j];
      out[i * N + j] = s;
    }
  for (int e = 0; e < M * N; ++e) d.x[e] = out[e];
}

template <int M, int N, int K>
void store_matrix_sync(float* p, const fragment<accumulator, M, N, K, float>& f, unsigned ldm, layout_t layout) {
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j)
      (layout == mem_row_major ? p[std::size_t(i) * ldm + j] : p[std::size_t(j) * ldm + i]) = f.x[i * N + j];
}

}  // namespace nvcuda::wmma

#pragma once
// Vectorised float math of the element-wise hot loops (the attention softmax's exp, GELU forward and
// backward, the stick-breaking weights), chosen at run time like the GEMM (gemm_native.hpp): each
// instruction set's kernels are compiled under `#pragma GCC target` (vecmath_isa.hpp, included once per
// width), and the ISA the GEMM uses picks them, so a program built with plain -O2 runs them as wide as
// one built with -march=native.
// Eigen's exp / tanh are fixed to the including program's flags (SSE2 at plain -O2: measured 1.8x slower
// attention and 4x slower GELU in a training step, bench/RESULTS.md). The double versions stay on
// Eigen (gradient checks).
#include <cstdint>
#include <cstring>

#include "mom/backend/cpu/gemm_native.hpp"
#include "mom/core/tensor.hpp"

#if defined(MOM_HAVE_NATIVE_GEMM)
namespace mom::cpu::detail::vecmath::avx512 {
#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx2,fma")
#define MOM_VEC_BYTES 64
#include "mom/backend/cpu/vecmath_isa.hpp"
#undef MOM_VEC_BYTES
#pragma GCC pop_options
}  // namespace mom::cpu::detail::vecmath::avx512

namespace mom::cpu::detail::vecmath::avx2 {
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define MOM_VEC_BYTES 32
#include "mom/backend/cpu/vecmath_isa.hpp"
#undef MOM_VEC_BYTES
#pragma GCC pop_options
}  // namespace mom::cpu::detail::vecmath::avx2
#endif

namespace mom::cpu::detail::vecmath::baseline {
#define MOM_VEC_BYTES 16
#include "mom/backend/cpu/vecmath_isa.hpp"
#undef MOM_VEC_BYTES
}  // namespace mom::cpu::detail::vecmath::baseline

namespace mom::cpu::detail::vecmath {

#if defined(MOM_HAVE_NATIVE_GEMM)
#define MOM_VECMATH_DISPATCH(call)                        \
  switch (native::isa()) {                                \
    case native::Isa::avx512: return avx512::call;        \
    case native::Isa::avx2: return avx2::call;            \
    default: return baseline::call;                       \
  }
#else
#define MOM_VECMATH_DISPATCH(call) return baseline::call;
#endif

// s[i] = exp(s[i]·scale - shift) for i < n; returns their sum.
inline float exp_affine(float* s, index_t n, float scale, float shift) {
  MOM_VECMATH_DISPATCH(exp_affine(s, n, scale, shift))
}
// out[i] = gelu(x[i]) (tanh approximation); out may alias x.
inline void gelu_forward(float* out, const float* x, index_t n) { MOM_VECMATH_DISPATCH(gelu_forward(out, x, n)) }
// dx[i] += dout[i] · gelu'(x[i]) (add), or dx[i] = dout[i] · gelu'(x[i]).
inline void gelu_backward(float* dx, const float* x, const float* dout, index_t n, bool add = true) {
  MOM_VECMATH_DISPATCH(gelu_backward(dx, x, dout, n, add))
}
// Stick-breaking weights and their backward over 16 key-major columns (vecmath_isa.hpp; cpu/stick_breaking.hpp).
inline constexpr int kStickBreakingLanes = 16;
inline index_t stick_breaking_lanes(float* zt, float* sig, index_t ld, const std::int32_t* top, index_t jmax,
                                    double cutoff) {
  MOM_VECMATH_DISPATCH(stick_breaking_lanes(zt, sig, ld, top, jmax, cutoff))
}
inline void stick_breaking_lanes_backward(float* gt, const float* pt, const float* sig, index_t ld,
                                          const std::int32_t* top, index_t lo, index_t jmax, double scale) {
  MOM_VECMATH_DISPATCH(stick_breaking_lanes_backward(gt, pt, sig, ld, top, lo, jmax, scale))
}
#undef MOM_VECMATH_DISPATCH

}  // namespace mom::cpu::detail::vecmath

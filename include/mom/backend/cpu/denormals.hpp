#pragma once
// Denormal ("subnormal") floats, |x| < 2^-126 in float, cost a microcode assist of the order of 100 cycles
// per vector instruction on x86 cores when an operand or a result is one, where a normal operation costs
// one. Stick-breaking attention makes them by construction: its weights p_{i,t} = σ(z_{i,t})·Π(1 − β) fall
// geometrically with the distance to the query (about e^-0.69 per key near initialisation), so beyond
// ~126 keys they pass through the denormal range before reaching 0, and its backward multiplies them by
// gradients of ~1e-5. Measured at moduleformer8's shape (seq 256; bench/RESULTS.md, "Issue 29 item 2,
// continued"): its backward ran 70-82 ms per layer inside the model step; the op alone at the model's scales
// 63.6 ms with denormals, 12.6 ms with them flushed.
//
// FlushDenormals sets the calling thread's MXCSR to flush denormal results to zero (FTZ) and to read
// denormal operands as zero (DAZ) for its scope, and restores the previous state when it ends: what
// TensorFlow does on the CPU by default, and what GPUs' fast paths do. Effect on the numbers: a value or a
// product below 2^-126 in magnitude becomes 0, i.e. a change below the last bit of every sum that holds
// a normal term. Only kernels that make denormals by construction use it, each from the thread that runs
// its products (inside its own parallel region, calling gemm_serial), so the result does not depend on
// how many threads ran it. Elsewhere (non-x86 targets) it does nothing.
#if defined(__x86_64__) || defined(_M_X64) || defined(__SSE2__)
#include <xmmintrin.h>
#define MOM_HAVE_MXCSR 1
#endif

namespace mom::cpu {

class FlushDenormals {
 public:
#if defined(MOM_HAVE_MXCSR)
  FlushDenormals() noexcept : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | kFtzDaz); }
  ~FlushDenormals() { _mm_setcsr(saved_); }
#else
  FlushDenormals() noexcept = default;
#endif
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;

 private:
#if defined(MOM_HAVE_MXCSR)
  static constexpr unsigned kFtzDaz = 0x8040u;  // MXCSR bit 15: flush to zero; bit 6: denormals are zero
  unsigned saved_;
#endif
};

}  // namespace mom::cpu

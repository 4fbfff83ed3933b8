// One vector width's float math kernels (vecmath.hpp has the dispatch). No include guard: vecmath.hpp
// includes this file once per instruction set, inside namespace vecmath::<isa> with MOM_VEC_BYTES set
// (64 = AVX-512, 32 = AVX2 + FMA, 16 = the baseline every x86-64 has), the first two under
// `#pragma GCC target`, so the kernels are as wide as the CPU whatever flags the program uses.
//
// Written with GCC's vector extensions: the same source, and the same polynomial, for every width, so
// the dispatch changes the speed and (up to FMA contraction) not the numbers.
#if !defined(MOM_VEC_BYTES)
#error "vecmath_isa.hpp is included by vecmath.hpp only"
#endif

inline constexpr int W = MOM_VEC_BYTES / 4;  // floats per vector
typedef float vf __attribute__((vector_size(MOM_VEC_BYTES), aligned(4)));
typedef std::int32_t vi __attribute__((vector_size(MOM_VEC_BYTES), aligned(4)));

inline vf splat(float x) { return vf{} + x; }
inline vf load(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, vf v) { std::memcpy(p, &v, sizeof v); }
// x limited to [lo, hi]; a NaN stays NaN (both comparisons are false), so a diverged value still shows.
inline vf clamp(vf x, float lo, float hi) {
  x = x < splat(lo) ? splat(lo) : x;
  return x > splat(hi) ? splat(hi) : x;
}

// exp(x), Cephes' expf (the scheme of Eigen's pexp and of ggml): x = n·ln2 + r, |r| <= ln2/2, exp(r) by
// a degree-6 polynomial (relative error ~1 ulp), 2^n built in the exponent bits. x is clamped to
// [-87.34, 88] (exp gives ~1.2e-38 .. ~1.7e38: no inf or denormal from a large |x|; mom's callers pass
// x <= 0 (softmax) or only need the saturation (tanh)); NaN stays NaN.
inline vf exp(vf x) {
  x = clamp(x, -87.3365448f, 88.0f);  // n in [-126, 127]: 2^n a normal float
  const vf magic = splat(12582912.0f);  // 1.5·2^23: (t + magic) - magic rounds t to the nearest integer
  const vf n = (x * splat(1.44269504088896341f) + magic) - magic;
  vf r = x - n * splat(0.693359375f);  // ln2 in two parts, so n·ln2 is exact in the first
  r = r - n * splat(-2.12194440e-4f);
  vf p = splat(1.9875691500e-4f);
  p = p * r + splat(1.3981999507e-3f);
  p = p * r + splat(8.3334519073e-3f);
  p = p * r + splat(4.1665795894e-2f);
  p = p * r + splat(1.6666665459e-1f);
  p = p * r + splat(5.0000001201e-1f);
  p = p * (r * r) + r + splat(1.0f);
  const vi e = (__builtin_convertvector(n, vi) + 127) << 23;  // 2^n
  vf scale;
  std::memcpy(&scale, &e, sizeof scale);
  return p * scale;
}

// GELU (tanh approximation, GPT-2's): 0.5·x·(1 + tanh(u)), u = √(2/π)·(x + 0.044715·x³). With
// 1 + tanh(u) = 2σ(2u) it is x·σ(2u), computed as x / (1 + e), e = exp(-2u): no cancellation where
// tanh(u) is near -1, so the result has a small relative error for every x. The derivative
//   gelu'(x) = 0.5(1 + t) + 0.5·x·(1 - t²)·u'(x),  u' = √(2/π)(1 + 3·0.044715·x²),  t = tanh(u)
// is, with s = σ(2u) (1 + t = 2s, 1 - t² = 4s(1 - s), 1 - s = e·s):  s + 2·x·(e·s)·s·u'(x).
inline constexpr float gelu_k = 0.7978845608028654f;  // sqrt(2 / pi)
inline constexpr float gelu_c = 0.044715f;
inline vf gelu(vf x) {
  const vf u = splat(gelu_k) * (x + splat(gelu_c) * x * x * x);
  return x / (splat(1.0f) + exp(splat(-2.0f) * u));
}
inline vf gelu_grad(vf x) {
  const vf x2 = x * x;
  const vf u = splat(gelu_k) * (x + splat(gelu_c) * x2 * x);
  const vf e = exp(splat(-2.0f) * u);
  const vf s = splat(1.0f) / (splat(1.0f) + e);
  return s + splat(2.0f) * x * (e * s) * s * splat(gelu_k) * (splat(1.0f) + splat(3.0f * gelu_c) * x2);
}

// s[i] = exp(s[i]·scale - shift); returns Σ s[i] (summed per lane, then the lanes in order).
inline float exp_affine(float* s, index_t n, float scale, float shift) {
  const vf a = splat(scale), b = splat(shift);
  vf acc{};
  index_t i = 0;
  for (; i + W <= n; i += W) {
    const vf e = exp(load(s + i) * a - b);
    store(s + i, e);
    acc += e;
  }
  if (i < n) {
    float buf[W] = {};
    std::memcpy(buf, s + i, std::size_t(n - i) * sizeof(float));
    const vf e = exp(load(buf) * a - b);
    store(buf, e);
    std::memcpy(s + i, buf, std::size_t(n - i) * sizeof(float));
    for (index_t j = 0; j < n - i; ++j) acc[j] += buf[j];
  }
  float sum = 0;
  for (int j = 0; j < W; ++j) sum += acc[j];
  return sum;
}

// Whole vectors, then the tail through one zero-padded vector: every element is computed by the same
// instructions wherever it sits.
inline void gelu_forward(float* out, const float* x, index_t n) {
  index_t i = 0;
  for (; i + W <= n; i += W) store(out + i, gelu(load(x + i)));
  if (i < n) {
    float buf[W] = {};
    std::memcpy(buf, x + i, std::size_t(n - i) * sizeof(float));
    store(buf, gelu(load(buf)));
    std::memcpy(out + i, buf, std::size_t(n - i) * sizeof(float));
  }
}

// dx += dout · gelu'(x)
inline void gelu_backward(float* dx, const float* x, const float* dout, index_t n, bool add) {
  index_t i = 0;
  if (add)
    for (; i + W <= n; i += W) store(dx + i, load(dx + i) + load(dout + i) * gelu_grad(load(x + i)));
  else
    for (; i + W <= n; i += W) store(dx + i, load(dout + i) * gelu_grad(load(x + i)));
  if (i < n) {  // the tail as in gelu_forward
    float xb[W] = {}, gb[W];
    std::memcpy(xb, x + i, std::size_t(n - i) * sizeof(float));
    store(gb, gelu_grad(load(xb)));
    for (index_t j = 0; j < n - i; ++j) dx[i + j] = (add ? dx[i + j] : 0.0f) + dout[i + j] * gb[j];
  }
}

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

// exp(x) with the underflow kept: 0 where exp(x) is below float's normal range (x < -87.34: a denormal, which
// FlushDenormals makes 0 anyway), exp(x) above. The stick-breaking weights need their zeros (exp clamps).
inline vf exp_or_zero(vf x) { return x < splat(-87.3365448f) ? splat(0.0f) : exp(x); }

// log(x) for positive normal finite x, Cephes' logf (the scheme of Eigen's plog): x = m·2^k with m in
// [√½, √2), log(m) by a degree-9 polynomial in m − 1 (relative error ~1 ulp), k·ln2 in two parts.
inline vf log_positive(vf x) {
  vi bits;
  std::memcpy(&bits, &x, sizeof bits);
  vi k = (bits >> 23) - 126;  // x = m·2^k, m in [0.5, 1)
  const vi mb = (bits & 0x007fffff) | 0x3f000000;
  vf m;
  std::memcpy(&m, &mb, sizeof m);
  const vi small = m < splat(0.707106781186547524f);  // -1 where m < √½: use 2m − 1, k − 1
  k += small;
  m = m - splat(1.0f) + (small ? m : splat(0.0f));
  const vf fk = __builtin_convertvector(k, vf), z = m * m;
  vf y = splat(7.0376836292e-2f);
  y = y * m - splat(1.1514610310e-1f);
  y = y * m + splat(1.1676998740e-1f);
  y = y * m - splat(1.2420140846e-1f);
  y = y * m + splat(1.4249322787e-1f);
  y = y * m - splat(1.6668057665e-1f);
  y = y * m + splat(2.0000714765e-1f);
  y = y * m - splat(2.4999993993e-1f);
  y = y * m + splat(3.3333331174e-1f);
  y = y * m * z + fk * splat(-2.12194440e-4f) - splat(0.5f) * z;
  return m + y + fk * splat(0.693359375f);
}

// log(1 + e) for e in [0, 1]: log(u)·e / (u − 1) with u = 1 + e rounded (Goldberg's correction of the rounding
// of u; a few ulp), e itself where u rounds to 1.
inline vf log1p_unit(vf e) {
  const vf u = splat(1.0f) + e, du = u - splat(1.0f);
  return du == splat(0.0f) ? e : log_positive(u) * (e / du);
}

// Stick-breaking weights of 16 columns, key-major (cpu/stick_breaking.hpp): column c of zt [keys × ld] holds the
// scaled scores z of one query against keys 0 .. top[c] (top[c] < 0: no query; the rows above a column's top
// are not read). Overwrites them with the weights p, key top[c] down to 0 (Σ softplus above each key summed in
// double, per column), and with every key above top[c] 0; sig (null: not wanted) the same with σ(z). Once every
// column's sum passes `cutoff` all weights below are 0: they are set so and the key where that happened returned
// (0 otherwise). jmax = the largest top.
inline constexpr int kLanes = 16;
typedef double vd __attribute__((vector_size(MOM_VEC_BYTES), aligned(8)));
typedef float vh __attribute__((vector_size(MOM_VEC_BYTES / 2), aligned(4)));
inline constexpr int kSub = kLanes / W;  // vectors per row of 16 columns
inline void to_double(vf x, vd& lo, vd& hi) {
  vh a, b;
  std::memcpy(&a, &x, sizeof a);
  std::memcpy(&b, reinterpret_cast<const char*>(&x) + sizeof a, sizeof b);
  lo = __builtin_convertvector(a, vd);
  hi = __builtin_convertvector(b, vd);
}
inline vf to_float(vd lo, vd hi) {
  const vh a = __builtin_convertvector(lo, vh), b = __builtin_convertvector(hi, vh);
  vf x;
  std::memcpy(&x, &a, sizeof a);
  std::memcpy(reinterpret_cast<char*>(&x) + sizeof a, &b, sizeof b);
  return x;
}
inline vi load_top(const std::int32_t* top) {
  vi v;
  std::memcpy(&v, top, sizeof v);
  return v;
}

inline index_t stick_breaking_lanes(float* zt, float* sig, index_t ld, const std::int32_t* top, index_t jmax,
                                    double cutoff) {
  vi tv[kSub];
  vd slo[kSub], shi[kSub];  // the suffix sums, per column (+inf for a column without a query: always spent)
  for (int s = 0; s < kSub; ++s) {
    tv[s] = load_top(top + s * W);
    for (int i = 0; i < W / 2; ++i) {
      slo[s][i] = tv[s][i] < 0 ? __builtin_inf() : 0.0;
      shi[s][i] = tv[s][i + W / 2] < 0 ? __builtin_inf() : 0.0;
    }
  }
  for (index_t j = jmax; j >= 0; --j) {
    for (int s = 0; s < kSub; ++s) {
      float* zp = zt + j * ld + s * W;
      const vf z = load(zp);
      const vi on = vi{} + std::int32_t(j) <= tv[s];
      const vf e = exp_or_zero(-(z < splat(0.0f) ? -z : z));  // exp(−|z|) ∈ [0, 1]
      const vf l = log1p_unit(e);
      const vf logsig = (z < splat(0.0f) ? z : splat(0.0f)) - l;  // log σ(z)
      const vf sp = (z > splat(0.0f) ? z : splat(0.0f)) + l;      // softplus(z) = −log(1 − σ(z))
      const vf p = exp_or_zero(logsig - to_float(slo[s], shi[s]));
      store(zp, on ? p : splat(0.0f));
      if (sig) store(sig + j * ld + s * W, on ? (z >= splat(0.0f) ? splat(1.0f) : e) / (splat(1.0f) + e) : splat(0.0f));
      vd a, b;
      to_double(on ? sp : splat(0.0f), a, b);
      slo[s] += a;
      shi[s] += b;
    }
    if (j % 8 == 0 && j > 0) {  // every column's stick spent: the weights below are 0 (exp_or_zero's 0 too)
      bool spent = true;
      for (int s = 0; s < kSub; ++s)
        for (int i = 0; i < W / 2; ++i) spent = spent && slo[s][i] > cutoff && shi[s][i] > cutoff;
      if (spent) {
        for (index_t i = 0; i < j; ++i) {
          std::memset(zt + i * ld, 0, sizeof(float) * kLanes);
          if (sig) std::memset(sig + i * ld, 0, sizeof(float) * kLanes);
        }
        return j;
      }
    }
  }
  return 0;
}

// The backward of stick_breaking_lanes' 16 columns: gt [keys × ld] holds g = δ·v_j of each column's query
// against key j and becomes scale·dL/dz_j = scale·(g_j p_j − σ_j Σ_{i<=j} g_i p_i) (the prefix in double, from
// key lo up; 0 below lo and above top), pt and sig stick_breaking_lanes' output.
inline void stick_breaking_lanes_backward(float* gt, const float* pt, const float* sig, index_t ld,
                                          const std::int32_t* top, index_t lo, index_t jmax, double scale) {
  for (index_t j = 0; j < lo; ++j) std::memset(gt + j * ld, 0, sizeof(float) * kLanes);
  vi tv[kSub];
  vd plo[kSub], phi[kSub];  // the prefix sums, per column
  for (int s = 0; s < kSub; ++s) tv[s] = load_top(top + s * W), plo[s] = phi[s] = vd{};
  const vd sc = vd{} + scale;
  for (index_t j = lo; j <= jmax; ++j)
    for (int s = 0; s < kSub; ++s) {
      const index_t at = j * ld + s * W;
      vd g0, g1, p0, p1, s0, s1;
      to_double(load(gt + at), g0, g1);
      to_double(load(pt + at), p0, p1);
      to_double(load(sig + at), s0, s1);
      const vd gp0 = g0 * p0, gp1 = g1 * p1;
      plo[s] += gp0;
      phi[s] += gp1;
      const vf dz = to_float(sc * (gp0 - s0 * plo[s]), sc * (gp1 - s1 * phi[s]));
      store(gt + at, vi{} + std::int32_t(j) <= tv[s] ? dz : splat(0.0f));
    }
}

// The tensor-core path of the dense causal attention (kernels/attention_tc.cuh): cuda::Backend<float> with
// Precision::TF32 or BF16 and head dim 64 or 128. Compared with double references computed here:
//   "rounded":   what the kernels compute, in double: Q, K, V, dO rounded to TF32 / bf16 (rounding
//                done independently of the kernels, with frexp and nearbyint / round), the online
//                softmax over the same 64-key tiles, and the probabilities P (and dS in the
//                backward) rounded before their products, as the kernels round them for wmma.
//   "unrounded": the exact attention of the fp32 inputs (what Precision::FP32 computes).
// The result must be close to the first and measurably away from the second (so the tensor-core
// path, with its rounding, is really the one that ran). Two norms, both relative to the
// reference's magnitude: the RMS error (tight: rounding flips do not move it) and the max error
// (looser: fp32 accumulation can flip the rounding of an isolated P or dS element that sits on a
// rounding boundary, which moves one output by up to one TF32 / bf16 unit of that element).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "cuda/cuda_test_support.hpp"

using namespace mom;
using namespace mom::test;

namespace {

// TF32 (cvt.rna: 11 significant bits, ties away from zero) and bf16 (8 significant bits, ties to
// even), both from frexp's mantissa.
double round_tf32(double x) {
  if (x == 0) return 0;
  int e = 0;
  const double f = std::frexp(x, &e);
  return std::ldexp(std::round(std::ldexp(f, 11)), e - 11);
}
double round_bf16(double x) {
  if (x == 0) return 0;
  int e = 0;
  const double f = std::frexp(x, &e);
  return std::ldexp(std::nearbyint(std::ldexp(f, 8)), e - 8);
}

struct AttnShape {
  index_t batch, seq, heads, hd;
  index_t pad = 0;  // qkv and dqkv rows are 3d + pad apart (pad 1: the kernels' unaligned, scalar staging)
};

// Reference attention in double. rnd rounds the operands and P / dS (identity: unrounded).
template <class Round>
struct Reference {
  AttnShape s;
  float scale;
  Round rnd;
  index_t d() const { return s.heads * s.hd; }
  index_t qld() const { return 3 * d() + s.pad; }
  double at(const std::vector<float>& m, index_t ld, index_t row, index_t col) const {
    return m[std::size_t(row * ld + col)];
  }

  // out [B·S × d], lse [B·heads·S] from qkv [B·S × 3d].
  void forward(std::vector<double>& out, std::vector<double>& lse, const std::vector<float>& qkv) const {
    const index_t d3 = qld(), S = s.seq, hd = s.hd;
    out.assign(std::size_t(s.batch * S * d()), 0.0);
    lse.assign(std::size_t(s.batch * s.heads * S), 0.0);
    std::vector<double> o(static_cast<std::size_t>(hd)), sc(static_cast<std::size_t>(S));
    for (index_t b = 0; b < s.batch; ++b)
      for (index_t h = 0; h < s.heads; ++h)
        for (index_t i = 0; i < S; ++i) {
          for (index_t j = 0; j <= i; ++j) {
            double dot = 0;
            for (index_t c = 0; c < hd; ++c)
              dot += rnd(at(qkv, d3, b * S + i, h * hd + c)) * rnd(at(qkv, d3, b * S + j, d() + h * hd + c));
            sc[std::size_t(j)] = dot * scale;
          }
          double m = -std::numeric_limits<double>::infinity(), l = 0;
          std::fill(o.begin(), o.end(), 0.0);
          for (index_t j0 = 0; j0 <= i; j0 += 64) {  // the kernels' key tiles
            const index_t j1 = std::min(i + 1, j0 + 64);
            double tmax = -std::numeric_limits<double>::infinity();
            for (index_t j = j0; j < j1; ++j) tmax = std::max(tmax, sc[std::size_t(j)]);
            const double mnew = std::max(m, tmax), corr = std::exp(m - mnew);
            l *= corr;
            for (auto& x : o) x *= corr;
            for (index_t j = j0; j < j1; ++j) {
              const double p = std::exp(sc[std::size_t(j)] - mnew);
              l += p;
              const double pr = rnd(p);
              for (index_t c = 0; c < hd; ++c) o[std::size_t(c)] += pr * rnd(at(qkv, d3, b * S + j, 2 * d() + h * hd + c));
            }
            m = mnew;
          }
          for (index_t c = 0; c < hd; ++c) out[std::size_t((b * S + i) * d() + h * hd + c)] = o[std::size_t(c)] / l;
          lse[std::size_t((b * s.heads + h) * S + i)] = m + std::log(l);
        }
  }

  // The increment of dqkv [B·S × 3d] (dense) given the forward's out and lse (the device's, as the op gets them).
  void backward(std::vector<double>& dqkv, const std::vector<float>& dout, const std::vector<float>& out,
                const std::vector<float>& lse, const std::vector<float>& qkv) const {
    const index_t d3 = 3 * d(), q3 = qld(), S = s.seq, hd = s.hd;
    dqkv.assign(std::size_t(s.batch * S * d3), 0.0);
    for (index_t b = 0; b < s.batch; ++b)
      for (index_t h = 0; h < s.heads; ++h)
        for (index_t i = 0; i < S; ++i) {
          double di = 0;
          for (index_t c = 0; c < hd; ++c) di += at(dout, d(), b * S + i, h * hd + c) * at(out, d(), b * S + i, h * hd + c);
          const double li = lse[std::size_t((b * s.heads + h) * S + i)];
          for (index_t j = 0; j <= i; ++j) {
            double dot = 0, dp = 0;
            for (index_t c = 0; c < hd; ++c) {
              dot += rnd(at(qkv, q3, b * S + i, h * hd + c)) * rnd(at(qkv, q3, b * S + j, d() + h * hd + c));
              dp += rnd(at(dout, d(), b * S + i, h * hd + c)) * rnd(at(qkv, q3, b * S + j, 2 * d() + h * hd + c));
            }
            const double p = std::exp(dot * scale - li), ds = p * (dp - di);
            const double pr = rnd(p), dsr = rnd(ds);
            for (index_t c = 0; c < hd; ++c) {
              const double qc = rnd(at(qkv, q3, b * S + i, h * hd + c)), kc = rnd(at(qkv, q3, b * S + j, d() + h * hd + c));
              dqkv[std::size_t((b * S + i) * d3 + h * hd + c)] += scale * dsr * kc;
              dqkv[std::size_t((b * S + j) * d3 + d() + h * hd + c)] += scale * dsr * qc;
              dqkv[std::size_t((b * S + j) * d3 + 2 * d() + h * hd + c)] += pr * rnd(at(dout, d(), b * S + i, h * hd + c));
            }
          }
        }
  }
};
template <class Round>
Reference(AttnShape, float, Round) -> Reference<Round>;

struct Errors {
  double max = 0, rms = 0;  // relative to max |want| and to the RMS of want
};
template <class G>
Errors errors(const G& got, const std::vector<double>& want) {
  double emax = 0, wmax = 0, e2 = 0, w2 = 0;
  for (std::size_t k = 0; k < want.size(); ++k) {
    const double e = double(got[k]) - want[k];
    emax = std::max(emax, std::abs(e));
    wmax = std::max(wmax, std::abs(want[k]));
    e2 += e * e;
    w2 += want[k] * want[k];
  }
  return {wmax > 0 ? emax / wmax : emax, w2 > 0 ? std::sqrt(e2 / w2) : std::sqrt(e2)};
}

// Restores the shared float backend's default precision however the test case ends.
struct PrecisionGuard {
  explicit PrecisionGuard(cuda::Precision p) { gpu<float>().set_precision(p); }
  ~PrecisionGuard() { gpu<float>().set_precision(cuda::Precision::TF32); }
};

}  // namespace

TEST_CASE("tensor-core attention (TF32, BF16): forward and backward match a reference with rounded operands",
          "[cuda][attention][tc]") {
  MOM_REQUIRE_GPU();
  // RMS and max error against the rounded reference, and the RMS floor against the unrounded one.
  // Measured in emulation over these shapes: TF32 RMS <= 2.7e-5, max <= 1.8e-4 (both from P
  // rounding flips in the short sequences; without flips ~1e-7), unrounded RMS >= 1.9e-4; BF16
  // RMS <= 1.4e-5, max <= 4.1e-5, unrounded RMS >= 1.4e-3. The max tolerances allow one flip of a
  // large P (one TF32 / bf16 unit: 2^-11 / 2^-8 relative to the output's scale, times 2).
  struct Case {
    cuda::Precision precision;
    double (*round)(double);
    double rms_tol, max_tol, floor;
    const char* name;
  };
  const Case cases[] = {
      {cuda::Precision::TF32, round_tf32, 6e-5, 1e-3, 1.2e-4, "TF32"},
      {cuda::Precision::BF16, round_bf16, 2e-4, 8e-3, 7e-4, "BF16"},
  };
  test::Rng rng(21);
  for (const Case& k : cases) {
    PrecisionGuard guard(k.precision);
    for (const AttnShape s : {AttnShape{2, 1, 3, 64}, AttnShape{2, 37, 3, 64}, AttnShape{2, 100, 2, 64},
                              AttnShape{2, 200, 2, 64}, AttnShape{2, 37, 2, 128}, AttnShape{2, 100, 2, 128},
                              AttnShape{1, 200, 1, 128}, AttnShape{2, 70, 2, 64, 1}}) {
      INFO(k.name << ": batch " << s.batch << " seq " << s.seq << " heads " << s.heads << " hd " << s.hd << " pad "
                  << s.pad);
      const index_t d = s.heads * s.hd, n = s.batch * s.seq, qld = 3 * d + s.pad;
      const float scale = 1.0f / std::sqrt(float(s.hd));
      auto qkv = rand_arr<float>(n * qld, rng, -2, 2), out = rand_arr<float>(n * d, rng);
      // dO padded like qkv: with pad > 0 its rows are not 16-byte aligned, so the backward stages dO and D through
      // its scalar fallback (tc_stage_dout), the aligned cases through the float4 path.
      const index_t dld = d + s.pad;
      auto lse = rand_arr<float>(s.batch * s.heads * s.seq, rng), dout = rand_arr<float>(n * dld, rng);
      std::vector<float> dout_c(std::size_t(n * d));  // dO without the padding, for the references
      for (index_t r = 0; r < n; ++r)
        for (index_t c = 0; c < d; ++c) dout_c[std::size_t(r * d + c)] = dout.h[std::size_t(r * dld + c)];
      auto dqkv = rand_arr<float>(n * qld, rng);
      const Reference rounded{s, scale, k.round};
      const Reference exact{s, scale, [](double x) { return x; }};

      gpu<float>().attention_forward(out.dm(n, d), lse.ds(), MatrixView<const float>(qkv.dm(n, 3 * d, qld)), s.batch,
                                     s.seq, s.heads);
      const std::vector<float> got_out = out.fetch(), got_lse = lse.fetch();
      std::vector<double> want_out, want_lse, exact_out, exact_lse;
      rounded.forward(want_out, want_lse, qkv.h);
      exact.forward(exact_out, exact_lse, qkv.h);
      const Errors fo = errors(got_out, want_out), fl = errors(got_lse, want_lse), fx = errors(got_out, exact_out);
      INFO("forward: out rms " << fo.rms << " max " << fo.max << "; lse max " << fl.max << "; unrounded rms " << fx.rms);
      CHECK(fo.rms <= k.rms_tol);
      CHECK(fo.max <= k.max_tol);
      CHECK(fl.max <= 1e-5);  // fp32 statistics: the rounding of P does not enter lse
      CHECK(fx.rms >= k.floor);

      const long launches_before = mom_emu_launches ? mom_emu_launches() : 0;
      gpu<float>().attention_backward(dqkv.dm(n, 3 * d, qld), MatrixView<const float>(dout.dm(n, d, dld)),
                                      MatrixView<const float>(out.dm(n, d)), std::span<const float>(lse.ds()),
                                      MatrixView<const float>(qkv.dm(n, 3 * d, qld)), s.batch, s.seq, s.heads);
      // One kernel (FlashAttention-2's backward with its atomic dQ), where dQ had a kernel of its own before.
      if (mom_emu_launches) CHECK(mom_emu_launches() - launches_before == 1);
      const std::vector<float> got_dqkv = dqkv.fetch();
      std::vector<double> inc(std::size_t(n * 3 * d));  // what the op added (it accumulates into random values)
      bool pad_untouched = true;
      for (index_t r = 0; r < n; ++r) {
        for (index_t c = 0; c < 3 * d; ++c)
          inc[std::size_t(r * 3 * d + c)] =
              double(got_dqkv[std::size_t(r * qld + c)]) - double(dqkv.initial[std::size_t(r * qld + c)]);
        for (index_t c = 3 * d; c < qld; ++c)
          pad_untouched = pad_untouched && got_dqkv[std::size_t(r * qld + c)] == dqkv.initial[std::size_t(r * qld + c)];
      }
      CHECK(pad_untouched);
      std::vector<double> want_d, exact_d;
      rounded.backward(want_d, dout_c, got_out, got_lse, qkv.h);
      exact.backward(exact_d, dout_c, got_out, got_lse, qkv.h);
      const Errors bo = errors(inc, want_d), bx = errors(inc, exact_d);
      INFO("backward: dqkv rms " << bo.rms << " max " << bo.max << "; unrounded rms " << bx.rms);
      CHECK(bo.rms <= k.rms_tol);
      CHECK(bo.max <= k.max_tol);
      CHECK(bx.rms >= k.floor);
      if (std::getenv("MOM_TC_ATTENTION_REPORT"))  // the measured errors, for setting the tolerances
        WARN(k.name << " seq " << s.seq << " hd " << s.hd << ": fwd rms " << fo.rms << " max " << fo.max << " lse "
                    << fl.max << " unrounded " << fx.rms << " | bwd rms " << bo.rms << " max " << bo.max
                    << " unrounded " << bx.rms);
    }
  }
}

TEST_CASE("tensor-core attention: Precision::FP32 and other head dims keep the exact SIMT kernels",
          "[cuda][attention][tc]") {
  MOM_REQUIRE_GPU();
  // No operand rounding anywhere: the exact attention to fp32 accuracy (the tensor-core path would
  // be ~3e-4 away, see the floors above).
  test::Rng rng(22);
  struct Run {
    cuda::Precision precision;
    AttnShape s;
  };
  for (const Run run : {Run{cuda::Precision::FP32, {2, 70, 2, 64}}, Run{cuda::Precision::FP32, {1, 40, 1, 128}},
                        Run{cuda::Precision::TF32, {2, 70, 2, 80}}, Run{cuda::Precision::BF16, {1, 40, 2, 32}}}) {
    const AttnShape s = run.s;
    INFO("precision " << int(run.precision) << " seq " << s.seq << " hd " << s.hd);
    PrecisionGuard guard(run.precision);
    const index_t d = s.heads * s.hd, n = s.batch * s.seq;
    auto qkv = rand_arr<float>(n * 3 * d, rng, -2, 2), out = rand_arr<float>(n * d, rng);
    auto lse = rand_arr<float>(s.batch * s.heads * s.seq, rng);
    gpu<float>().attention_forward(out.dm(n, d), lse.ds(), MatrixView<const float>(qkv.dm(n, 3 * d)), s.batch,
                                   s.seq, s.heads);
    std::vector<double> want_out, want_lse;
    Reference{s, 1.0f / std::sqrt(float(s.hd)), [](double x) { return x; }}.forward(want_out, want_lse, qkv.h);
    CHECK(errors(out.fetch(), want_out).max <= 1e-5);
  }
}

TEST_CASE("tensor-core packed attention: one group of every token is the dense kernel, bit for bit",
          "[cuda][attention][tc][grouped]") {
  MOM_REQUIRE_GPU();
  // The packed op (kernels/attention_packed_tc.cuh) with queries = keys = every token: each 64-row query tile is
  // a dense one (sequences of a multiple of 64), its key range the causal prefix, so every staged tile, masked
  // entry and product is the dense kernel's, which the case above checks against a rounded reference. A packed
  // kernel that misplaced a range, a tile or a mask would differ here; so would one that did not run (the SIMT
  // kernels are ~3e-4 away, see the floors above).
  test::Rng rng(24);
  for (const cuda::Precision precision : {cuda::Precision::TF32, cuda::Precision::BF16})
    for (const AttnShape s : {AttnShape{2, 128, 2, 64}, AttnShape{1, 192, 1, 128}}) {
      INFO("precision " << int(precision) << " batch " << s.batch << " seq " << s.seq << " hd " << s.hd);
      PrecisionGuard guard(precision);
      const index_t d = s.heads * s.hd, n = s.batch * s.seq;
      auto qkv = rand_arr<float>(n * 3 * d, rng, -2, 2), dout = rand_arr<float>(n * d, rng);
      auto out_d = rand_arr<float>(n * d, rng), out_p = rand_arr<float>(n * d, rng);
      auto lse_d = rand_arr<float>(n * s.heads, rng), lse_p = rand_arr<float>(n * s.heads, rng);
      auto dqkv_d = rand_arr<float>(n * 3 * d, rng);
      Arr<float> dqkv_p(dqkv_d.h);
      std::vector<token_t> all(static_cast<std::size_t>(n));
      std::iota(all.begin(), all.end(), token_t(0));
      auto tok = tok_arr<float>(all);
      const MatrixView<const float> qkv_v(qkv.dm(n, 3 * d));
      const MatrixView<const float> q = qkv_v.col_block(0, d), k = qkv_v.col_block(d, d), v = qkv_v.col_block(2 * d, d);
      gpu<float>().attention_forward(out_d.dm(n, d), lse_d.ds(), qkv_v, s.batch, s.seq, s.heads);
      gpu<float>().attention_packed_forward(out_p.dm(n, d), lse_p.ds(), q, k, v, tok.ds(), {}, s.seq, s.heads);
      const auto od = out_d.fetch(), op = out_p.fetch(), ld = lse_d.fetch(), lp = lse_p.fetch();
      std::size_t out_diff = 0, lse_diff = 0;
      for (std::size_t i = 0; i < od.size(); ++i) out_diff += od[i] != op[i];
      for (index_t t = 0; t < n; ++t)  // dense lse [(b·heads + h)·seq + i], packed [t·heads + h]
        for (index_t h = 0; h < s.heads; ++h)
          lse_diff += ld[std::size_t(((t / s.seq) * s.heads + h) * s.seq + t % s.seq)] != lp[std::size_t(t * s.heads + h)];
      CHECK(out_diff == 0);
      CHECK(lse_diff == 0);

      const MatrixView<float> dq_p = dqkv_p.dm(n, 3 * d);
      gpu<float>().attention_backward(dqkv_d.dm(n, 3 * d), MatrixView<const float>(dout.dm(n, d)),
                                      MatrixView<const float>(out_d.dm(n, d)), std::span<const float>(lse_d.ds()), qkv_v,
                                      s.batch, s.seq, s.heads);
      const long launches_before = mom_emu_launches ? mom_emu_launches() : 0;
      gpu<float>().attention_packed_backward(dq_p.col_block(0, d), dq_p.col_block(d, d), dq_p.col_block(2 * d, d),
                                             MatrixView<const float>(dout.dm(n, d)), MatrixView<const float>(out_p.dm(n, d)),
                                             std::span<const float>(lse_p.ds()), q, k, v, tok.ds(), {}, s.seq, s.heads);
      if (mom_emu_launches) CHECK(mom_emu_launches() - launches_before == 1);  // one kernel, dQ's atomics in it
      const auto gd = dqkv_d.fetch(), gp = dqkv_p.fetch();
      std::size_t grad_diff = 0, grad_changed = 0;
      for (std::size_t i = 0; i < gd.size(); ++i) {
        grad_diff += gd[i] != gp[i];
        grad_changed += gp[i] != dqkv_p.initial[i];
      }
      CHECK(grad_diff == 0);
      CHECK(grad_changed > gd.size() / 2);  // the backward ran (it accumulates into random values)
    }
}

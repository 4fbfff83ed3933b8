// SwitchHead attention (modules/switch_head.hpp; MoEUT arXiv 2405.16039 §2.2): the module against a naive
// loop over eqs. (5)-(9) (and eq. (4) on both selections) in double, peri and pre LayerNorm; its gradient,
// regularisers included, by central differences in a whole model with σ-MoE and layer grouping.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

#include "mom/modules/sigma_moe.hpp"
#include "mom/modules/switch_head.hpp"
#include "mom/models/moeut_models.hpp"
#include "mom/mom.hpp"
#include "models/random_tokens.hpp"
#include "models/decode_check.hpp"
#include "models/routed_gradient_check.hpp"
#include "ops/grad_check.hpp"
#include "ops/naive_selection.hpp"

using namespace mom;
namespace naive = mom::test::naive;

namespace {
constexpr Dims tiny{.d_model = 8, .heads = 2, .d_ff = 12, .vocab = 11, .context = 6};
constexpr int NA = 3, KA = 2;

std::vector<int> top(const double* z, int k) { return naive::top_k(z, NA, k); }
double regulariser(const std::vector<double>& logits, index_t B, index_t T) {
  return naive::sequence_neg_entropy(logits, B, T, NA);
}

template <class M>
// norm: 0 pre, 1 peri, 2 post (the module returns LN(x + y) − x; nothing normalised inside).
double naive_switch_head(const std::vector<double>& p, const std::vector<double>& x, index_t B, index_t T, int norm,
                         double delta, std::vector<double>& out) {
  const bool peri = norm == 1, post = norm == 2;
  const index_t d = M::d, dh = M::dh, H = M::H, n = B * T;
  out.assign(std::size_t(n * d), 0.0);
  const std::vector<double> ln = post ? x : naive::layernorm(x, n, d, &p[M::o_ln_w], &p[M::o_ln_b]);
  auto row_dot = [&](const double* a, const double* w) {
    double s = 0;
    for (index_t c = 0; c < d; ++c) s += a[c] * w[c];
    return s;
  };
  double aux = 0;
  for (index_t h = 0; h < H; ++h) {
    std::vector<double> q(n * dh), k(n * dh), v(n * dh, 0.0), lv(n * NA), lo(n * NA), a(n * dh, 0.0);
    for (index_t r = 0; r < n; ++r) {
      const double* xin = peri ? &x[r * d] : &ln[r * d];
      for (index_t i = 0; i < dh; ++i) {
        q[r * dh + i] = row_dot(&ln[r * d], &p[M::o_qk + (h * dh + i) * d]);
        k[r * dh + i] = row_dot(&ln[r * d], &p[M::o_qk + (H * dh + h * dh + i) * d]);
      }
      for (int e = 0; e < NA; ++e) {
        lv[r * NA + e] = row_dot(&ln[r * d], &p[M::o_sv + (h * NA + e) * d]);
        lo[r * NA + e] = row_dot(&ln[r * d], &p[M::o_so + (h * NA + e) * d]);
      }
      for (int e : top(&lv[r * NA], KA)) {  // eq. (7)
        const double s = 1.0 / (1.0 + std::exp(-lv[r * NA + e]));
        for (index_t i = 0; i < dh; ++i) v[r * dh + i] += s * row_dot(xin, &p[M::o_v + ((h * NA + e) * dh + i) * d]);
      }
    }
    for (index_t b = 0; b < B; ++b)  // eq. (8), causal
      for (index_t t = 0; t < T; ++t) {
        std::vector<double> sc(std::size_t(t + 1));
        double mx = -1e300, sum = 0;
        for (index_t u = 0; u <= t; ++u) {
          double s = 0;
          for (index_t i = 0; i < dh; ++i) s += q[(b * T + t) * dh + i] * k[(b * T + u) * dh + i];
          sc[u] = s / std::sqrt(double(dh));
          mx = std::max(mx, sc[u]);
        }
        for (index_t u = 0; u <= t; ++u) sum += (sc[u] = std::exp(sc[u] - mx));
        for (index_t u = 0; u <= t; ++u)
          for (index_t i = 0; i < dh; ++i) a[(b * T + t) * dh + i] += sc[u] / sum * v[(b * T + u) * dh + i];
      }
    for (index_t r = 0; r < n; ++r)  // eq. (9)
      for (int e : top(&lo[r * NA], KA)) {
        const double s = 1.0 / (1.0 + std::exp(-lo[r * NA + e]));
        for (index_t c = 0; c < d; ++c) {
          double y = 0;
          for (index_t i = 0; i < dh; ++i) y += a[r * dh + i] * p[M::o_o + ((h * NA + e) * d + c) * dh + i];
          out[r * d + c] += s * y;
        }
      }
    aux += delta * (regulariser(lv, B, T) + regulariser(lo, B, T));
  }
  if (post) naive::post_norm(out, x, n, d, &p[M::o_ln_w], &p[M::o_ln_b]);
  return aux;
}

template <class Norm>
void check_against_naive() {
  using M = SwitchHead<2, NA, KA, 4, Norm, std::ratio<1, 10>>::template type<tiny>;
  const index_t B = 2, T = 5, n = B * T, d = tiny.d_model;
  test::Rng rng(9);
  std::vector<double> p = test::random_vec(std::size_t(M::params), rng), x = test::random_vec(std::size_t(n * d), rng);
  const test::ModuleRun got = test::run_module<M>(p, x, B, T);
  std::vector<double> ref;
  const int norm = std::is_same_v<Norm, PeriNorm> ? 1 : std::is_same_v<Norm, PostNorm> ? 2 : 0;
  const double aux = naive_switch_head<M>(p, x, B, T, norm, 0.1, ref);
  CHECK(test::rel_error(got.out, ref) < 1e-12);
  CHECK(std::abs(got.aux - aux) < 1e-12 * std::abs(aux));
  CHECK(aux < 0);
}

// Every selection's picks of the last forward (attention value/output, σ-MoE), for the flip count.
template <class Instance>
std::vector<token_t> all_selection_picks(Instance& m, index_t n) {
  const auto& plan = std::get<0>(m.plan().parts);
  std::vector<token_t> out;
  auto add = [&](const dispatch::Selection& s, int k) {
    const token_t* t = dispatch::toks(m.workspace_data(), s.picks);
    out.insert(out.end(), t, t + n * k);
  };
  for (const auto& at : plan.attn)
    for (int h = 0; h < 2; ++h) add(at.v[h].sel, KA), add(at.o[h].sel, KA);
  for (const auto& f : plan.ffn) add(f.sel, 2);
  return out;
}

template <class Norm, Dims dims = tiny>
void whole_model_gradient_check() {
  using Attn = SwitchHead<2, NA, KA, 4, Norm, std::ratio<1, 10>>;
  using Moe = SigmaMoE<4, 2, 3, Norm, std::ratio<1, 10>>;
  using Model = LM<dims, Assembly<Router<Share<Cycle<2>>>, ModuleSet<MHA<2, Attn::template type>, FFN<2, Moe::template type>>,
                                  K<1>, H<4>>>;
  auto m = Model::template make<cpu::Backend<double>>(6);
  const test::GradientCase c = test::gradient_case(m, 6, 5, 0.5);
  const index_t n = c.batch * c.seq;
  test::check_with_routing(m, c, [&] { return all_selection_picks(m, n); }, "w_sel_v", 1000);
}
}  // namespace

TEST_CASE("SwitchHead (peri-LayerNorm) equals a naive loop over eqs. (5)-(9) in double", "[switch_head]") {
  check_against_naive<PeriNorm>();
}
TEST_CASE("SwitchHead (pre-LayerNorm) equals a naive loop over eqs. (5)-(9) in double", "[switch_head]") {
  check_against_naive<PreNorm>();
}
TEST_CASE("SwitchHead (post-LayerNorm) equals a naive loop: LN(x + y) − x, nothing normalised inside", "[switch_head]") {
  check_against_naive<PostNorm>();
}
TEST_CASE("SwitchHead + σ-MoE, layer-grouped (post): gradient equals finite differences", "[switch_head][gradcheck]") {
  whole_model_gradient_check<PostNorm>();
}
TEST_CASE("SwitchHead + σ-MoE, layer-grouped (peri): gradient equals finite differences", "[switch_head][gradcheck]") {
  whole_model_gradient_check<PeriNorm>();
}
TEST_CASE("SwitchHead + σ-MoE, layer-grouped (pre): gradient equals finite differences", "[switch_head][gradcheck]") {
  whole_model_gradient_check<PreNorm>();
}
TEST_CASE("SwitchHead + σ-MoE with rotary positions (no wpe): gradient equals finite differences",
          "[switch_head][rope][gradcheck]") {
  whole_model_gradient_check<PeriNorm, with_rope(tiny)>();
}

namespace {
constexpr Dims decode_dims{.d_model = 32, .heads = 4, .d_ff = 64, .vocab = 37, .context = 12};
template <class Norm>
using DecodeMoEUT = LM<with_rope(decode_dims), MoEUTStack<5, 2, SwitchHead<2, 3, 2, 8, Norm>, SigmaMoE<5, 2, 16, Norm>>>;
}  // namespace

TEST_CASE("MoEUT decodes incrementally: prefill + step logits equal a full forward (RoPE, peri, pre, post)",
          "[switch_head][decode]") {
  static_assert(infer::decodes<DecodeMoEUT<PeriNorm>, cpu::Backend<double>>);
  CHECK(test::decode_error<DecodeMoEUT<PeriNorm>, double>({12, 4}, {2, 2}) < 1e-12);
  CHECK(test::decode_error<DecodeMoEUT<PreNorm>, double>({12, 4}, {2, 2}) < 1e-12);
  CHECK(test::decode_error<DecodeMoEUT<PostNorm>, double>({12, 4}, {2, 2}) < 1e-12);
  CHECK(test::decode_error<DecodeMoEUT<PeriNorm>, float>({12, 4}, {2, 2}) < 1e-5);
}

TEST_CASE("SwitchHead as MoE's attention: its regulariser is in the objective (gradient equals finite differences)",
          "[switch_head][moe][gradcheck]") {
  // The objective's finite differences match backward only if the executor adds the attention modules'
  // auxiliary loss that their backward differentiates.
  using Model = LM<tiny, Assembly<Router<TopK<Softmax>, BalanceCoef<1, 10>>,
                                  ModuleSet<MHA<2, SwitchHead<2, NA, KA, 4, PeriNorm, std::ratio<1, 5>>::type>,
                                            Experts<FFN, 3, PerStep>>,
                                  K<2>, H<2>, phi::MoE>>;
  auto m = Model::make<cpu::Backend<double>>(8);
  const test::GradientCase c = test::gradient_case(m, 8, 5, 0.5);
  const index_t n = c.batch * c.seq;
  auto picks = [&] {
    std::vector<token_t> out = test::all_picks(m);
    for (const auto& at : std::get<0>(m.plan().parts).attn)
      for (int h = 0; h < 2; ++h)
        for (const auto* sel : {&at.v[h].sel, &at.o[h].sel}) {
          const token_t* t = dispatch::toks(m.workspace_data(), sel->picks);
          out.insert(out.end(), t, t + n * KA);
        }
    return out;
  };
  test::check_with_routing(m, c, picks, "w_sel_o", 1000);
}

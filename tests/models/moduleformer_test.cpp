// ModuleFormer's modules (arXiv 2306.04640; modules/smoe.hpp, modules/moa.hpp, modules/mlp_gate.hpp): each
// against a naive loop over the paper's equations in double (router eqs. (1)-(2), gates not renormalised,
// the mutual-information loss eq. (7), stick-breaking eqs. (3)-(5) with shared K/V); whole-model central
// differences in double (router losses included, the routing fixed); the objective is CE + every module's
// loss; KV-cache decoding equals the full forward.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

#include "mom/models/moduleformer_models.hpp"
#include "mom/mom.hpp"
#include "models/decode_check.hpp"
#include "models/random_tokens.hpp"
#include "models/routed_gradient_check.hpp"
#include "ops/grad_check.hpp"
#include "ops/naive_selection.hpp"

using namespace mom;
namespace naive = mom::test::naive;

namespace {
constexpr Dims tiny{.d_model = 8, .heads = 2, .d_ff = 12, .vocab = 11, .context = 17, .positions = Positions::None};

double gelu(double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }

// The router of eqs. (1)-(2) for every row of ln [n × d]: probabilities (full softmax) [n × C] and the
// picked ids [n × k]; the router's loss coef·Σ p log p + cond·mean_x Σ g log g (eqs. (7)/(8)) and λ‖A'‖².
template <class M>
double naive_router(const std::vector<double>& p, index_t o_gate, const std::vector<double>& ln, index_t n, int C, int k,
                    int n_old, double coef, double cond, double reg, std::vector<double>& probs, std::vector<int>& picks) {
  constexpr index_t d = M::d, R = M::Gate::d_rtr;
  probs.assign(std::size_t(n * C), 0.0);
  picks.clear();
  std::vector<double> pm(std::size_t(C), 0.0);
  double condsum = 0;
  for (index_t r = 0; r < n; ++r) {
    std::vector<double> act(std::size_t(R), 0.0);
    for (index_t i = 0; i < R; ++i) {
      double z = 0;
      for (index_t c = 0; c < d; ++c) z += p[std::size_t(o_gate + i * d + c)] * ln[std::size_t(r * d + c)];
      act[std::size_t(i)] = std::max(z, 0.0);  // ReLU(B x)
    }
    std::vector<double> h(std::size_t(C), 0.0);
    for (int e = 0; e < C; ++e) {
      double z = p[std::size_t(o_gate + M::Gate::o_prune + e)];
      for (index_t i = 0; i < R; ++i) z += p[std::size_t(o_gate + M::Gate::o_a + e * R + i)] * act[std::size_t(i)];
      h[std::size_t(e)] = z;  // [A; A'] ReLU(B x) (+ the mask)
    }
    const double mx = *std::max_element(h.begin(), h.end());
    double sum = 0;
    for (double z : h) sum += std::exp(z - mx);
    for (int e = 0; e < C; ++e) {
      const double g = std::exp(h[std::size_t(e)] - mx) / sum;
      probs[std::size_t(r * C + e)] = g;
      pm[std::size_t(e)] += g / double(n);
      if (g > 0) condsum += g * std::log(g) / double(n);  // 0 log 0 = 0 (a pruned module)
    }
    for (int e : naive::top_k(&probs[std::size_t(r * C)], C, k)) picks.push_back(e);
  }
  double neg_h = 0;
  for (double q : pm)
    if (q > 0) neg_h += q * std::log(q);
  double a_new = 0;
  for (index_t i = index_t(n_old) * R; i < index_t(C) * R; ++i) a_new += std::pow(p[std::size_t(o_gate + M::Gate::o_a + i)], 2);
  return coef * neg_h + cond * condsum + reg * a_new;
}

// Naive SMoE: y_t = Σ_{e ∈ top-k} g(e|x_t) W₂ᵉ GELU(W₁ᵉ LN(x_t)); gate_sums[t] = Σ of its k gates.
template <class M>
double naive_smoe(const std::vector<double>& p, const std::vector<double>& x, index_t n, double coef, double cond,
                  double reg, std::vector<double>& out, std::vector<double>& gate_sums) {
  constexpr index_t d = M::d, df = M::df;
  constexpr int C = M::C, k = M::routed.k;
  const std::vector<double> ln = naive::layernorm(x, n, d, &p[M::o_ln_w], &p[M::o_ln_b]);
  std::vector<double> probs;
  std::vector<int> picks;
  const double loss = naive_router<M>(p, M::o_gate, ln, n, C, k, M::Gate::n_old, coef, cond, reg, probs, picks);
  out.assign(std::size_t(n * d), 0.0);
  gate_sums.assign(std::size_t(n), 0.0);
  for (index_t r = 0; r < n; ++r)
    for (int j = 0; j < k; ++j) {
      const int e = picks[std::size_t(r * k + j)];
      const double g = probs[std::size_t(r * C + e)];
      gate_sums[std::size_t(r)] += g;
      for (index_t i = 0; i < df; ++i) {
        double h = 0;
        for (index_t c = 0; c < d; ++c) h += p[std::size_t(M::o_w1 + (e * df + i) * d + c)] * ln[std::size_t(r * d + c)];
        h = gelu(h);
        for (index_t c = 0; c < d; ++c) out[std::size_t(r * d + c)] += g * h * p[std::size_t(M::o_w2 + (e * d + c) * df + i)];
      }
    }
  return loss;
}

// Naive MoA over B sequences of T rows: shared k_i = W_k x̂_i, v_i = W_v x̂_i; for each chosen head e of token
// t, q = W_qᵉ x̂_t, β_i = σ(q·k_i/√D_att), p_i = β_i Π_{i<j<=t}(1 − β_j) (eqs. (3)-(4), the product as
// written, one factor per key), o = Σ_i p_i v_i, and y_t += g(e|x_t) W_oᵉ o (eq. (5)).
template <class M>
double naive_moa(const std::vector<double>& p, const std::vector<double>& x, index_t B, index_t T, double coef,
                 double cond, double reg, std::vector<double>& out) {
  constexpr index_t d = M::d, da = M::da;
  constexpr int C = M::C, k = M::routed.k;
  const index_t n = B * T;
  const std::vector<double> ln = naive::layernorm(x, n, d, &p[M::o_ln_w], &p[M::o_ln_b]);
  std::vector<double> probs;
  std::vector<int> picks;
  const double loss = naive_router<M>(p, M::o_gate, ln, n, C, k, M::Gate::n_old, coef, cond, reg, probs, picks);
  auto project = [&](index_t w_off, index_t row, index_t r) {  // Σ_c W[row, c] x̂_r[c]
    double z = 0;
    for (index_t c = 0; c < d; ++c) z += p[std::size_t(w_off + row * d + c)] * ln[std::size_t(r * d + c)];
    return z;
  };
  out.assign(std::size_t(n * d), 0.0);
  for (index_t b = 0; b < B; ++b)
    for (index_t t = 0; t < T; ++t) {
      const index_t r = b * T + t;
      for (int j = 0; j < k; ++j) {
        const int e = picks[std::size_t(r * k + j)];
        std::vector<double> q(std::size_t(da), 0.0), o(std::size_t(da), 0.0), beta(std::size_t(t + 1), 0.0);
        for (index_t a = 0; a < da; ++a) q[std::size_t(a)] = project(M::o_q, e * da + a, r);
        for (index_t i = 0; i <= t; ++i) {
          double z = 0;
          for (index_t a = 0; a < da; ++a) z += q[std::size_t(a)] * project(M::o_kv, a, b * T + i);
          beta[std::size_t(i)] = 1 / (1 + std::exp(-z / std::sqrt(double(da))));  // eq. (3)
        }
        for (index_t i = 0; i <= t; ++i) {
          double w = beta[std::size_t(i)];
          for (index_t j2 = i + 1; j2 <= t; ++j2) w *= 1 - beta[std::size_t(j2)];  // eq. (4)
          for (index_t a = 0; a < da; ++a) o[std::size_t(a)] += w * project(M::o_kv, da + a, b * T + i);
        }
        const double g = probs[std::size_t(r * C + e)];
        for (index_t c = 0; c < d; ++c) {
          double y = 0;
          for (index_t a = 0; a < da; ++a) y += p[std::size_t(M::o_o + (e * d + c) * da + a)] * o[std::size_t(a)];
          out[std::size_t(r * d + c)] += g * y;  // eq. (5)
        }
      }
    }
  return loss;
}

// Parameters for a module test: random, the pruning mask 0 except module `pruned` (−10⁴) when >= 0.
template <class M>
std::vector<double> module_params(std::uint64_t seed, int pruned = -1) {
  test::Rng rng(seed);
  std::vector<double> p = test::random_vec(std::size_t(M::params), rng);
  for (int e = 0; e < M::C; ++e) p[std::size_t(M::o_prune + e)] = e == pruned ? pruned_logit : 0.0;
  return p;
}

using MI = MutualInformation<std::ratio<1, 10>>;
using Tiny2 = LM<tiny, ModuleFormer<2, MoA<4, 2, 4, 3>, SMoE<4, 2, 5, 3>>>;
using TinyInserted =
    LM<tiny, ModuleFormerSpec<2, MoA<3, 2, 4, 3>, SMoE<3, 2, 5, 3>>::inserted<2, 1, std::ratio<1, 2>>::type>;
}  // namespace

TEST_CASE("ModuleFormer SMoE equals a naive loop over eqs. (1)-(2) and (7) in double", "[moduleformer]") {
  using M = SMoE<5, 2, 3, 4, MI>::type<tiny>;
  const index_t n = 10, d = tiny.d_model;
  for (int pruned : {-1, 2}) {
    const std::vector<double> p = module_params<M>(3, pruned);
    test::Rng rng(4);
    const std::vector<double> x = test::random_vec(std::size_t(n * d), rng);
    const test::ModuleRun got = test::run_module<M>(p, x, 2, 5);
    std::vector<double> ref, sums;
    const double aux = naive_smoe<M>(p, x, n, 0.1, -0.1, 0, ref, sums);
    CHECK(test::rel_error(got.out, ref) < 1e-12);
    CHECK(std::abs(got.aux - aux) < 1e-12 * std::abs(aux));
    // Eq. (1) as written: the k gates are the softmax probabilities, not renormalised to sum to 1.
    for (double s : sums) CHECK((s > 0.2 && s < 0.999));
  }
}

TEST_CASE("ModuleFormer SMoE with inserted experts: A' rows, new experts and lambda |A'|^2 (eqs. (9)-(10))",
          "[moduleformer]") {
  using M = SMoE<3, 2, 3, 4, LoadConcentration<std::ratio<1, 4>>, 2, std::ratio<1, 3>>::type<tiny>;
  static_assert(M::C == 5 && M::Gate::n_old == 3);
  const index_t n = 6, d = tiny.d_model;
  const std::vector<double> p = module_params<M>(5);
  test::Rng rng(6);
  const std::vector<double> x = test::random_vec(std::size_t(n * d), rng);
  const test::ModuleRun got = test::run_module<M>(p, x, 1, 6);
  std::vector<double> ref, sums;
  const double aux = naive_smoe<M>(p, x, n, -0.25, 0, 1.0 / 3, ref, sums);
  CHECK(test::rel_error(got.out, ref) < 1e-12);
  CHECK(std::abs(got.aux - aux) < 1e-12 * std::abs(aux));
}

TEST_CASE("ModuleFormer MoA equals a naive loop over eqs. (1)-(5) with shared keys and values", "[moduleformer]") {
  using M = MoA<5, 2, 4, 3, MI>::type<tiny>;
  const index_t B = 2, T = 6, d = tiny.d_model;
  for (int pruned : {-1, 0}) {
    const std::vector<double> p = module_params<M>(8, pruned);
    test::Rng rng(9);
    const std::vector<double> x = test::random_vec(std::size_t(B * T * d), rng);
    const test::ModuleRun got = test::run_module<M>(p, x, B, T);
    std::vector<double> ref;
    const double aux = naive_moa<M>(p, x, B, T, 0.1, -0.1, 0, ref);
    CHECK(test::rel_error(got.out, ref) < 1e-12);
    CHECK(std::abs(got.aux - aux) < 1e-12 * std::abs(aux));
  }
}

TEST_CASE("ModuleFormer in double: gradient, router losses included, equals finite differences",
          "[moduleformer][gradcheck]") {
  test::gradient_check<Tiny2>(3, 4);
}

TEST_CASE("ModuleFormer with inserted modules and routing regularisation: gradient equals finite differences",
          "[moduleformer][gradcheck]") {
  test::gradient_check<TinyInserted>(4, 4);
}

TEST_CASE("ModuleFormer: the objective is the cross-entropy plus every module's router loss", "[moduleformer]") {
  using Quiet = LM<tiny, ModuleFormerSpec<2, MoA<4, 2, 4, 3>, SMoE<4, 2, 5, 3>>::with_loss<NoRouterLoss<>>::type>;
  static_assert(Quiet::params == Tiny2::params);
  auto m = Tiny2::make<cpu::Backend<double>>(2);
  auto q = Quiet::make<cpu::Backend<double>>(2);
  m.reserve(2, 6);
  q.reserve(2, 6);
  std::copy(m.params().begin(), m.params().end(), q.params().begin());
  const auto tokens = test::random_tokens(12, tiny.vocab, 3), targets = test::random_tokens(12, tiny.vocab, 4);
  const double with = m.forward(tokens, targets, 2, 6), without = q.forward(tokens, targets, 2, 6);
  const auto& plan = std::get<0>(m.plan().parts);
  double per_use = 0;
  for (const auto& a : plan.attn) per_use += m.workspace_data()[a.aux];
  for (const auto& f : plan.ffn) per_use += m.workspace_data()[f.aux];
  CHECK(m.workspace_data()[plan.aux] == Approx(per_use).epsilon(1e-14));
  CHECK(per_use != 0);
  CHECK(with == Approx(without + per_use).epsilon(1e-12));
  CHECK(without == Approx(q.cross_entropy()).epsilon(1e-14));
}

TEST_CASE("ModuleFormer: KV-cache decoding equals the full forward (double)", "[moduleformer][decode]") {
  CHECK(test::decode_error<Tiny2, double>() < 1e-12);
  CHECK(test::decode_error<TinyInserted, double>() < 1e-12);
}

TEST_CASE("ModuleFormer: float decoding agrees with the full forward", "[moduleformer][decode]") {
  CHECK(test::decode_error<Tiny2, float>() < 1e-4);
}

TEST_CASE("ModuleFormer's cost model: total and active parameters, FLOPs of the active ones", "[moduleformer]") {
  using Spec = ModuleFormerSpec<2, MoA<4, 2, 4, 3>, SMoE<4, 2, 5, 3>>;
  static_assert(Spec::total_params<tiny> == Tiny2::params);
  using A = MoA<4, 2, 4, 3>::type<tiny>;
  using F = SMoE<4, 2, 5, 3>::type<tiny>;
  // A token uses 2 of the 4 heads (W_q, W_o and its router row each) and 2 of the 4 experts.
  static_assert(A::params - A::active_params == 2 * (3 + 2 * 4 * tiny.d_model));
  static_assert(F::params - F::active_params == 2 * (3 + 2 * 5 * tiny.d_model));
  static_assert(Spec::active_params<tiny> == Tiny2::params - 2 * (A::params - A::active_params + F::params - F::active_params));
  // Forward FLOPs of the linear maps: 2 per active weight (the router's rows of all modules are read: + 2·(C−k)·D_rtr).
  static_assert(F::flops_per_token(1) == 2 * (F::active_params - 2 * tiny.d_model - F::C) + 2 * (4 - 2) * 3);
  CHECK(describe<Tiny2>().find("positions=none") != std::string::npos);
}

TEST_CASE("ModuleFormer with the router z-loss: gradient equals finite differences, the loss is the naive one",
          "[moduleformer][gradcheck][zloss]") {
  using ZLoss = MutualInformation<std::ratio<1, 10>, std::ratio<1, 5>>;
  test::gradient_check<LM<tiny, ModuleFormer<2, MoA<4, 2, 4, 3, ZLoss>, SMoE<4, 2, 5, 3, ZLoss>>>>(3, 4);
  // The SMoE's router loss with z: MI + 0.2 · mean (log Σ exp h)², h the router logits.
  using M = SMoE<5, 2, 3, 4, ZLoss>::type<tiny>;
  const index_t n = 7, d = tiny.d_model;
  const std::vector<double> p = module_params<M>(13);
  test::Rng rng(14);
  const std::vector<double> x = test::random_vec(std::size_t(n * d), rng);
  const test::ModuleRun got = test::run_module<M>(p, x, 1, n);
  std::vector<double> ref, sums;
  const double mi = naive_smoe<M>(p, x, n, 0.1, -0.1, 0, ref, sums);
  // The z term from the router's logits h = A ReLU(B LN(x)), recomputed.
  const std::vector<double> ln = naive::layernorm(x, n, d, &p[M::o_ln_w], &p[M::o_ln_b]);
  double z = 0;
  for (index_t r = 0; r < n; ++r) {
    std::vector<double> act(std::size_t(M::Gate::d_rtr), 0.0);
    for (index_t i = 0; i < M::Gate::d_rtr; ++i) {
      double s = 0;
      for (index_t c = 0; c < d; ++c) s += p[std::size_t(M::o_gate + i * d + c)] * ln[std::size_t(r * d + c)];
      act[std::size_t(i)] = std::max(s, 0.0);
    }
    double sum = 0;
    for (int e = 0; e < M::C; ++e) {
      double h = 0;
      for (index_t i = 0; i < M::Gate::d_rtr; ++i) h += p[std::size_t(M::o_gate + M::Gate::o_a + e * M::Gate::d_rtr + i)] * act[std::size_t(i)];
      sum += std::exp(h);
    }
    z += std::pow(std::log(sum), 2) / double(n);
  }
  CHECK(test::rel_error(got.out, ref) < 1e-12);
  CHECK(got.aux == Approx(mi + 0.2 * z).epsilon(1e-12));
}

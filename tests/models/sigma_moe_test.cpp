// σ-MoE feed-forward (modules/sigma_moe.hpp; MoEUT arXiv 2405.16039 §2.1): the module against a naive
// loop over eqs. (1)-(4) in double, peri and pre LayerNorm; its gradient, regulariser included, by
// central differences inside a whole model with layer grouping (Share<Cycle<2>>), the routing fixed.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

#include "mom/modules/sigma_moe.hpp"
#include "mom/mom.hpp"
#include "models/random_tokens.hpp"
#include "models/routed_gradient_check.hpp"
#include "ops/grad_check.hpp"
#include "ops/naive_selection.hpp"

using namespace mom;
namespace naive = mom::test::naive;

namespace {
constexpr Dims tiny{.d_model = 8, .heads = 2, .d_ff = 12, .vocab = 11, .context = 6};

// Naive σ-MoE over B sequences of T rows: out [n × d] and the regulariser γ·L.
template <class M, int NE, int K>
// norm: 0 pre, 1 peri, 2 post (the module returns LN(x + y) − x; nothing normalised inside).
double naive_sigma_moe(const std::vector<double>& p, const std::vector<double>& x, index_t B, index_t T, int norm,
                       double gamma, std::vector<double>& out) {
  const bool peri = norm == 1, post = norm == 2;
  const index_t d = M::d, de = M::de, n = B * T;
  out.assign(std::size_t(n * d), 0.0);
  const std::vector<double> ln = post ? x : naive::layernorm(x, n, d, &p[M::o_ln_w], &p[M::o_ln_b]);
  std::vector<double> logits(std::size_t(n * NE));
  for (index_t r = 0; r < n; ++r) {
    for (int e = 0; e < NE; ++e) {
      double z = 0;
      for (index_t c = 0; c < d; ++c) z += ln[r * d + c] * p[M::o_sel + e * d + c];
      logits[r * NE + e] = z;
    }
    const double* xin = peri ? &x[r * d] : &ln[r * d];
    for (int e : naive::top_k(&logits[r * NE], NE, K)) {
      const double s = 1.0 / (1.0 + std::exp(-logits[r * NE + e]));  // eq. (1)
      for (index_t i = 0; i < de; ++i) {
        double h = 0;
        for (index_t c = 0; c < d; ++c) h += xin[c] * p[M::o_w1 + (e * de + i) * d + c];
        h = std::max(h, 0.0);
        for (index_t c = 0; c < d; ++c) out[r * d + c] += s * h * p[M::o_w2 + (e * d + c) * de + i];  // eq. (3)
      }
    }
  }
  if (post) naive::post_norm(out, x, n, d, &p[M::o_ln_w], &p[M::o_ln_b]);
  return gamma * naive::sequence_neg_entropy(logits, B, T, NE);  // eq. (4), averaged over the sequences
}

template <class Norm>
void check_against_naive() {
  constexpr int NE = 5, K = 2;
  using M = SigmaMoE<NE, K, 3, Norm, std::ratio<1, 10>>::template type<tiny>;
  const index_t B = 2, T = 4, n = B * T, d = tiny.d_model;
  test::Rng rng(7);
  std::vector<double> p = test::random_vec(std::size_t(M::params), rng), x = test::random_vec(std::size_t(n * d), rng);
  const test::ModuleRun got = test::run_module<M>(p, x, B, T);
  std::vector<double> ref;
  const int norm = std::is_same_v<Norm, PeriNorm> ? 1 : std::is_same_v<Norm, PostNorm> ? 2 : 0;
  const double aux = naive_sigma_moe<M, NE, K>(p, x, B, T, norm, 0.1, ref);
  CHECK(test::rel_error(got.out, ref) < 1e-12);
  CHECK(std::abs(got.aux - aux) < 1e-12 * std::abs(aux));
  CHECK(aux < 0);  // the negative entropy of a spread selection
}

// The σ-MoE modules' picks of the last forward (every step of the one part), for the flip count.
template <class Instance>
std::vector<token_t> sigma_picks(Instance& m, index_t n, int k) {
  const auto& plan = std::get<0>(m.plan().parts);
  std::vector<token_t> out;
  for (const auto& f : plan.ffn) {
    const token_t* t = dispatch::toks(m.workspace_data(), f.sel.picks);
    out.insert(out.end(), t, t + n * k);
  }
  return out;
}

template <class Norm>
void whole_model_gradient_check() {
  using Moe = SigmaMoE<4, 2, 3, Norm, std::ratio<1, 5>>;
  using Model = LM<tiny, Assembly<Router<Share<Cycle<2>>>, ModuleSet<MHA<2>, FFN<2, Moe::template type>>, K<1>, H<4>>>;
  auto m = Model::template make<cpu::Backend<double>>(5);
  const test::GradientCase c = test::gradient_case(m, 5, 5, 0.5);
  const index_t n = c.batch * c.seq;
  std::vector<int> used(4, 0);
  for (token_t e : sigma_picks(m, n, 2)) used[std::size_t(e)] = 1;
  CHECK(std::count(used.begin(), used.end(), 1) >= 3);  // the routing is not degenerate
  test::check_with_routing(m, c, [&] { return sigma_picks(m, n, 2); }, "w_sel", 500);
}
}  // namespace

TEST_CASE("σ-MoE (peri-LayerNorm) equals a naive loop over eqs. (1)-(4) in double", "[sigma_moe]") {
  check_against_naive<PeriNorm>();
}
TEST_CASE("σ-MoE (pre-LayerNorm) equals a naive loop over eqs. (1)-(4) in double", "[sigma_moe]") {
  check_against_naive<PreNorm>();
}

TEST_CASE("σ-MoE (post-LayerNorm) equals a naive loop: LN(x + y) − x, nothing normalised inside", "[sigma_moe]") {
  check_against_naive<PostNorm>();
}

TEST_CASE("σ-MoE in a layer-grouped model (peri): gradient, regulariser included, equals finite differences",
          "[sigma_moe][gradcheck]") {
  whole_model_gradient_check<PeriNorm>();
}
TEST_CASE("σ-MoE in a layer-grouped model (pre): gradient equals finite differences", "[sigma_moe][gradcheck]") {
  whole_model_gradient_check<PreNorm>();
}

TEST_CASE("σ-MoE in a layer-grouped model (post): gradient equals finite differences", "[sigma_moe][gradcheck]") {
  whole_model_gradient_check<PostNorm>();
}

TEST_CASE("σ-MoE: the model's objective is the cross-entropy plus every use's entropy regulariser", "[sigma_moe]") {
  using Model = LM<tiny, Assembly<Router<Share<Cycle<1>>>, ModuleSet<MHA<1>, FFN<1, SigmaMoE<4, 2, 3>::type>>, K<1>, H<3>>>;
  using Quiet = LM<tiny, Assembly<Router<Share<Cycle<1>>>,
                                  ModuleSet<MHA<1>, FFN<1, SigmaMoE<4, 2, 3, PeriNorm, std::ratio<0>>::type>>, K<1>, H<3>>>;
  static_assert(Model::params == Quiet::params);
  auto m = Model::make<cpu::Backend<double>>(2);
  auto q = Quiet::make<cpu::Backend<double>>(2);
  m.reserve(2, 6);
  q.reserve(2, 6);
  std::copy(m.params().begin(), m.params().end(), q.params().begin());
  const auto tokens = test::random_tokens(12, tiny.vocab, 3), targets = test::random_tokens(12, tiny.vocab, 4);
  const double with = m.forward(tokens, targets, 2, 6), without = q.forward(tokens, targets, 2, 6);
  // The aux slot holds the three uses' γ·L summed; the objective is the CE plus it.
  const auto& plan = std::get<0>(m.plan().parts);
  const double aux = m.workspace_data()[plan.aux];
  double per_use = 0;
  for (const auto& f : plan.ffn) per_use += m.workspace_data()[f.aux];
  CHECK(aux == Approx(per_use).epsilon(1e-14));
  CHECK(aux < 0);
  CHECK(with == Approx(without + aux).epsilon(1e-12));
}

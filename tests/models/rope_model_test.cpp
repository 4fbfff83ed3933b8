// RoPE as the model's position choice (Dims::positions; RoFormer, arXiv 2104.09864): the layout has no wpe,
// a dense RoPE model's whole-model gradient equals central finite differences in double, the grouped
// attention paths (layer-skip's routed rows, AttendToSkipped's every-token keys, MoM's row groups) rotate by
// the true positions (equal to the dense stack; gradient checks through the GRU routers), and KV-cache
// decoding equals the full forward (double 1e-12, float 1e-5).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "mom/models/describe.hpp"
#include "mom/models/mom_models.hpp"
#include "mom/models/warm_start.hpp"
#include "mom/mom.hpp"
#include "models/decode_check.hpp"
#include "models/routed_gradient_check.hpp"

using namespace mom;

namespace {

constexpr Dims tiny{.d_model = 8, .heads = 2, .d_ff = 12, .vocab = 11, .context = 6};
constexpr Dims rope_tiny = with_rope(tiny);
using Learned2 = LM<tiny, Dense<2>>;
using Rope2 = LM<rope_tiny, Dense<2>>;

// ---- compile-time facts -----------------------------------------------------------------------
static_assert(!tiny.rope() && rope_tiny.rope() && rope_tiny.rope_base == 10000);
static_assert(with_rope(tiny, 500).rope_base == 500 && with_rope(with_rope(tiny, 500)).rope_base == 500);
static_assert(std::is_same_v<LMRoPE<tiny, Dense<2>>, Rope2>);
static_assert(!std::is_same_v<Learned2, Rope2>);                           // Dims differ: different types
static_assert(Rope2::params == Learned2::params - tiny.context * tiny.d_model);  // no wpe
static_assert(Rope2::tensor_count == Learned2::tensor_count - 1);
static_assert(Rope2::layout[0].name == "wte" && Rope2::layout[1].name == "h.0.ln_1.w" &&
              Rope2::layout[1].offset == tiny.vocab * tiny.d_model);
static_assert(Rope2::flops_per_token(6) == Learned2::flops_per_token(6));  // the rotation is not counted
static_assert(Rope2::activation_elements(2, 6) == Learned2::activation_elements(2, 6));  // rotated in place

template <class Instance>
std::vector<double> logits_of(Instance& m) {
  const auto l = m.logits();
  return {l.data, l.data + l.rows * l.cols};
}
double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double e = 0;
  for (std::size_t i = 0; i < a.size(); ++i) e = std::max(e, std::abs(a[i] - b[i]));
  return e;
}
template <class Instance>
std::vector<double> grads_of(Instance& m) {
  return {m.grads().begin(), m.grads().end()};
}

}  // namespace

TEST_CASE("RoPE model: no wpe tensor, and describe says so", "[model][rope]") {
  for (const auto& p : Rope2::layout) CHECK(p.name != "wpe");
  CHECK_THROWS_WITH(Rope2::find("wpe"), "LM::find: the model has no parameter named 'wpe'");
  CHECK(describe<Rope2>().find("context=6 positions=rope(base 10000)> Dense<2>") != std::string::npos);
  CHECK(describe<Learned2>().find("positions") == std::string::npos);
}

TEST_CASE("RoPE model: whole-model gradient equals central finite differences (double)", "[model][rope][gradcheck]") {
  using Model = LM<rope_tiny, Chunked<Layer, Dense<2>>>;
  auto m = Model::make<cpu::Backend<double>>(3);
  const test::GradientCase c = test::gradient_case(m, 3, 5);
  double max_err = 0, max_grad = 0;
  const test::FdTally t = test::check_central_differences(
      m, c.grad, 1e-5, [&](const auto&) { return c.forward(m); }, test::no_routing,
      [&](const auto&, double fd, double g) {
        max_err = std::max(max_err, std::abs(fd - g));
        max_grad = std::max(max_grad, std::abs(g));
      });
  INFO("max |fd - grad| " << max_err << ", max |grad| " << max_grad);
  CHECK(t.checked == Model::params);
  CHECK(max_err < 1e-8);
  CHECK(max_grad > 1e-2);  // not vacuous
  // The positions are seen: the same parameters with the queries and keys not rotated (a learned model
  // whose wpe is zero) give another loss.
  auto learned = LM<tiny, Chunked<Layer, Dense<2>>>::make<cpu::Backend<double>>(3);
  std::fill(learned.params().begin(), learned.params().end(), 0.0);
  std::copy_n(m.params().begin(), tiny.vocab * tiny.d_model, learned.params().begin());  // wte
  std::copy(m.params().begin() + tiny.vocab * tiny.d_model, m.params().end(),
            learned.params().begin() + (tiny.vocab + tiny.context) * tiny.d_model);  // the rest, after wpe = 0
  learned.reserve(c.batch, c.seq);
  CHECK(std::abs(double(learned.forward(c.tokens, c.targets, c.batch, c.seq)) - c.forward(m)) > 1e-6);
}

TEST_CASE("RoPE model: the grouped attention paths rotate by the true positions (= the dense stack)",
          "[model][rope][depth]") {
  // A layer-skip criterion that never skips runs every token through the grouped attention: routed keys
  // (KeySource::Routed), or with AttendToSkipped every token's keys (KeySource::AllTokens). Both must
  // compute exactly the dense stack, forward and backward, so the routed rows' positions are idx mod seq.
  using Dense3 = LM<rope_tiny, Dense<3>>;
  using NeverSkip = LM<rope_tiny, Assembly<Router<Skipping<Never>>, ModuleSet<MHA<3>, FFN<3>, Skip>, K<1>, H<3>,
                                           phi::LayerSkip>>;
  using NeverSkipAll = LM<rope_tiny, Assembly<Router<Skipping<Never, AttendToSkipped>>, ModuleSet<MHA<3>, FFN<3>, Skip>,
                                              K<1>, H<3>, phi::LayerSkip>>;
  auto dense = Dense3::make<cpu::Backend<double>>(13);
  test::randomise(dense, 14);
  const index_t batch = 3, seq = 6;
  dense.reserve(batch, seq);
  const auto tokens = test::random_tokens(batch * seq, tiny.vocab, 17);
  const auto targets = test::random_tokens(batch * seq, tiny.vocab, 18);
  const double loss = dense.forward(tokens, targets, batch, seq);
  const auto want_logits = logits_of(dense);
  dense.backward();
  const auto want_grads = grads_of(dense);

  auto check = [&](auto& m) {
    warm_start(m, dense);
    m.reserve(batch, seq);
    CHECK(std::abs(double(m.forward(tokens, targets, batch, seq)) - loss) < 1e-12);
    CHECK(max_abs_diff(logits_of(m), want_logits) < 1e-12);
    m.backward();
    CHECK(max_abs_diff(grads_of(m), want_grads) < 1e-12);
  };
  SECTION("routed keys") {
    auto m = NeverSkip::make<cpu::Backend<double>>(15);
    check(m);
  }
  SECTION("every token's keys (AttendToSkipped)") {
    auto m = NeverSkipAll::make<cpu::Backend<double>>(19);
    check(m);
  }
}

TEST_CASE("RoPE model: MoM chunks' gradients equal finite differences (both key/value modes)",
          "[model][rope][mom][gradcheck]") {
  using SmallRouter = Router<GRU, Width<5>, Temperature<1, 2>, BalanceCoef<1, 10>>;
  SECTION("phi::MoM (every token's keys)") {
    test::gradient_check<LM<rope_tiny, Chunked<Layer, KaHbS<2, 3, 3, SmallRouter>, Layer>>>(3, 4);
  }
  SECTION("phi::MoMRoutedKV (routed keys)") {
    test::gradient_check<LM<rope_tiny, Chunked<KaHbS<2, 2, 3, SmallRouter, phi::MoMRoutedKV>, Layer>>>(4, 4);
  }
}

namespace {
constexpr Dims decode_dims = with_rope(Dims{.d_model = 32, .heads = 4, .d_ff = 64, .vocab = 61, .context = 24});
}  // namespace

TEST_CASE("RoPE model: KV-cache decoding equals the full forward (the cache holds rotated keys)",
          "[model][rope][decode]") {
  SECTION("dense") {
    CHECK(test::decode_error<LM<decode_dims, Dense<3>>, double>() < 1e-12);
    CHECK(test::decode_error<LM<decode_dims, Dense<3>>, float>() < 1e-5);
  }
  SECTION("MoE") { CHECK(test::decode_error<LM<decode_dims, MoEStack<2, 4, 2>>, double>() < 1e-12); }
}

TEST_CASE("RoPE model: a few AdamW steps on one batch lower the loss (float)", "[model][rope][train]") {
  constexpr Dims dims = with_rope(Dims{.d_model = 32, .heads = 4, .d_ff = 64, .vocab = 40, .context = 16});
  using Model = LM<dims, Dense<2>>;
  auto m = Model::make<cpu::Backend<float>>(5);
  m.reserve(4, 16);
  const auto tokens = test::random_tokens(64, dims.vocab, 6);
  std::vector<float> m1(std::size_t(Model::params), 0.f), m2(m1);
  float first = 0, last = 0;
  for (int step = 1; step <= 30; ++step) {
    m.zero_grad();
    last = m.forward(tokens, tokens, 4, 16);
    if (step == 1) first = last;
    m.backward();
    m.backend().adamw_step(m.params(), std::span<const float>(m.grads()), std::span<float>(m1), std::span<float>(m2),
                           cpu::AdamWConfig{.lr = 1e-2}, step);
  }
  INFO("loss " << first << " -> " << last);
  CHECK(last < 0.5f * first);
}

// DeepSeekMoE as types (routers/affinity.hpp, models/moe_models.hpp): Router<TopK<Sigmoid>> over shared and
// fine-grained routed experts. Whole-model gradient in double (finite differences, routing fixed); the
// shared experts run for every token with weight 1; the bias selects but never weighs (a shift of every
// bias changes nothing; GroupLimited<G, G> is the ungrouped router); the expert loads reach the bias's
// gradient slot and update_buffers applies the sign rule; FLOPs executed equal the cost model; decoding is
// exact.
#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>
#include <cmath>
#include <string>
#include <vector>

#include "mom/mom.hpp"
#include "models/decode_check.hpp"
#include "models/counting_backend.hpp"
#include "models/routed_gradient_check.hpp"

using namespace mom;
using test::random_tokens;
using test::randomise;

namespace {

constexpr Dims tiny{.d_model = 8, .heads = 2, .d_ff = 12, .vocab = 11, .context = 6};
constexpr Dims dims{.d_model = 32, .heads = 4, .d_ff = 64, .vocab = 61, .context = 24};

// 1 shared + 4 routed experts of width d_ff/2, top-2 routed, with the batch-wise balance loss on.
using Small = LM<tiny, DeepSeekMoEStack<2, 1, 4, 2, 2, BalanceCoef<1, 10>>>;

template <class Instance>
std::span<typename Instance::scalar> tensor(Instance& m, std::string_view name, bool grad = false) {
  for (const auto& p : Instance::model_type::layout)
    if (p.name == name) return (grad ? m.grads() : m.params()).subspan(std::size_t(p.offset), std::size_t(p.size()));
  FAIL("no tensor " << name);
  return {};
}

template <class List>
struct first_of;
template <class F, class... R>
struct first_of<TypeList<F, R...>> {
  using type = F;
};

template <class Instance>
double loss_and_grads(Instance& m, std::vector<double>& grads) {
  constexpr index_t V = Instance::model_type::dims.vocab;
  const auto tokens = random_tokens(2 * 6, V, 5), targets = random_tokens(2 * 6, V, 6);
  m.reserve(2, 6);
  const double loss = m.forward(tokens, targets, 2, 6);
  m.zero_grad();
  m.backward();
  grads.assign(m.grads().begin(), m.grads().end());
  return loss;
}

}  // namespace

TEST_CASE("DeepSeekMoE: whole-model gradient equals finite differences (shared + fine-grained experts)",
          "[deepseek][gradcheck]") {
  test::gradient_check<Small>(3, 4);
  test::gradient_check<LM<tiny, DeepSeekMoEStack<2, 0, 4, 2, 2, GroupLimited<2, 1>, Renormalise<false>,
                                                  RouteScale<5, 2>>>>(4, 3);
  // top-1 routed: renormalised its weight is always 1 (no router gradient), so the raw affinity here
  test::gradient_check<LM<tiny, Chunked<Layer, DeepSeekMoEStack<1, 2, 3, 1, 1, Renormalise<false>>>>>(5, 3);
  // V3's sequence-wise balance loss, its gradient through the normalised affinities (coefficient large enough
  // to matter in the check).
  test::gradient_check<LM<tiny, DeepSeekMoEStack<2, 1, 4, 2, 1, SequenceBalance<1, 2>>>>(6, 4);
}

TEST_CASE("DeepSeekMoE: SequenceBalance adds V3's per-sequence loss, computed over each sequence of the batch",
          "[deepseek]") {
  using Seq = LM<tiny, DeepSeekMoEStack<1, 1, 4, 2, 1, SequenceBalance<1, 10>, BiasBalance<0>>>;
  using Plain = LM<tiny, DeepSeekMoEStack<1, 1, 4, 2, 1, BiasBalance<0>>>;
  static_assert(Seq::params == Plain::params);
  auto a = Seq::make<cpu::Backend<double>>(7);
  auto b = Plain::make<cpu::Backend<double>>(7);
  test::randomise(a, 8);
  std::copy(a.params().begin(), a.params().end(), b.params().begin());
  const index_t batch = 3, seq = 6;
  a.reserve(batch, seq);
  b.reserve(batch, seq);
  const auto tokens = test::random_tokens(batch * seq, tiny.vocab, 9), targets = test::random_tokens(batch * seq, tiny.vocab, 10);
  const double la = a.forward(tokens, targets, batch, seq), lb = b.forward(tokens, targets, batch, seq);
  // The same routing, so the difference is the loss itself: 1/10 · mean over sequences of Σ_i f_i P_i >= 1/10
  // (Σ_i f_i P_i >= 1 with equality only when balanced, as V3's loss is normalised).
  CHECK(la - lb > 0.1 - 1e-12);
  CHECK(la - lb < 0.1 * 4);  // at most N_r: every pick on one expert with all of its affinity
  // Each sequence alone gives the same per-sequence loss: the batch's is their mean.
  double sum = 0;
  a.reserve(1, seq);
  b.reserve(1, seq);
  for (index_t s = 0; s < batch; ++s) {
    const std::vector<token_t> ts(tokens.begin() + s * seq, tokens.begin() + (s + 1) * seq),
        gs(targets.begin() + s * seq, targets.begin() + (s + 1) * seq);
    sum += a.forward(ts, gs, 1, seq) - b.forward(ts, gs, 1, seq);
  }
  CHECK(la - lb == Approx(sum / double(batch)).epsilon(1e-9));
}

TEST_CASE("DeepSeekMoE: shared experts run for every token, the bias only selects", "[deepseek]") {
  using E = typename first_of<typename Small::core::executors>::type;
  auto m = Small::make<cpu::Backend<double>>(1);
  randomise(m, 2, 0.5);
  std::vector<double> base_grads;
  const double base = loss_and_grads(m, base_grads);
  // Every token's first pick is shared expert 0, weight 1; the other two are routed experts 1..4.
  std::vector<token_t> picks(std::size_t(12 * 3));
  for (int h = 0; h < 2; ++h) {
    E::read_picks(m.backend(), m.workspace_data(), std::get<0>(m.plan().parts), h, 0, 12, std::span(picks));
    for (std::size_t r = 0; r < 12; ++r) {
      CHECK(picks[r * 3] == 0);
      CHECK(picks[r * 3 + 1] >= 1);
      CHECK(picks[r * 3 + 2] >= 1);
    }
  }
  // The loads of the routed experts land in the bias's gradient slot: 12 tokens × 2 routed picks per layer.
  for (const char* b : {"h.0.router.bias", "h.1.router.bias"}) {
    const auto loads = tensor(m, b, true);
    CHECK(std::accumulate(loads.begin(), loads.end(), 0.0) == 24.0);
  }
  // A shift of every bias keeps each row's order: the same picks, loss and gradients (the bias never weighs).
  for (const char* b : {"h.0.router.bias", "h.1.router.bias"})
    for (double& v : tensor(m, b)) v += 0.25;
  std::vector<double> shifted_grads;
  CHECK(loss_and_grads(m, shifted_grads) == base);
  CHECK(shifted_grads == base_grads);
  // A bias that favours routed expert 4 in layer 0 gets it picked by every token, with its weight from s alone.
  tensor(m, "h.0.router.bias")[3] = 10.0;
  std::vector<double> g;
  loss_and_grads(m, g);
  E::read_picks(m.backend(), m.workspace_data(), std::get<0>(m.plan().parts), 0, 0, 12, std::span(picks));
  for (std::size_t r = 0; r < 12; ++r) CHECK(picks[r * 3 + 1] == 4);
}

TEST_CASE("DeepSeekMoE: GroupLimited<G, G> is the ungrouped router, update_buffers applies the sign rule",
          "[deepseek]") {
  using Grouped = LM<tiny, DeepSeekMoEStack<2, 1, 4, 2, 2, BalanceCoef<1, 10>, GroupLimited<2, 2>>>;
  static_assert(Grouped::params == Small::params);
  auto a = Small::make<cpu::Backend<double>>(1);
  auto b = Grouped::make<cpu::Backend<double>>(1);
  randomise(a, 2, 0.5);
  std::copy(a.params().begin(), a.params().end(), b.params().begin());
  std::vector<double> ga, gb;
  CHECK(loss_and_grads(a, ga) == loss_and_grads(b, gb));
  CHECK(ga == gb);
  // The sign rule: bias_e += γ·sign(mean load − load_e), γ = 1/1000 by default.
  const auto loads = tensor(a, "h.1.router.bias", true);
  const std::vector<double> before(loads.begin(), loads.end());
  const double mean = std::accumulate(before.begin(), before.end(), 0.0) / double(before.size());
  a.update_buffers();
  const auto bias = tensor(a, "h.1.router.bias");
  for (std::size_t e = 0; e < before.size(); ++e)
    CHECK(bias[e] == 1e-3 * double((mean > before[e]) - (mean < before[e])));
  // BiasBalance<0>: no loads written, no update.
  using Off = LM<tiny, DeepSeekMoEStack<2, 1, 4, 2, 2, BiasBalance<0>>>;
  auto c = Off::make<cpu::Backend<double>>(1);
  randomise(c, 2, 0.5);
  std::vector<double> gc;
  loss_and_grads(c, gc);
  c.update_buffers();
  for (const double v : tensor(c, "h.0.router.bias", true)) CHECK(v == 0.0);
  for (const double v : tensor(c, "h.0.router.bias")) CHECK(v == 0.0);
}

TEST_CASE("DeepSeekMoE: FLOPs executed equal the cost model, the parameters are the dense FFN's", "[deepseek][cost]") {
  using DS = LM<dims, DeepSeekMoEStack<2, 1, 7, 3, 4>>;  // 8 experts of d_ff/4: two dense FFNs' parameters
  using Moe = LM<dims, MoEStack<2, 2, 1>>;
  constexpr index_t d = dims.d_model, f = dims.d_ff;
  // Per layer the experts hold 8 · d_ff/4 = 2 · d_ff hidden units, as MoE's two; the difference: the gate's 7
  // rows and 7 biases against MoE's 2 rows, and 6 more experts' LayerNorm and output bias (3d each).
  static_assert(DS::params - Moe::params == 2 * (7 * d + 7 - 2 * d + 6 * 3 * d));
  // Per token and layer: the gate 2·d·7 against 2·d·2, and K = 4 experts of width d_ff/4 = one dense FFN.
  static_assert(DS::flops_per_token(8) == Moe::flops_per_token(8) - 2 * (2 * d * 2) + 2 * (2 * d * 7));
  static_assert(4 * (4 * d * (f / 4)) == 4 * d * f);
  auto m = DS::make<test::CountingBackend<float>>(1);
  randomise(m, 2, 0.5);
  for (auto [batch, seq] : {std::pair<index_t, index_t>{2, 8}, {1, 5}}) {
    m.reserve(batch, seq);
    const auto tokens = random_tokens(batch * seq, dims.vocab, 3);
    m.backend().flops = 0;
    m.forward(tokens, tokens, batch, seq);
    CHECK(m.backend().flops == DS::forward_flops(batch, seq));  // K experts for every token
    CHECK(m.backend().flops == realised_forward_flops(m));
  }
}

TEST_CASE("DeepSeekMoE decodes incrementally: prefill + step logits equal a full forward (double 1e-12)",
          "[deepseek][decode]") {
  CHECK(test::decode_error<LM<dims, DeepSeekMoEStack<2, 1, 7, 3, 4, GroupLimited<7, 3>>>, double>() < 1e-12);
  CHECK(test::decode_error<LM<dims, DeepSeekMoEStack<2, 2, 6, 2, 4>>, float>() < 1e-5);
}

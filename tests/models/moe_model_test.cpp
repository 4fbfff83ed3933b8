// Mixture-of-Experts semantics: one expert per layer is the dense model; MoE(share) has the dense
// model's FFN parameters; the load-balancing loss and its gradient; grouped dispatch runs only the
// chosen experts and executes exactly the cost model's FLOPs for the realised routing; a token
// routed to SKIP (MoDE integrated) is unchanged by that step; the MoE FFN step over arbitrary rows.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "mom/models/mom_models.hpp"
#include "mom/models/moe_models.hpp"
#include "mom/models/routing_stats.hpp"
#include "mom/mom.hpp"
#include "models/counting_backend.hpp"
#include "models/routed_gradient_check.hpp"

using namespace mom;
using test::random_tokens;
using test::randomise;

namespace {

constexpr Dims dims{.d_model = 16, .heads = 2, .d_ff = 32, .vocab = 23, .context = 8};

template <class Model>
const ParamInfo* find_param(std::string_view name) {
  for (const auto& p : Model::layout)
    if (p.name == name) return &p;
  return nullptr;
}

template <class Instance>
void fill(Instance& m, std::string_view name, double v) {
  const ParamInfo* p = find_param<typename Instance::model_type>(name);
  REQUIRE(p != nullptr);
  std::fill_n(m.params().begin() + p->offset, p->size(), static_cast<typename Instance::scalar>(v));
}

// The executor of a model's first part.
template <class List>
struct first_of;
template <class F, class... R>
struct first_of<TypeList<F, R...>> {
  using type = F;
};
template <class Model>
using first_executor = typename first_of<typename Model::core::executors>::type;

// Step h's picks of the model's first part (a MoE part): n×K class ids.
template <class Instance>
std::vector<token_t> step_picks(Instance& m, int h) {
  using E = first_executor<typename Instance::model_type>;
  std::vector<token_t> out(std::size_t(m.batch() * m.seq() * E::Kp));
  E::read_picks(m.backend(), m.workspace_data(), std::get<0>(m.plan().parts), h, 0, m.batch() * m.seq(),
                std::span(out));
  return out;
}

// The GPT-2 FFN with its rows gathered into a copy first (modules/module.hpp, ReadsRowsInPlace turned off).
template <Dims D>
struct GatheredFfn : modules::FeedForward<D> {
  static constexpr bool reads_rows_in_place = false;
};
template <int N>
using GatheredFamily = FFN<N, GatheredFfn>;

}  // namespace

TEST_CASE("MoE: the experts' LayerNorm reading the routed rows in place equals gathering them first, bit for bit",
          "[moe]") {
  static_assert(ReadsRowsInPlaceOn<modules::FeedForward<dims>, cpu::Backend<double>> &&
                !ReadsRowsInPlace<GatheredFfn<dims>>);
  using InPlace = LM<dims, MoEStack<2, 4, 2>>;
  using Gathered =
      LM<dims, Assembly<Router<TopK<Softmax>>, ModuleSet<MHA<2>, Experts<GatheredFamily, 4, PerStep>>, K<2>, H<2>, phi::MoE>>;
  static_assert(InPlace::params == Gathered::params);
  auto a = InPlace::make<cpu::Backend<double>>(1);
  auto b = Gathered::make<cpu::Backend<double>>(1);
  randomise(a, 41, 0.4);
  std::copy(a.params().begin(), a.params().end(), b.params().begin());
  const index_t batch = 3, seq = 8;
  a.reserve(batch, seq);
  b.reserve(batch, seq);
  const auto tokens = random_tokens(batch * seq, dims.vocab, 42);
  const auto targets = random_tokens(batch * seq, dims.vocab, 43);
  CHECK(a.forward(tokens, targets, batch, seq) == b.forward(tokens, targets, batch, seq));
  for (index_t i = 0; i < batch * seq * dims.vocab; ++i) REQUIRE(a.logits().data[i] == b.logits().data[i]);
  a.backward();
  b.backward();
  for (std::size_t j = 0; j < a.grads().size(); ++j) REQUIRE(a.grads()[j] == b.grads()[j]);
}

TEST_CASE("MoE with one expert per layer (E = 1, K = 1) computes the dense model", "[moe]") {
  using Dense4 = LM<dims, Dense<4>>;
  using MoE4 = LM<dims, MoEStack<4, 1, 1>>;  // default balance coefficient 1/100
  auto dense = Dense4::make<cpu::Backend<double>>(8);
  auto moe = MoE4::make<cpu::Backend<double>>(1);
  // Every dense tensor by name; the FFN of layer i is expert 0 of layer i.
  auto moe_name = [](std::string name) {
    if (name.find(".ln_2.") != std::string::npos || name.find(".mlp.") != std::string::npos)
      name.insert(name.find('.', 2) + 1, "expert.0.");
    return name;
  };
  for (const auto& info : Dense4::layout) {
    const ParamInfo* to = find_param<MoE4>(moe_name(std::string(info.name)));
    REQUIRE(to != nullptr);
    REQUIRE(to->size() == info.size());
    std::copy_n(dense.params().begin() + info.offset, info.size(), moe.params().begin() + to->offset);
  }
  const index_t batch = 3, seq = 8;
  dense.reserve(batch, seq);
  moe.reserve(batch, seq);
  const auto tokens = random_tokens(batch * seq, dims.vocab, 3);
  const auto targets = random_tokens(batch * seq, dims.vocab, 4);
  const double ld = dense.forward(tokens, targets, batch, seq);
  const double lm = moe.forward(tokens, targets, batch, seq);
  // The renormalised weight of the single pick is exactly 1, so the residual stream is the same
  // bit for bit; the loss adds each step's balance loss, coef · 1 · f · P = 1/100.
  for (index_t i = 0; i < batch * seq * dims.vocab; ++i) REQUIRE(moe.logits().data[i] == dense.logits().data[i]);
  CHECK(lm == Approx(ld + 4 * 0.01).epsilon(1e-14));
  dense.backward();
  moe.backward();
  for (const auto& info : Dense4::layout) {
    const ParamInfo* other = find_param<MoE4>(moe_name(std::string(info.name)));
    for (index_t j = 0; j < info.size(); ++j)
      REQUIRE(moe.grads()[std::size_t(other->offset + j)] ==
              Approx(dense.grads()[std::size_t(info.offset + j)]).margin(1e-12));
  }
  // A one-class softmax is constant: the routers get no gradient.
  for (const auto& info : MoE4::layout)
    if (std::string_view(info.name).find("router") != std::string_view::npos)
      for (index_t j = 0; j < info.size(); ++j) REQUIRE(std::abs(moe.grads()[std::size_t(info.offset + j)]) < 1e-14);
}

TEST_CASE("MoE(share) with E = L has the dense model's parameters (and names) plus the routers", "[moe][cost]") {
  constexpr Dims d8{.d_model = 256, .heads = 8, .d_ff = 1024, .vocab = 256, .context = 256};
  using Dense8 = LM<d8, Dense<8>>;
  using Share8 = LM<d8, MoEShareStack<8, 8, 2>>;
  using MoE8 = LM<d8, MoEStack<8, 8, 2>>;
  using MoDE8 = LM<d8, MoDEIntegrated<8, 8, 2>>;
  constexpr index_t d = 256, ffn = modules::FeedForward<d8>::params;
  constexpr index_t router = 2 * d + 8 * d;  // LN_r (2d) + W_r (E × d) per layer
  static_assert(Share8::params == Dense8::params + 8 * router);
  static_assert(MoE8::params == Dense8::params + 8 * 7 * ffn + 8 * router);
  static_assert(MoDE8::params == MoE8::params + 8 * d);  // one more router row (SKIP) per layer
  static_assert(Share8::depth == 8 && MoE8::depth == 8 && MoE8::steps == 8);
  static_assert(MoE8::params == 35'930'624);
  // Every dense tensor exists in MoE(share) under the same name and shape (a dense checkpoint maps).
  for (const auto& p : Dense8::layout) {
    const ParamInfo* q = find_param<Share8>(p.name);
    REQUIRE(q != nullptr);
    CHECK((q->rows == p.rows && q->cols == p.cols));
  }
  // Worst-case FLOPs: the dense model's attention, K = 2 experts and a router per layer.
  constexpr index_t S = 256;
  static_assert(MoE8::flops_per_token(S) == Dense8::flops_per_token(S) + 8 * (4 * d * 1024 + 2 * d * 8));
  static_assert(Share8::flops_per_token(S) == MoE8::flops_per_token(S));
  static_assert(MoE8::backward_flops_per_token(S) == Dense8::backward_flops_per_token(S) + 8 * (8 * d * 1024 + 4 * d * 8));
  static_assert(MoDE8::flops_per_token(S) == Dense8::flops_per_token(S) + 8 * (4 * d * 1024 + 2 * d * 9));
  // Top-1 over 8 experts: the dense model's FLOPs plus the routers.
  static_assert(LM<d8, MoEStack<8, 8, 1>>::flops_per_token(S) == Dense8::flops_per_token(S) + 8 * 2 * d * 8);
  CHECK(describe<MoE8>().find("ModuleSet<MHA<8>, Experts<FFN, 8, PerStep>>, K<2>, H<8>, phi::MoE>") != std::string::npos);
  // MoE(share) with 16 experts over 6 layers is 6 layers deep (not the 16 names its expert pool occupies).
  using Share6x16 = LM<d8, MoEShareStack<6, 16, 2>>;
  static_assert(Share6x16::depth == 16);  // layer names h.0 .. h.15: the experts are stored under them
  CHECK(describe<Share6x16>().find("phi::MoE>: depth 6, 6 steps") != std::string::npos);
  CHECK(describe<MoE8>().find("phi::MoE>: depth 8, 8 steps") != std::string::npos);
}

TEST_CASE("MoE: the load-balancing loss is Switch's coef · C · Σ f_e P_e per step, and its gradient is exact",
          "[moe]") {
  using With = LM<dims, MoEStack<2, 4, 2, Router<TopK<Softmax>, BalanceCoef<1, 10>>>>;
  using Without = LM<dims, MoEStack<2, 4, 2, Router<TopK<Softmax>, BalanceCoef<0>>>>;
    auto a = With::make<cpu::Backend<double>>(2);
  auto b = Without::make<cpu::Backend<double>>(2);
  randomise(a, 5, 0.3);
  std::copy(a.params().begin(), a.params().end(), b.params().begin());
  const index_t batch = 2, seq = 6, n = batch * seq;
  a.reserve(batch, seq);
  b.reserve(batch, seq);
  const auto tokens = random_tokens(n, dims.vocab, 6);
  const double la = a.forward(tokens, tokens, batch, seq);
  const double lb = b.forward(tokens, tokens, batch, seq);
  // The aux loss from the workspace's probabilities and the picks, on the host.
  double aux = 0;
  for (int h = 0; h < 2; ++h) {
    const auto picks = step_picks(a, h);
    const double* probs = a.workspace_data() + std::get<0>(a.plan().parts).step[h].gate.sel.probs;
    double s = 0;
    for (int e = 0; e < 4; ++e) {
      const double f = double(std::count(picks.begin(), picks.end(), e)) / double(n * 2);
      double P = 0;
      for (index_t t = 0; t < n; ++t) P += probs[t * 4 + e];
      s += f * P / double(n);
    }
    aux += 0.1 * 4 * s;
  }
  CHECK(aux > 0.1);  // = coef when perfectly balanced, more otherwise
  CHECK(la - lb == Approx(aux).epsilon(1e-12));
  a.backward();
  b.backward();
  // d aux / dθ = the difference of the two gradients; check it against finite differences of
  // (loss with - loss without) for the routers, the attention feeding them and the last experts
  // (which the balance loss cannot reach: exactly 0).
  const auto picks0 = test::all_picks(a);
  const double eps = 1e-6;
  int checked = 0;
  for (const auto& info : With::layout) {
    const std::string_view name = info.name;
    const bool wanted = name.find("router") != std::string_view::npos || name == "h.0.attn.w_qkv" ||
                        name == "h.1.expert.3.mlp.w_fc";
    if (!wanted) continue;
    for (index_t j = 0; j < std::min<index_t>(info.size(), 40); ++j) {
      const std::size_t at = std::size_t(info.offset + j);
      auto aux_at = [&](double v) {
        a.params()[at] = v;
        b.params()[at] = v;
        const double d = a.forward(tokens, tokens, batch, seq) - b.forward(tokens, tokens, batch, seq);
        REQUIRE(test::all_picks(a) == picks0);  // no routing decision flipped
        return d;
      };
      const double saved = a.params()[at];
      const double fd = (aux_at(saved + eps) - aux_at(saved - eps)) / (2 * eps);
      aux_at(saved);
      const double g = a.grads()[at] - b.grads()[at];
      if (name == "h.1.expert.3.mlp.w_fc") REQUIRE(g == 0.0);
      REQUIRE(g == Approx(fd).margin(1e-8));
      ++checked;
    }
  }
  CHECK(checked > 100);
  // And the router weights do get a balance-loss gradient.
  const ParamInfo* w = find_param<With>("h.0.router.w");
  double most = 0;
  for (index_t j = 0; j < w->size(); ++j)
    most = std::max(most, std::abs(a.grads()[std::size_t(w->offset + j)] - b.grads()[std::size_t(w->offset + j)]));
  CHECK(most > 1e-4);
}

TEST_CASE("MoE: grouped dispatch runs only the chosen experts, one GEMM pair each", "[moe][cost]") {
  using Model = LM<dims, MoEStack<2, 4, 2>>;
  auto m = Model::make<test::CountingBackend<float>>(3);
  randomise(m, 4, 0.3);
  // Layer 0's router: W = 0 gives equal logits, and ties go to the lower index: every token picks
  // experts 0 and 1 of layer 0; experts 2 and 3 are chosen by no token.
  fill(m, "h.0.router.w", 0.0);
  const index_t batch = 2, seq = 8;
  m.reserve(batch, seq);
  const auto tokens = random_tokens(batch * seq, dims.vocab, 9);
  m.backend().weights.clear();
  m.forward(tokens, tokens, batch, seq);
  auto uses = [&](const char* name) {
    const float* w = m.params().data() + find_param<Model>(name)->offset;
    return std::count(m.backend().weights.begin(), m.backend().weights.end(), w);
  };
  CHECK(uses("h.0.expert.0.mlp.w_fc") == 1);
  CHECK(uses("h.0.expert.1.mlp.w_proj") == 1);
  CHECK(uses("h.0.expert.2.mlp.w_fc") == 0);
  CHECK(uses("h.0.expert.3.mlp.w_fc") == 0);
  CHECK(uses("h.0.expert.3.mlp.w_proj") == 0);
  const auto picks = step_picks(m, 0);
  for (std::size_t i = 0; i < picks.size(); ++i) REQUIRE(picks[i] == token_t(i % 2));
  // Layer 1 (random router) uses at most one GEMM pair per expert.
  for (int e = 0; e < 4; ++e) CHECK(uses(("h.1.expert." + std::to_string(e) + ".mlp.w_fc").c_str()) <= 1);
  // The executed FLOPs are the cost model's for this routing; unchosen experts get no gradient.
  CHECK(m.backend().flops == realised_forward_flops(m));
  m.backward();
  for (const char* t : {"h.0.expert.2.mlp.w_fc", "h.0.expert.3.ln_2.w", "h.0.expert.3.mlp.b_proj"}) {
    const ParamInfo* p = find_param<Model>(t);
    CHECK(std::all_of(m.grads().begin() + p->offset, m.grads().begin() + p->offset + p->size(),
                      [](float g) { return g == 0.0f; }));
  }
}

TEST_CASE("MoE / MoE(share) / MoDE: FLOPs executed equal the cost model for the realised routing", "[moe][cost]") {
  auto check = [&]<class Model>(Model*, bool skip) {
    auto m = Model::template make<test::CountingBackend<float>>(1);
    randomise(m, 2, 0.5);
    for (auto [batch, seq] : {std::pair<index_t, index_t>{2, 8}, {3, 5}, {1, 1}}) {
      m.reserve(batch, seq);
      const auto tokens = random_tokens(batch * seq, dims.vocab, 3);
      m.backend().flops = 0;
      m.forward(tokens, tokens, batch, seq);
      INFO(describe<Model>() << " batch " << batch << " seq " << seq);
      CHECK(m.backend().flops == realised_forward_flops(m));
      CHECK(m.backend().flops <= Model::forward_flops(batch, seq));
      if (skip && batch * seq > 4) CHECK(m.backend().flops < Model::forward_flops(batch, seq));  // SKIP saved work
      if (!skip) CHECK(m.backend().flops == Model::forward_flops(batch, seq));  // K experts for every token
    }
  };
  check(static_cast<LM<dims, Chunked<Layer, MoEStack<2, 4, 2>>>*>(nullptr), false);
  check(static_cast<LM<dims, MoEShareStack<3, 4, 2>>*>(nullptr), false);
  check(static_cast<LM<dims, MoDEIntegrated<2, 3, 2>>*>(nullptr), true);
}

TEST_CASE("MoDE integrated: a token routed only to SKIP is unchanged by that FFN step", "[moe]") {
  using Model = LM<dims, MoDEIntegrated<2, 2, 1>>;  // top-1 over 2 experts + SKIP
  using E = first_executor<Model>;
  auto m = Model::make<cpu::Backend<double>>(1);
  randomise(m, 12, 0.5);
  // Random weights route most tokens to the same expert (their residual streams share a large
  // common component); SKIP's row = expert 0's row + noise splits those tokens between the two.
  std::mt19937_64 rng(14);
  std::normal_distribution<double> noise(0.0, 1.0);
  for (const char* w : {"h.0.router.w", "h.1.router.w"}) {
    double* row = m.params().data() + find_param<Model>(w)->offset;
    for (index_t c = 0; c < dims.d_model; ++c) row[2 * dims.d_model + c] = row[c] + noise(rng);
  }
  const index_t batch = 2, seq = 8, n = batch * seq, d = dims.d_model;
  m.reserve(batch, seq);
  const auto tokens = random_tokens(n, dims.vocab, 13);
  m.forward(tokens, tokens, batch, seq);
  const auto& plan = std::get<0>(m.plan().parts);
  int skipped = 0, computed = 0;
  for (int h = 0; h < 2; ++h) {
    const auto picks = step_picks(m, h);
    const double* u = m.workspace_data() + plan.u[h];
    const double* x = m.workspace_data() + plan.x_next[h];
    for (index_t t = 0; t < n; ++t) {
      const bool same = std::equal(u + t * d, u + t * d + d, x + t * d);
      if (picks[std::size_t(t)] == E::Step::experts) {
        ++skipped;
        REQUIRE(same);  // bit for bit: SKIP's group is never touched
      } else {
        ++computed;
        REQUIRE(!same);
      }
    }
  }
  INFO("skipped " << skipped << ", computed " << computed);
  CHECK(skipped >= 3);
  CHECK(computed >= 3);
  // The routing statistics see SKIP as the last class.
  RoutingStats stats;
  stats.accumulate(m);
  REQUIRE(stats.routers.size() == 1);
  CHECK(stats.routers[0].skip);
  CHECK(stats.routers[0].classes == 3);
  long long skip_uses = 0;
  for (int h = 0; h < 2; ++h) skip_uses += stats.routers[0].usage[std::size_t(h * 3 + 2)];
  CHECK(skip_uses == skipped);
}

TEST_CASE("MoEStep over arbitrary rows: a packed subset of tokens gives the same rows as the full step", "[moe]") {
  using Model = LM<dims, MoDEIntegrated<2, 3, 2>>;
  using E = first_executor<Model>;
  using Step = E::Step;
  auto m = Model::make<cpu::Backend<double>>(1);
  randomise(m, 21, 0.4);
  const index_t batch = 2, seq = 8, n = batch * seq, d = dims.d_model;
  m.reserve(batch, seq);
  const auto tokens = random_tokens(n, dims.vocab, 22);
  m.forward(tokens, tokens, batch, seq);
  const auto& plan = std::get<0>(m.plan().parts);
  // Rows 1, 4, 5, 11, 14 of step 1's input u_1, packed, through the step on their own.
  const std::vector<index_t> rows = {1, 4, 5, 11, 14};
  const index_t r = index_t(rows.size());
  Arena arena;
  const Step::Plan sp = Step::plan(arena, r);
  const index_t in_at = arena.take(r * d), out_at = arena.take(r * d);
  std::vector<double> ws(std::size_t(arena.used));
  const double* u = m.workspace_data() + plan.u[1];
  for (index_t i = 0; i < r; ++i) std::copy_n(u + rows[std::size_t(i)] * d, d, ws.data() + in_at + i * d);
  cpu::Backend<double> be;
  const index_t p_part = Model::core::part_offset[0];
  Step::forward(be, m.params().data() + p_part, E::router_offset(1), E::experts_of[1], ws.data(), sp,
                MatrixView<const double>{ws.data() + in_at, r, d}, MatrixView<double>{ws.data() + out_at, r, d});
  const double* full = m.workspace_data() + plan.x_next[1];
  for (index_t i = 0; i < r; ++i)
    for (index_t c = 0; c < d; ++c)
      REQUIRE(ws[std::size_t(out_at + i * d + c)] == Approx(full[rows[std::size_t(i)] * d + c]).margin(1e-14));
}

#pragma once
// Whole-model central finite differences in double, shared by the model tests:
//   check_central_differences: the loop itself (every parameter ± eps against backward's gradient,
//     perturbations that change a routing decision counted as flips and skipped), used by the
//     dense, sharing, depth-routing and MoDE tests and by
//   gradient_check: the check for models whose routed parts ReportsRouting (MoM chunks, MoE parts),
//     with the routing fixed; the router tensors (names containing "router") must receive gradient.
//     Used by tests/models/mom_gradient_test.cpp and tests/models/moe_gradient_test.cpp.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "mom/mom.hpp"
#include "models/random_tokens.hpp"

namespace mom::test {

// Every router pick of the last forward, all routed parts and steps.
template <class Instance>
std::vector<token_t> all_picks(Instance& m) {
  using Model = typename Instance::model_type;
  std::vector<token_t> out, buf;
  const index_t n = m.batch() * m.seq();
  [&]<class... Es, std::size_t... is>(TypeList<Es...>, std::index_sequence<is...>) {
    ([&] {
      if constexpr (ReportsRouting<Es>) {
        for (int h = 0; h < Es::routing_info(0).steps; ++h)
          for (int router = 0; router < Es::routing_routers; ++router) {
            buf.resize(std::size_t(n * Es::routing_info(router).k));
            Es::read_picks(m.backend(), m.workspace_data(), std::get<is>(m.plan().parts), h, router, n, std::span(buf));
            out.insert(out.end(), buf.begin(), buf.end());
          }
      }
    }(), ...);
  }(typename Model::core::executors{}, std::make_index_sequence<Model::core::executors::size>{});
  return out;
}

// What a whole-model gradient check compares against: O(1) parameters, N(0, sd²) from seed + 10 (the
// GPT-2 init's tiny values would hide paths), batch 2 × seq tokens and targets from seed + 1 / seed + 2
// (target 3 ignored), and backward's gradient of one forward.
struct GradientCase {
  index_t batch = 2, seq = 0;
  std::vector<token_t> tokens, targets;
  std::vector<double> grad;
  template <class Instance>
  double forward(Instance& m) const {
    return double(m.forward(tokens, targets, batch, seq));
  }
};
template <class Instance>
GradientCase gradient_case(Instance& m, std::uint64_t seed, index_t seq, double sd = 0.35) {
  constexpr Dims dims = Instance::model_type::dims;
  GradientCase c;
  c.seq = seq;
  randomise(m, seed + 10, sd);
  m.reserve(c.batch, seq);
  c.tokens = random_tokens(c.batch * seq, dims.vocab, seed + 1);
  c.targets = random_tokens(c.batch * seq, dims.vocab, seed + 2);
  c.targets[3] = -1;
  m.zero_grad();
  const double loss = c.forward(m);
  m.backward();
  c.grad.assign(m.grads().begin(), m.grads().end());
  REQUIRE(std::isfinite(loss));
  return c;
}

// Compared entries and the perturbations skipped because a routing decision flipped.
struct FdTally {
  int checked = 0, flipped = 0;
};

// Central differences of objective(info) (the loss whose gradient `grad` is, for the last forward)
// over every parameter of m. An entry whose ±eps perturbation changes routing() (a top-K or
// selection decision: the loss is not differentiable across it) is counted as a flip and skipped;
// every other one must agree with grad within 1e-8 + 1e-6·|fd|, and on_checked(info, fd, g) sees it
// (for the caller's own maxima). routing() is read once first, for the routing of the last forward.
template <class Instance, class Objective, class Routing, class OnChecked>
FdTally check_central_differences(Instance& m, const std::vector<double>& grad, double eps, Objective&& objective,
                                  Routing&& routing, OnChecked&& on_checked) {
  using Model = typename Instance::model_type;
  const auto fixed = routing();
  FdTally tally;
  for (const auto& info : Model::layout) {
    if (!info.trainable) continue;  // a buffer (TensorSpec::trainable): its gradient is 0 by definition
    for (index_t j = 0; j < info.size(); ++j) {
      double& p = m.params()[static_cast<std::size_t>(info.offset + j)];
      const double saved = p;
      p = saved + eps;
      const double up = objective(info);
      const bool same_up = routing() == fixed;
      p = saved - eps;
      const double down = objective(info);
      const bool same_down = routing() == fixed;
      p = saved;
      if (!same_up || !same_down) {
        ++tally.flipped;
        continue;
      }
      ++tally.checked;
      const double fd = (up - down) / (2 * eps), g = grad[static_cast<std::size_t>(info.offset + j)];
      on_checked(info, fd, g);
      if (std::abs(fd - g) > 1e-8 + 1e-6 * std::abs(fd))
        FAIL_CHECK(std::string(info.name) << "[" << j << "]: backward " << g << " vs finite difference " << fd);
    }
  }
  return tally;
}
// The routing() of a model without routing decisions: every entry is compared.
inline int no_routing() { return 0; }

// One module's dense forward on cpu::Backend<double> over B sequences of T rows of x (parameters p):
// its output and, for a ModuleWithAuxLoss, its auxiliary loss (the tests' naive references compare both).
struct ModuleRun {
  std::vector<double> out;
  double aux = 0;
};
template <class M>
ModuleRun run_module(const std::vector<double>& p, const std::vector<double>& x, index_t B, index_t T) {
  const index_t n = B * T, d = M::d;
  Arena a;
  const auto s = M::plan(a, B, T);
  std::vector<double> ws(std::size_t(a.used));
  ModuleRun r;
  r.out.resize(std::size_t(n * d));
  cpu::Backend<double> be;
  M::forward(be, p.data(), ws.data(), s, MatrixView<const double>{x.data(), n, d}, MatrixView<double>{r.out.data(), n, d},
             B, T);
  if constexpr (ModuleWithAuxLoss<M>) r.aux = ws[std::size_t(s.aux)];
  return r;
}

// The whole-model check for a model whose routing decisions routing() reads (modules that route inside
// themselves: σ-MoE, SwitchHead): at most 1% flips, more than min_checked entries compared, and the
// tensors whose names contain `receiving` get gradient.
template <class Instance, class Routing>
void check_with_routing(Instance& m, const GradientCase& c, Routing&& routing, std::string_view receiving,
                        int min_checked) {
  double max_grad = 0;
  const FdTally t = check_central_differences(
      m, c.grad, 1e-6, [&](const auto&) { return c.forward(m); }, routing, [&](const auto& info, double, double g) {
        if (std::string_view(info.name).find(receiving) != std::string_view::npos) max_grad = std::max(max_grad, std::abs(g));
      });
  INFO("checked " << t.checked << ", flipped " << t.flipped << ", max |gradient| of " << receiving << " " << max_grad);
  CHECK(t.flipped <= t.checked / 100);
  CHECK(t.checked > min_checked);
  CHECK(max_grad > 1e-3);
}

template <class Model>
void gradient_check(std::uint64_t seed, int min_classes_used) {
  auto m = Model::template make<cpu::Backend<double>>(seed);
  const GradientCase c = gradient_case(m, seed, 5);
  // The routing is not degenerate: several modules (and SKIP, when in the set) are picked.
  std::vector<int> used(17, 0);
  for (token_t k : all_picks(m)) used[std::size_t(k)] = 1;
  CHECK(std::count(used.begin(), used.end(), 1) >= min_classes_used);

  double max_err = 0, max_router_grad = 0;
  const FdTally t = check_central_differences(
      m, c.grad, 1e-6, [&](const auto&) { return c.forward(m); }, [&] { return all_picks(m); },
      [&](const auto& info, double fd, double g) {
        max_err = std::max(max_err, std::abs(fd - g) / (1e-6 + std::abs(fd)));
        if (std::string_view(info.name).find("router") != std::string_view::npos)
          max_router_grad = std::max(max_router_grad, std::abs(g));
      });
  INFO("checked " << t.checked << ", flipped " << t.flipped << ", max rel err " << max_err);
  CHECK(t.flipped <= t.checked / 200);
  CHECK(max_router_grad > 1e-3);  // the routers do receive gradient
}

}  // namespace mom::test

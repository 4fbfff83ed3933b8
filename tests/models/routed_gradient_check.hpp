#pragma once
// Whole-model central finite differences in double, shared by the model tests: the kit's checks
// (mom/testing/gradient_check.hpp) with their reports turned into Catch2 checks:
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
#include "mom/testing/gradient_check.hpp"
#include "models/random_tokens.hpp"

namespace mom::test {

using testing::all_picks;
using testing::GradientCase;
using testing::no_routing;

// The kit's gradient_case, whose loss must be finite.
template <class Instance>
GradientCase gradient_case(Instance& m, std::uint64_t seed, index_t seq, double sd = 0.35) {
  GradientCase c = testing::gradient_case(m, seed, seq, sd);
  REQUIRE(std::isfinite(c.loss));
  return c;
}

// Compared entries and the perturbations skipped because a routing decision flipped.
struct FdTally {
  int checked = 0, flipped = 0;
};

// The kit's check_central_differences (mom/testing/gradient_check.hpp), every mismatch a failed Catch2 check.
template <class Instance, class Objective, class Routing, class OnChecked>
FdTally check_central_differences(Instance& m, const std::vector<double>& grad, double eps, Objective&& objective,
                                  Routing&& routing, OnChecked&& on_checked) {
  const testing::GradientReport r = testing::check_central_differences(
      m, grad, eps, std::forward<Objective>(objective), std::forward<Routing>(routing), std::forward<OnChecked>(on_checked));
  for (const testing::Mismatch& e : r.mismatches)
    FAIL_CHECK(e.tensor << "[" << e.index << "]: backward " << e.backward << " vs finite difference " << e.finite_difference);
  if (r.mismatch_count > int(r.mismatches.size())) FAIL_CHECK(r.mismatch_count << " mismatches in all");
  return {r.checked, r.flipped};
}

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

// The kit's whole-model check for a model whose routers are parameters (MoM chunks, MoE parts): at most 0.5% flips,
// at least min_classes_used classes picked, and the router tensors receive gradient.
template <class Model>
void gradient_check(std::uint64_t seed, int min_classes_used) {
  const testing::ModelGradientReport r = testing::gradient_check<Model>(seed);
  INFO(r.summary());
  CHECK(r.ok(0.005));
  CHECK(r.classes_used >= min_classes_used);
  CHECK(r.max_router_grad > 1e-3);  // the routers do receive gradient
}

}  // namespace mom::test

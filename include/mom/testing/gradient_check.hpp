#pragma once
// Whole-model central differences in double (mom/testing.hpp): every trainable parameter is moved by ±eps,
// the loss is recomputed, and (L(p + eps) − L(p − eps)) / 2eps is compared with backward's gradient. For a
// routed model the routing is held fixed: a perturbation that changes any routing decision (a router's top-K,
// a MoD selection, a σ-MoE expert choice) crosses a point where the loss is not differentiable, so it is
// counted as a flip and skipped. The result is a report, not an assertion, so that any test framework can
// check it:
//
//   using Model = mom::LM<dims, MyArchitecture>;
//   const auto r = mom::testing::gradient_check<Model>(/*seed*/ 11);
//   if (!r.ok()) std::puts(r.summary().c_str());        // CHECK(r.ok()) in Catch2, EXPECT_TRUE in GoogleTest
//
// Shapes: use a tiny model (d_model 8, vocab ~11, context ~6): every parameter is perturbed twice, and each
// perturbation is a forward of 2 × seq tokens.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mom/backend/cpu.hpp"
#include "mom/models/lm.hpp"
#include "mom/testing/random.hpp"

namespace mom::testing {

// Every routing decision of the last forward: the picks of every executor that ReportsRouting (MoM's routers,
// MoE's gates, MoD's selections, the executors that run a module routing inside itself), all steps and routers.
// Empty for a model without routing decisions.
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

// What a whole-model check compares against: O(1) parameters, N(0, sd²) from seed + 10 (a GPT-2 initialisation's
// tiny values would hide paths), batch 2 × seq tokens and targets from seed + 1 / seed + 2 (target 3 ignored, so
// the ignore index is exercised), and backward's gradient of one forward.
struct GradientCase {
  index_t batch = 2, seq = 0;
  std::vector<token_t> tokens, targets;
  std::vector<double> grad;
  double loss = 0;
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
  c.loss = c.forward(m);
  m.backward();
  c.grad.assign(m.grads().begin(), m.grads().end());
  return c;
}

// One entry whose finite difference and backward's gradient disagree.
struct Mismatch {
  std::string tensor;  // the tensor's name (or "input" in a module check)
  index_t index = 0;   // element within it
  double backward = 0, finite_difference = 0;
};

// The outcome of a central-difference check. An entry agrees when |fd − g| <= abs_tol + rel_tol·|fd|.
struct GradientReport {
  int checked = 0;         // entries compared
  int flipped = 0;         // perturbations skipped because a routing decision changed
  int mismatch_count = 0;  // entries outside the tolerance (the first 20 are in `mismatches`)
  double max_rel_err = 0;  // max |fd − g| / (1e-6 + |fd|) over the compared entries
  double abs_tol = 1e-8, rel_tol = 1e-6;
  bool finite = true;      // the unperturbed loss was finite
  std::vector<Mismatch> mismatches;

  // Every compared entry agrees, something was compared, and at most max_flip_fraction of the perturbations
  // changed the routing (many flips mean the check saw little of the model: lower eps or change the seed).
  bool ok(double max_flip_fraction = 0.01) const {
    return finite && checked > 0 && mismatch_count == 0 && flipped <= max_flip_fraction * checked;
  }
  std::string summary() const {
    std::ostringstream s;
    s << "checked " << checked << ", flipped " << flipped << ", mismatches " << mismatch_count << ", max rel err "
      << max_rel_err << (finite ? "" : ", loss not finite");
    for (const Mismatch& e : mismatches)
      s << "\n  " << e.tensor << "[" << e.index << "]: backward " << e.backward << " vs finite difference "
        << e.finite_difference;
    return s.str();
  }
  void compare(std::string_view tensor, index_t index, double fd, double g) {
    ++checked;
    max_rel_err = std::max(max_rel_err, std::abs(fd - g) / (1e-6 + std::abs(fd)));
    if (std::abs(fd - g) <= abs_tol + rel_tol * std::abs(fd)) return;
    if (mismatch_count++ < 20) mismatches.push_back({std::string(tensor), index, g, fd});
  }
};

// The routing of a model without routing decisions: every entry is compared.
inline int no_routing() { return 0; }

// One central difference: (L(v + eps) − L(v − eps)) / 2eps with v restored after, or nothing when routing()
// after either perturbation differs from `fixed` (a flip: the loss is not differentiable across it).
// check_central_differences and module_gradient_check both step through it.
template <class V, class Objective, class Routing, class Fixed>
std::optional<double> central_difference(V& v, double eps, Objective&& objective, Routing&& routing,
                                         const Fixed& fixed) {
  const V saved = v;
  v = saved + eps;
  const double up = objective();
  const bool same_up = routing() == fixed;
  v = saved - eps;
  const double down = objective();
  const bool same_down = routing() == fixed;
  v = saved;
  if (!same_up || !same_down) return std::nullopt;
  return (up - down) / (2 * eps);
}

// Central differences of objective(info) (the loss whose gradient `grad` is, for the last forward) over every
// trainable parameter of m. routing() is read once first (the routing of the last forward); a perturbation after
// which it differs is a flip. on_checked(info, fd, g) sees every compared entry (for the caller's own maxima).
template <class Instance, class Objective, class Routing, class OnChecked>
GradientReport check_central_differences(Instance& m, const std::vector<double>& grad, double eps, Objective&& objective,
                                         Routing&& routing, OnChecked&& on_checked) {
  using Model = typename Instance::model_type;
  const auto fixed = routing();
  GradientReport r;
  for (const auto& info : Model::layout) {
    if (!info.trainable) continue;  // a buffer: its gradient is 0 by definition
    for (index_t j = 0; j < info.size(); ++j) {
      const std::optional<double> fd = central_difference(
          m.params()[static_cast<std::size_t>(info.offset + j)], eps, [&] { return objective(info); }, routing, fixed);
      if (!fd) {
        ++r.flipped;
        continue;
      }
      const double g = grad[static_cast<std::size_t>(info.offset + j)];
      on_checked(info, *fd, g);
      r.compare(info.name, j, *fd, g);
    }
  }
  return r;
}

// The whole-model check's report, with what a routed model adds.
struct ModelGradientReport : GradientReport {
  double loss = 0;             // the unperturbed loss
  int classes_used = 0;        // distinct classes the routing picked (a degenerate routing picks one)
  double max_router_grad = 0;  // max |gradient| of the tensors whose names contain "router"
};

// The whole-model check of Model on cpu::Backend<double>: gradient_case(seed, seq), then central differences
// with the routing held fixed (all_picks). For a routed model also assert that r.classes_used is above 1 and,
// where the model has router tensors, that r.max_router_grad > 1e-3 (the routers do receive gradient).
template <class Model>
ModelGradientReport gradient_check(std::uint64_t seed, index_t seq = 5, double eps = 1e-6) {
  auto m = Model::template make<cpu::Backend<double>>(seed);
  const GradientCase c = gradient_case(m, seed, seq);
  ModelGradientReport r;
  r.loss = c.loss;
  if (!std::isfinite(c.loss)) {
    r.finite = false;
    return r;
  }
  const std::vector<token_t> picks = all_picks(m);
  std::vector<token_t> classes(picks);
  std::sort(classes.begin(), classes.end());
  const int used = int(std::unique(classes.begin(), classes.end()) - classes.begin());
  double max_router_grad = 0;
  static_cast<GradientReport&>(r) = check_central_differences(
      m, c.grad, eps, [&](const auto&) { return c.forward(m); }, [&] { return all_picks(m); },
      [&](const auto& info, double, double g) {
        if (std::string_view(info.name).find("router") != std::string_view::npos)
          max_router_grad = std::max(max_router_grad, std::abs(g));
      });
  r.classes_used = used;
  r.max_router_grad = max_router_grad;
  return r;
}

}  // namespace mom::testing

#pragma once
// Whole-model central finite differences in double for models with routed parts (every executor
// that ReportsRouting: MoM chunks, MoE parts), with the routing fixed: every parameter is
// perturbed by ±eps and the difference is compared with backward() only where no top-K decision
// flipped (the test counts flips and requires them rare), and the router tensors (names
// containing "router") must receive gradient. Shared by tests/models/mom_gradient_test.cpp and
// tests/models/moe_gradient_test.cpp.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
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

template <class Model>
void gradient_check(std::uint64_t seed, int min_classes_used) {
  constexpr Dims dims = Model::dims;
  auto m = Model::template make<cpu::Backend<double>>(seed);
  std::mt19937_64 rng(seed + 10);
  std::normal_distribution<double> normal(0.0, 0.35);
  for (auto& p : m.params()) p = normal(rng);
  const index_t batch = 2, seq = 5;
  m.reserve(batch, seq);
  const auto tokens = random_tokens(batch * seq, dims.vocab, seed + 1);
  auto targets = random_tokens(batch * seq, dims.vocab, seed + 2);
  targets[3] = -1;

  m.zero_grad();
  const double loss = m.forward(tokens, targets, batch, seq);
  const auto picks = all_picks(m);
  m.backward();
  const std::vector<double> grad(m.grads().begin(), m.grads().end());
  REQUIRE(std::isfinite(loss));
  // The routing is not degenerate: several modules (and SKIP, when in the set) are picked.
  std::vector<int> used(17, 0);
  for (token_t c : picks) used[std::size_t(c)] = 1;
  CHECK(std::count(used.begin(), used.end(), 1) >= min_classes_used);

  const double eps = 1e-6;
  double max_err = 0, max_router_grad = 0;
  int flipped = 0, checked = 0;
  for (const auto& info : Model::layout) {
    const bool router = std::string_view(info.name).find("router") != std::string_view::npos;
    for (index_t j = 0; j < info.size(); ++j) {
      double& p = m.params()[static_cast<std::size_t>(info.offset + j)];
      const double saved = p;
      p = saved + eps;
      const double up = m.forward(tokens, targets, batch, seq);
      const bool same_up = all_picks(m) == picks;
      p = saved - eps;
      const double down = m.forward(tokens, targets, batch, seq);
      const bool same_down = all_picks(m) == picks;
      p = saved;
      if (!same_up || !same_down) {
        ++flipped;  // a top-K decision changed: the loss is not differentiable across it
        continue;
      }
      ++checked;
      const double fd = (up - down) / (2 * eps);
      const double g = grad[static_cast<std::size_t>(info.offset + j)];
      const double err = std::abs(fd - g);
      max_err = std::max(max_err, err / (1e-6 + std::abs(fd)));
      if (router) max_router_grad = std::max(max_router_grad, std::abs(g));
      if (err > 1e-8 + 1e-6 * std::abs(fd))
        FAIL_CHECK(std::string(info.name) << "[" << j << "]: backward " << g << " vs finite difference " << fd);
    }
  }
  INFO("checked " << checked << ", flipped " << flipped << ", max rel err " << max_err);
  CHECK(flipped <= checked / 200);
  CHECK(max_router_grad > 1e-3);  // the routers do receive gradient
}

}  // namespace mom::test

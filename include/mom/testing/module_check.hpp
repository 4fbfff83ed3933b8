#pragma once
// One module, checked alone (mom/testing.hpp): a single module type M (the library's feed-forward module, a user's
// SwiGLU<D>, ...) on cpu::Backend<double>, with the objective L = Σ f(x) ⊙ R (+ its auxiliary loss), R fixed
// random. Central differences over every trainable parameter and every input entry against backward's g and
// dx, and the workspace and scratch checked for overruns: both are allocated with guard elements on either
// side, filled with a sentinel, and a module that writes outside what plan() / scratch() declared is reported
// (with how far), instead of corrupting a neighbour's activations inside a model.
//
//   const auto r = mom::testing::module_gradient_check<MySwiGLU<dims>>(/*seed*/ 3);
//   CHECK(r.ok());   // r.summary() says what failed
//
// A module that routes inside itself (ModuleWithRouting) has perturbations that change its picks skipped
// (counted as flips), as the whole-model check does.
#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "mom/backend/cpu.hpp"
#include "mom/core/layout.hpp"
#include "mom/modules/module.hpp"
#include "mom/testing/gradient_check.hpp"

namespace mom::testing {

// A buffer with `guard` sentinel elements before and after its `size` usable ones.
template <class T>
struct GuardedBuffer {
  static constexpr index_t guard = 64;
  static constexpr T sentinel = guard_value<T>;  // the workspace guards' (core/layout.hpp): no module computes it
  std::vector<T> data;
  explicit GuardedBuffer(index_t size) : data(std::size_t(size + 2 * guard), sentinel) {}
  T* get() { return data.data() + guard; }
  index_t size() const { return index_t(data.size()) - 2 * guard; }
  // Elements written outside the usable range: the farthest distance before (negative) or after it, 0 if none.
  index_t overrun() const {
    for (index_t i = 0; i < guard; ++i)
      if (data[std::size_t(i)] != sentinel) return -(guard - i);
    for (index_t i = guard - 1; i >= 0; --i)
      if (data[std::size_t(guard + size() + i)] != sentinel) return i + 1;
    return 0;
  }
};

struct ModuleReport : GradientReport {
  index_t workspace_overrun = 0;  // elements written outside plan()'s workspace (negative: before it)
  index_t scratch_overrun = 0;    // elements written outside scratch()'s backward scratch
  bool ok(double max_flip_fraction = 0.01) const {
    return GradientReport::ok(max_flip_fraction) && workspace_overrun == 0 && scratch_overrun == 0;
  }
  std::string summary() const {
    std::ostringstream s;
    s << GradientReport::summary();
    auto overrun = [&](index_t o, const char* who, const char* what) {
      if (o) s << "\n  " << who << " wrote " << (o < 0 ? -o : o) << " element(s) " << (o < 0 ? "before" : "past") << what;
    };
    overrun(workspace_overrun, "forward or backward", " the workspace plan() declared");
    overrun(scratch_overrun, "backward", " the scratch() it declared");
    return s.str();
  }
};

// The check of module M over batch sequences of seq rows.
template <class M>
ModuleReport module_gradient_check(std::uint64_t seed, index_t batch = 2, index_t seq = 3, double eps = 1e-6) {
  static_assert(SequenceMixerOn<M, cpu::Backend<double>> || TokenMixerOn<M, cpu::Backend<double>> ||
                    DenseTokenMixerOn<M, cpu::Backend<double>>,
                "module_gradient_check<M>: M is not a single module with forward / backward members "
                "(modules/module.hpp lists them)");
  using T = double;
  constexpr index_t d = M::d;
  const index_t n = batch * seq;
  cpu::Backend<T> be;
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 0.35);
  auto random = [&](std::vector<T>& v) {
    for (auto& e : v) e = normal(rng);
  };

  // Parameters: every trainable tensor random, buffers zero; names for the report.
  std::vector<T> p(std::size_t(M::params)), x(std::size_t(n * d)), weight(std::size_t(n * d));
  random(p);
  random(x);
  random(weight);
  struct Named {
    std::string name;
    index_t offset, size;
    bool trainable;
  };
  std::vector<Named> tensors;
  {
    index_t at = 0;
    for (const TensorSpec& t : M::tensors(0)) {
      tensors.push_back({std::string(t.suffix), at, t.size(), t.trainable});
      if (!t.trainable) std::fill_n(p.begin() + at, t.size(), T(0));
      at += t.size();
    }
  }

  Arena arena;
  const auto saved = M::plan(arena, batch, seq);
  GuardedBuffer<T> ws(arena.used), sc(M::scratch(batch, seq));
  std::vector<T> out(std::size_t(n * d));
  auto picks = [&] {
    std::vector<token_t> r;
    if constexpr (ModuleWithRouting<M>) {
      r.resize(std::size_t(n * M::routed.k));
      M::read_picks(be, ws.get(), saved, n, std::span(r));
    }
    return r;
  };
  auto loss = [&] {
    M::forward(be, p.data(), ws.get(), saved, MatrixView<const T>{x.data(), n, d}, MatrixView<T>{out.data(), n, d},
               batch, seq);
    double l = 0;
    for (std::size_t i = 0; i < out.size(); ++i) l += out[i] * weight[i];
    if constexpr (ModuleWithAuxLoss<M>) l += double(ws.get()[saved.aux]);
    return l;
  };

  ModuleReport r;
  const double l0 = loss();
  r.finite = std::isfinite(l0);
  std::vector<T> g(p.size(), T(0)), dx(x.size(), T(0));
  M::backward(be, p.data(), g.data(), ws.get(), saved, MatrixView<const T>{x.data(), n, d}, MatrixView<T>{dx.data(), n, d},
              MatrixView<const T>{weight.data(), n, d}, sc.get(), batch, seq);
  r.workspace_overrun = ws.overrun();
  r.scratch_overrun = sc.overrun();
  if (!r.finite) return r;

  const std::vector<token_t> fixed = picks();
  auto central = [&](T& v, const std::string& name, index_t j, double grad) {
    if (const std::optional<double> fd = central_difference(v, eps, loss, picks, fixed)) r.compare(name, j, *fd, grad);
    else ++r.flipped;
  };
  for (const Named& t : tensors)
    if (t.trainable)
      for (index_t j = 0; j < t.size; ++j) central(p[std::size_t(t.offset + j)], t.name, j, g[std::size_t(t.offset + j)]);
  for (index_t j = 0; j < n * d; ++j) central(x[std::size_t(j)], "input", j, dx[std::size_t(j)]);
  if (const index_t o = ws.overrun()) r.workspace_overrun = o;
  return r;
}

}  // namespace mom::testing

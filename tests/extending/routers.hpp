#pragma once
// (c) Two new router policies for phi::MoE's expert steps, defined outside the library. A policy says
// `gates_experts = true` and names its gate, an ExpertGate (routers/gate.hpp); phi::MoE's executor
// (assembly/moe.hpp) then runs it unchanged (docs/extending.md, step 3).
//
//   HashRouting              Roller et al. 2021 (arXiv 2106.04426): the expert is a fixed hash of the
//                            token id, weight 1; no parameters, nothing to learn, no balance loss.
//   ThresholdRouting<p, q>   s = σ(W LN(x)); every expert with s_e > τ = p/q runs with weight s_e (at
//                            least one: the best; at most K<k>), so tokens take a VARIABLE number of
//                            experts. Unused slots get class E (+1 with Skip), which no expert owns.
//
// The decisions are loops over host memory (CPU backends); the products are backend ops.
#include <mom/mom.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string_view>
#include <type_traits>
#include <vector>

namespace ext {

template <class Be>
constexpr void require_host_memory() {
  static_assert(std::is_base_of_v<mom::cpu::Backend<typename Be::scalar>, Be>,
                "ext routers: the routing decision reads host memory: use a CPU backend");
}

// ---- hash routing -------------------------------------------------------------------------------
template <mom::Dims D, int E, int K, bool Skip>
struct HashGate {
  using index_t = mom::index_t;
  static constexpr int classes = E + (Skip ? 1 : 0);
  static constexpr index_t params = 0;
  static constexpr std::array<mom::TensorSpec, 0> tensors(index_t) { return {}; }
  static constexpr index_t flops_per_token() { return 0; }
  static constexpr index_t backward_flops_per_token() { return 0; }
  struct Plan {
    mom::dispatch::Selection sel{};
  };
  static constexpr Plan plan(mom::Arena& a, index_t rows) { return {mom::dispatch::plan_selection(a, rows, K, classes)}; }
  static constexpr const mom::dispatch::Selection& selection(const Plan& p) { return p.sel; }
  static constexpr index_t scratch(index_t) { return 0; }

  // A fixed multiplicative hash of the token id (Knuth), into E buckets.
  static int expert_of(mom::token_t id) { return int((std::uint32_t(id) * 2654435761u) >> 7) % E; }

  template <class Be, class T>
  static void forward(Be& be, const T*, T* ws, const Plan& s, mom::MatrixView<const T> in,
                      std::span<const mom::token_t> tokens) {
    require_host_memory<Be>();
    MOM_CHECK(tokens.size() == std::size_t(in.rows), "HashRouting: needs the rows' token ids (phi::MoE)");
    const index_t rows = in.rows;
    mom::token_t* picks = mom::dispatch::toks(ws, s.sel.picks);
    for (index_t r = 0; r < rows; ++r) {
      const int e = expert_of(tokens[std::size_t(r)]);
      for (int c = 0; c < classes; ++c) ws[s.sel.probs + r * classes + c] = T(c == e ? 1 : 0);
      picks[r * K] = mom::token_t(e);
      ws[s.sel.weights + r * K] = T(1);
      for (int j = 1; j < K; ++j) picks[r * K + j] = mom::token_t(E), ws[s.sel.weights + r * K + j] = T(0);
    }
    ws[s.sel.loss] = T(0);
    mom::dispatch::group_picks(be, ws, s.sel, rows, K, classes);
  }
  // Weights are constants: no gradient reaches the input, and there are no parameters.
  template <class Be, class T>
  static void backward(Be&, const T*, T*, const T*, const Plan&, mom::MatrixView<const T>, mom::MatrixView<T>,
                       std::span<const T>, T*) {}
};

struct HashRouting {
  static constexpr bool is_router_policy = true;
  static constexpr bool gates_experts = true;
  static constexpr std::string_view name = "HashRouting";
  template <class Set, int k, int h>
  struct Drives {
    static_assert(k == 1, "ext::HashRouting picks one expert per token: use K<1>");
    static constexpr bool ok = k == 1;
  };
  template <mom::Dims D, int E, int K, bool Skip, class Options>
  using gate = HashGate<D, E, K, Skip>;
};

// ---- threshold routing: a variable number of experts per token ------------------------------------
template <mom::Dims D, int E, int K, bool Skip, long long p, long long q>
struct ThresholdGate {
  using index_t = mom::index_t;
  static constexpr double tau = double(p) / double(q);
  static constexpr int none = E + (Skip ? 1 : 0);  // the class of an unused slot: no expert owns it
  static constexpr int classes = none + 1;
  static constexpr index_t d = D.d_model;
  static constexpr index_t o_ln_w = 0, o_ln_b = d, o_w = 2 * d, params = 2 * d + E * d;
  static constexpr std::array<mom::TensorSpec, 3> tensors(index_t layer) {
    return {{{"router.ln.w", layer, 1, d, mom::Init::One},
             {"router.ln.b", layer, 1, d, mom::Init::Zero},
             {"router.w", layer, E, d, mom::Init::Normal}}};
  }
  static constexpr index_t flops_per_token() { return 2 * d * E; }
  static constexpr index_t backward_flops_per_token() { return 4 * d * E; }
  struct Plan {
    index_t ln = 0, mean = 0, rstd = 0, scores = 0;  // LN(x), stats, σ(W LN(x)) [rows × E]
    mom::dispatch::Selection sel{};
  };
  static constexpr Plan plan(mom::Arena& a, index_t rows) {
    Plan s{};
    s.ln = a.take(rows * d);
    s.mean = a.take(rows);
    s.rstd = a.take(rows);
    s.scores = a.take(rows * E);
    s.sel = mom::dispatch::plan_selection(a, rows, K, classes);
    return s;
  }
  static constexpr const mom::dispatch::Selection& selection(const Plan& s) { return s.sel; }
  // dL/d(slot weight) [rows × K], dL/dlogits [rows × E], dL/dLN [rows × d].
  static constexpr index_t scratch(index_t rows) { return rows * (K + E + d); }

  template <class Be, class T>
  static void forward(Be& be, const T* pr, T* ws, const Plan& s, mom::MatrixView<const T> in,
                      std::span<const mom::token_t>) {
    require_host_memory<Be>();
    const index_t rows = in.rows;
    be.layernorm_forward(mom::MatrixView<T>{ws + s.ln, rows, d}, sp(ws + s.mean, rows), sp(ws + s.rstd, rows), in,
                         sp(pr + o_ln_w, d), sp(pr + o_ln_b, d));
    be.linear_forward(mom::MatrixView<T>{ws + s.scores, rows, E}, mom::MatrixView<const T>{ws + s.ln, rows, d},
                      mom::MatrixView<const T>{pr + o_w, E, d}, std::span<const T>{});
    mom::token_t* picks = mom::dispatch::toks(ws, s.sel.picks);
    std::array<int, E> order{};
    for (index_t r = 0; r < rows; ++r) {
      T* sc = ws + s.scores + r * E;
      for (int e = 0; e < E; ++e) sc[e] = T(1 / (1 + std::exp(-double(sc[e]))));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return sc[a] > sc[b]; });
      for (int c = 0; c < classes; ++c) ws[s.sel.probs + r * classes + c] = c < E ? sc[c] : T(0);
      for (int j = 0; j < K; ++j) {
        const bool take = j < E && (j == 0 || double(sc[order[j]]) > tau);
        picks[r * K + j] = mom::token_t(take ? order[j] : none);
        ws[s.sel.weights + r * K + j] = take ? sc[order[j]] : T(0);
      }
    }
    ws[s.sel.loss] = T(0);
    mom::dispatch::group_picks(be, ws, s.sel, rows, K, classes);
  }

  template <class Be, class T>
  static void backward(Be& be, const T* pr, T* g, const T* ws, const Plan& s, mom::MatrixView<const T> in,
                       mom::MatrixView<T> din, std::span<const T> dwp, T* sc) {
    require_host_memory<Be>();
    const index_t rows = in.rows;
    T *dws = sc, *dlogits = sc + rows * K, *dln = dlogits + rows * E;
    mom::dispatch::slot_grads(be, ws, s.sel, rows, K, dwp, std::span<T>(dws, std::size_t(rows * K)));
    std::fill(dlogits, dlogits + rows * E, T(0));
    const mom::token_t* picks = mom::dispatch::toks(ws, s.sel.picks);
    for (index_t r = 0; r < rows; ++r)
      for (int j = 0; j < K; ++j) {
        const int e = int(picks[r * K + j]);
        if (e >= E) continue;
        const T sg = ws[s.scores + r * E + e];
        dlogits[r * E + e] += dws[r * K + j] * sg * (1 - sg);  // weight = σ(logit)
      }
    std::fill(dln, dln + rows * d, T(0));
    be.linear_backward(mom::MatrixView<T>{dln, rows, d}, mom::MatrixView<T>{g + o_w, E, d}, std::span<T>{},
                       mom::MatrixView<const T>{dlogits, rows, E}, mom::MatrixView<const T>{ws + s.ln, rows, d},
                       mom::MatrixView<const T>{pr + o_w, E, d});
    be.layernorm_backward(din, sp(g + o_ln_w, d), sp(g + o_ln_b, d), mom::MatrixView<const T>{dln, rows, d}, in,
                          sp(ws + s.mean, rows), sp(ws + s.rstd, rows), sp(pr + o_ln_w, d));
  }

 private:
  template <class T>
  static std::span<T> sp(T* at, index_t n) { return {at, std::size_t(n)}; }
};

template <long long p, long long q = 1>
struct ThresholdRouting {
  static constexpr bool is_router_policy = true;
  static constexpr bool gates_experts = true;
  static constexpr std::string_view name = "ThresholdRouting";
  template <class Set, int k, int h>
  struct Drives {
    static_assert(p > 0 && p < q, "ext::ThresholdRouting<p, q>: the threshold p/q must lie in (0, 1)");
    static_assert(k <= Set::ffn_choices, "ext::ThresholdRouting: K<k> (the most experts a token takes) must be <= E");
    static constexpr bool ok = p > 0 && p < q && k <= Set::ffn_choices;
  };
  template <mom::Dims D, int E, int K, bool Skip, class Options>
  using gate = ThresholdGate<D, E, K, Skip, p, q>;
};

}  // namespace ext

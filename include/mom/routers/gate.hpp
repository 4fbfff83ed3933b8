#pragma once
// Expert gates: the per-step router of phi::MoE (paper eq. (11)) as a contract a user's router meets.
//
// A router policy P gates the experts of phi::MoE when it says so (`gates_experts = true`) and gives
//   template <Dims D, int E, int K, bool skip, class Options> using gate = G;
// for E experts per step, K slots per row, SKIP as class E when `skip`, and the Router<P, Options...>
// options. G is an ExpertGate:
//   classes                   router classes C (E, + 1 for SKIP, + any no-op class of its own: a class
//                             >= E is never run, so a gate that picks fewer than K experts for a row
//                             fills the other slots with such a class and weight 0)
//   tensors(layer), params    its parameters, in layout order, named below h.<layer>
//   flops_per_token(), backward_flops_per_token()   per routed row
//   Plan plan(Arena&, rows), scratch(rows), selection(plan) -> dispatch::Selection
//   forward(be, p, ws, plan, in, tokens)
//       fills the selection for rows `in` [rows × d]: probs, picks and weights [rows × K], the groups
//       (dispatch::group_picks) and its auxiliary loss in selection.loss (0 if none). `tokens`: the
//       rows' token ids when the rows are the model's tokens (phi::MoE), empty otherwise.
//   backward(be, p, g, ws, plan, in, din, dwp, scratch)
//       dwp [rows·K]: dL/d(weight) in group order (dispatch::slot_grads unpacks it); accumulates its
//       input gradient into din and its parameter gradients into g.
// Optionally, a gate with buffers that change between optimizer steps (not by gradient descent) gives
//   update_buffers(be, p, g)   p: its parameters (mutable), g: its gradient block as backward left it,
//                              summed over the step's micro-batches (and ranks); called once per optimizer
//                              step through Model::update_buffers (models/runtime.hpp)
// TopK<Softmax> (routers/topk.hpp) is one; TopK<Sigmoid> (routers/topk.hpp, its gate routers/affinity.hpp) another, with
// update_buffers; docs/extending.md writes two more (hash routing and a threshold router with a variable
// number of experts per token).
#include <concepts>
#include <cstddef>
#include <span>
#include <utility>

#include "mom/core/layout.hpp"
#include "mom/core/tensor.hpp"
#include "mom/routers/router.hpp"
#include "mom/routing/select.hpp"

namespace mom {

template <class G>
concept ExpertGate = requires(Arena& a, index_t i, const typename G::Plan& plan) {
  { G::classes } -> std::convertible_to<int>;
  G::tensors(i);
  { G::tensors(i).size() } -> std::convertible_to<std::size_t>;
  { G::params } -> std::convertible_to<index_t>;
  { G::flops_per_token() } -> std::convertible_to<index_t>;
  { G::backward_flops_per_token() } -> std::convertible_to<index_t>;
  { G::plan(a, i) } -> std::same_as<typename G::Plan>;
  { G::scratch(i) } -> std::convertible_to<index_t>;
  { G::selection(plan) } -> std::convertible_to<dispatch::Selection>;
};

// The forward / backward of a gate on backend Be.
template <class G, class Be, class T = typename Be::scalar>
concept ExpertGateOn = ExpertGate<G> && requires(Be& be, const T* p, T* g, T* ws, const typename G::Plan& plan,
                                                 MatrixView<const T> x, MatrixView<T> dx, std::span<const token_t> tok,
                                                 std::span<const T> dwp) {
  G::forward(be, p, ws, plan, x, tok);
  G::backward(be, p, g, ws, plan, x, dx, dwp, g);
};

// The same contract member by member, for the error a user sees (phi::MoE instantiates it for the router's gate):
// each static_assert names one missing member and holds only when the ones before it hold, so one mistake
// gives one line; the gate's type is in the note "In instantiation of VerifyExpertGate<G>".
template <class G>
struct VerifyExpertGate {
  static constexpr bool has_classes = requires { { G::classes } -> std::convertible_to<int>; };
  static_assert(has_classes, "mom::phi::MoE: the router's gate is not a mom::ExpertGate: it has no `static constexpr "
                             "int classes` (routers/gate.hpp lists the members)");
  static constexpr bool has_tensors = has_classes && requires(index_t i) {
    { G::tensors(i).size() } -> std::convertible_to<std::size_t>;
  } && requires { { G::params } -> std::convertible_to<index_t>; };
  static_assert(!has_classes || has_tensors,
                "mom::ExpertGate: missing `static constexpr std::array<TensorSpec, n> tensors(index_t layer)` or "
                "`static constexpr index_t params`");
  static constexpr bool has_cost = has_tensors && requires {
    { G::flops_per_token() } -> std::convertible_to<index_t>;
    { G::backward_flops_per_token() } -> std::convertible_to<index_t>;
  };
  static_assert(!has_tensors || has_cost,
                "mom::ExpertGate: missing `static constexpr index_t flops_per_token()` or "
                "`backward_flops_per_token()` (per routed row)");
  static constexpr bool has_plan = has_cost && requires(Arena& a, index_t i) {
    typename G::Plan;
    { G::plan(a, i) } -> std::same_as<typename G::Plan>;
  };
  static_assert(!has_cost || has_plan, "mom::ExpertGate: missing `struct Plan` and `static constexpr Plan "
                                       "plan(Arena&, index_t rows)`");
  static constexpr bool has_scratch = has_plan && requires(index_t i) { { G::scratch(i) } -> std::convertible_to<index_t>; };
  static_assert(!has_plan || has_scratch, "mom::ExpertGate: missing `static constexpr index_t scratch(index_t rows)`");
  static constexpr bool has_selection =
      has_scratch && requires(const typename G::Plan& plan) { { G::selection(plan) } -> std::convertible_to<dispatch::Selection>; };
  static_assert(!has_scratch || has_selection,
                "mom::ExpertGate: missing `static constexpr dispatch::Selection selection(const Plan&)`");
  static constexpr bool ok = ExpertGate<G>;
};

// The forward / backward members on backend Be, each named (MoEStep checks them where it calls them).
template <class G, class Be, class T = typename Be::scalar>
struct VerifyExpertGateOn {
  static constexpr bool has_forward =
      requires(Be& be, const T* p, T* ws, const typename G::Plan& plan, MatrixView<const T> x,
               std::span<const token_t> tok, index_t seq) { G::forward(be, p, ws, plan, x, tok); } ||
      requires(Be& be, const T* p, T* ws, const typename G::Plan& plan, MatrixView<const T> x,
               std::span<const token_t> tok, index_t seq) { G::forward(be, p, ws, plan, x, tok, seq); };
  static_assert(has_forward, "mom::ExpertGate: no member `static void forward(Be&, const T* p, T* ws, const Plan&, "
                             "MatrixView<const T> in, std::span<const token_t> tokens)` that takes these arguments on "
                             "this backend (routers/gate.hpp)");
  static constexpr bool has_backward =
      requires(Be& be, const T* p, T* g, const T* ws, const typename G::Plan& plan, MatrixView<const T> x,
               MatrixView<T> dx, std::span<const T> dwp) { G::backward(be, p, g, ws, plan, x, dx, dwp, g); };
  static_assert(has_backward, "mom::ExpertGate: no member `static void backward(Be&, const T* p, T* g, const T* ws, "
                              "const Plan&, MatrixView<const T> in, MatrixView<T> din, std::span<const T> dwp, T* "
                              "scratch)` that takes these arguments on this backend (routers/gate.hpp)");
  static constexpr bool ok = has_forward && has_backward;
};

// A gate that updates buffers once per optimizer step (see above).
template <class G, class Be, class T = typename Be::scalar>
concept GateWithBufferUpdate = requires(Be& be, T* p, const T* g) { G::update_buffers(be, p, g); };

template <class P>
concept ExpertGatePolicy = RouterPolicy<P> && requires { requires P::gates_experts; };

}  // namespace mom

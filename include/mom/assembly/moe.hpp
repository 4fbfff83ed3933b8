#pragma once
// Executor of Assembly<Router<TopK<Softmax>, ...>, ModuleSet<MHA<L>, Experts<FFN, E, PerStep> | FFN<E>
// [, Skip]>, K<k>, H<L>, phi::MoE>: Mixture-of-Experts, the paper's eq. (11) (§3.5), as in Mixtral.
//
// Step h = 0..L-1, for every token t (x_0 = the part's input):
//   u_h     = x_h + m^A_h(x_h)                                      attention module h, densely
//   r_h     = top-K(softmax(W_h LN_h(u_h) / tau)), renormalised       Router<TopK<Softmax>> of step h
//   x_{h+1} = u_h + Σ_{e ∈ K_h, e ≠ S} r_{h,e} · m^F_{h,e}(u_h)        φ_MoM's FFN assembly over M_h (eq. (6))
// M_h = layer h's own E experts (Experts<FFN, E, PerStep>: MoE) or the E experts all layers share
// (FFN<E>: MoE(share)); with Skip in the set, SKIP is one more class of the router (the last): a
// no-op expert (MoDE integrated, MoD paper §4.3) whose pick adds nothing. Each step has its own
// router (W_h, LN_h) also when the experts are shared. Each step's Switch balance loss over its
// C = E (+1) classes is added to the model loss.
//
// The FFN step is MoEStep below: a function over arbitrary rows [rows × d] (its gate's routing,
// grouped dispatch through assembly/grouped_dispatch.hpp, shared with the MoM executor), usable
// on a packed subset of tokens (MoDE staged). The gate is the router policy's (routers/gate.hpp), so
// a user's policy with `gates_experts` and a `gate` runs here unchanged (docs/extending.md).
#include <algorithm>
#include <array>
#include <type_traits>

#include "mom/assembly/assembly.hpp"
#include "mom/assembly/decode_rounds.hpp"
#include "mom/assembly/grouped_dispatch.hpp"
#include "mom/assembly/phi.hpp"
#include "mom/routers/gate.hpp"
#include "mom/routers/topk.hpp"
#include "mom/routers/expert_topc.hpp"
#include "mom/modules/checked.hpp"

namespace mom {

// One MoE FFN step over `rows` rows: out = in + Σ_{e picked} r_e · expert_e(in), the picks and weights
// r_e from an ExpertGate (routers/gate.hpp; TopK<Softmax>'s: its own LayerNorm, W [C × d], softmax, top-K)
// over E experts (plus SKIP when the set has Skip), each expert a TokenMixer Ffn.
// Parameters: the gate's block at p + router_offset, expert e at p + expert_offset[e] (an Ffn block).
//
//   using Step = MoEStep<D, Ffn, E, K, Gate>;
//   Step::Plan sp = Step::plan(arena, rows);                  // (rows: the most you will pass)
//   Step::forward(be, p, router_off, expert_offs, ws, sp, in, out, tokens);   // out = in + MoE(in)
//   be.axpy(aux, T(1), {ws + Step::selection(sp).loss, 1});  // add the gate's auxiliary loss
//   Step::backward(be, p, g, router_off, expert_offs, ws, sp, in, dres, scratch);  // dres: dL/dout -> dL/din
// `in` and `out` must not alias; the rows of `in` are independent tokens (no attention inside).
template <class G>
inline constexpr bool is_expert_gate = ExpertGate<G>;

template <Dims D, class Ffn, int E, int Kp, class GateArg>
struct MoEStep {
  static_assert(E <= max_row_groups,
                "mom::phi::MoE: at most 256 experts per step (mom::max_row_groups: the grouped ops pass one parameter "
                "offset per expert to their kernels)");
  static_assert(sizeof(VerifyExpertGate<GateArg>) > 0);  // each missing member of the gate named (routers/gate.hpp)
  // After a failed check the top-K softmax gate stands in, so that one mistake gives one message.
  using Gate = std::conditional_t<is_expert_gate<GateArg>, GateArg, SoftmaxTopKGate<D, E, Kp, false, TypeList<>>>;
  using RoutedFfn = dispatch::RoutedFfn<Ffn, D>;
  static constexpr int experts = E;
  static constexpr int C = Gate::classes;            // router classes; >= E never run (SKIP, unused slots)
  // Picks that can land on an expert per row: K (at most E), or a gate's own average bound (expert choice: each
  // expert takes c of the n rows, so a row runs cf experts on average though it may run all E).
  static constexpr int real_k = [] {
    if constexpr (requires { Gate::picks_per_token; }) return Gate::picks_per_token;
    else return Kp < E ? Kp : E;
  }();
  static constexpr index_t d = D.d_model;

  static constexpr index_t router_params = Gate::params;
  static constexpr auto router_tensors(index_t layer) { return Gate::tensors(layer); }
  static constexpr std::size_t router_tensor_count = module_tensor_count<Gate>;

  // ---- cost per row: the gate, real_k experts at most -----------------------------------------
  static constexpr index_t router_flops_per_token() { return Gate::flops_per_token(); }
  static constexpr index_t flops_per_token() { return router_flops_per_token() + real_k * Ffn::flops_per_token(0); }
  static constexpr index_t backward_flops_per_token() {
    return Gate::backward_flops_per_token() + real_k * Ffn::backward_flops_per_token(0);
  }
  // Forward (backward) FLOPs for a realised routing: picks [rows·K] class ids (>= E: no expert) on the host.
  template <bool backward = false>
  static index_t routed_flops(index_t rows, std::span<const token_t> picks) {
    index_t total = rows * (backward ? Gate::backward_flops_per_token() : router_flops_per_token());
    const index_t expert = backward ? Ffn::backward_flops_per_token(0) : Ffn::flops_per_token(0);
    for (token_t c : picks)
      if (c < E) total += expert;
    return total;
  }

  // ---- workspace --------------------------------------------------------------------------
  struct Plan {
    typename Gate::Plan gate{};
    typename RoutedFfn::Saved ffn{};
  };
  static constexpr Plan plan(Arena& a, index_t rows) {
    Plan p{};
    p.gate = Gate::plan(a, rows);
    p.ffn = RoutedFfn::plan(a, rows * Kp);
    return p;
  }
  static constexpr const dispatch::Selection& selection(const Plan& p) { return Gate::selection(p.gate); }
  struct Scratch {
    index_t dy, dwp, gate, ffn, total;
  };
  static constexpr Scratch scratch_plan(index_t rows) {
    Arena a;
    Scratch s{};
    s.dy = a.take(rows * Kp * d);
    s.dwp = a.take(rows * Kp);
    s.gate = a.take(Gate::scratch(rows));
    s.ffn = a.take(RoutedFfn::scratch(rows * Kp));
    s.total = a.used;
    return s;
  }
  static constexpr index_t scratch(index_t rows) { return scratch_plan(rows).total; }

  // ---- forward / backward -----------------------------------------------------------------
  template <class Be, class T>
  static void forward(Be& be, const T* p, index_t router_offset, const std::array<index_t, E>& expert_offset, T* ws,
                      const Plan& s, MatrixView<const T> in, MatrixView<T> out, std::span<const token_t> tokens = {},
                      index_t seq = 0) {
    if constexpr (!VerifyExpertGateOn<Gate, Be, T>::ok) return;  // the missing member named there, once
    // A gate that reads the rows as sequences (a per-sequence loss) is told their length: `seq` consecutive
    // rows each (0: all rows are one sequence).
    else if constexpr (requires { Gate::forward(be, p, ws, s.gate, in, tokens, seq); })
      Gate::forward(be, p + router_offset, ws, s.gate, in, tokens, seq);
    else
      Gate::forward(be, p + router_offset, ws, s.gate, in, tokens);
    // Experts over exactly their groups (eq. (6)); classes >= E (SKIP, unused slots) are never touched.
    be.copy(out.flat(), std::span<const T>(in.data, std::size_t(in.rows * d)));
    RoutedFfn::forward(be, p, ws, s.ffn, selection(s), E, [&](int e) { return expert_offset[e]; }, in, out, Kp);
  }

  // dres [rows × d] holds dL/dout on entry and dL/din on exit (the residual path is the identity).
  // The weighted scatter-adds read dres first; then the gate and the experts accumulate into it.
  template <class Be, class T>
  static void backward(Be& be, const T* p, T* g, index_t router_offset, const std::array<index_t, E>& expert_offset,
                       const T* ws, const Plan& s, MatrixView<const T> in, MatrixView<T> dres, T* scratch) {
    const index_t rows = in.rows;
    const Scratch sc = scratch_plan(rows);
    dispatch::combine_backward(be, dispatch::routed_rows(ws, selection(s), E, rows, Kp),
                               MatrixView<const T>{ws + s.ffn.y, rows * Kp, d}, MatrixView<const T>(dres),
                               MatrixView<T>{scratch + sc.dy, rows * Kp, d}, std::span<T>(scratch + sc.dwp, std::size_t(rows * Kp)));
    if constexpr (VerifyExpertGateOn<Gate, Be, T>::ok)
      Gate::backward(be, p + router_offset, g + router_offset, ws, s.gate, in, dres,
                     std::span<const T>(scratch + sc.dwp, std::size_t(rows * Kp)), scratch + sc.gate);
    RoutedFfn::backward(be, p, g, ws, s.ffn, selection(s), E, [&](int e) { return expert_offset[e]; }, in,
                        scratch + sc.dy, dres, scratch + sc.ffn, Kp);
  }

  // The gate's update between optimizer steps (GateWithBufferUpdate; a no-op for gates without one).
  template <class Be, class T>
  static void update_buffers(Be& be, T* p, const T* g, index_t router_offset) {
    if constexpr (GateWithBufferUpdate<Gate, Be, T>) Gate::update_buffers(be, p + router_offset, g + router_offset);
  }

  // The picks of the last forward: rows×K class ids (>= E: no expert), on the host.
  template <class Be, class T>
  static void read_picks(Be& be, const T* ws, const Plan& s, index_t rows, std::span<token_t> out) {
    be.to_host(out, std::span<const token_t>(dispatch::toks(ws, selection(s).picks), std::size_t(rows * Kp)));
  }
};

// The MoE step over a set's per-step experts: its token mixer, E choices, top-k, the gate of router R's
// policy with R's options; SKIP a no-op expert when `skip` (MoDE integrated; in MoDE staged Skip is the
// MoD skip, not an expert).
template <class Set, Dims D, int k, class R, bool skip = Set::has_skip>
using MoEStepOf = MoEStep<D, typename Set::template ffn<D>, Set::ffn_choices, k,
                          typename R::policy::template gate<D, Set::ffn_choices, k, skip, typename R::options>>;

// phi::MoE's executor, for every router policy that gates experts (routers/gate.hpp: TopK<Softmax>,
// or a user's policy).
template <class P, class A, Dims D>
  requires ExpertGatePolicy<P>
struct Executor<P, A, D> {
  using Set = typename A::module_set;
  static_assert(std::is_same_v<typename A::phi_type, phi::MoE>,
                "mom: a router whose policy gates experts (TopK<Softmax>, TopK<Sigmoid>, TopC, a user's gate: the "
                "policy in the note above) assembles with phi::MoE: write Assembly<Router<P>, ModuleSet<MHA<L>, "
                "Experts<FFN, E, PerStep>>, K<k>, H<L>, phi::MoE>");
  using Attn = typename Set::template attention<D>;
  static constexpr int L = A::h, E = Set::ffn_choices, Kp = A::k, Hn = L;
  static constexpr bool shared_experts = !Set::experts_per_step;
  using Step = MoEStepOf<Set, D, A::k, typename A::router>;
  static constexpr int C = Step::C;
  static constexpr index_t d = D.d_model;
  // A gate that routes a token by the other tokens of the batch (expert choice) cannot decode one new token as it
  // trained: infer::Decoder refuses it (infer/decoder.hpp).
  static constexpr bool routes_causally = !requires { requires !Step::Gate::causal; };

  // ---- parameters: the module set (names h.<base+i>.*), then one router per step ------------
  static constexpr index_t router_base = Set::template params<D>;
  static constexpr index_t router_offset(int h) { return router_base + h * Step::router_params; }
  // Step h's experts: layer h's own (Experts<FFN, E, PerStep>) or the shared FFN<E>.
  static constexpr std::array<index_t, E> expert_offsets(int h) {
    std::array<index_t, E> out{};
    for (int e = 0; e < E; ++e) out[e] = Set::template ffn_offset<D>(shared_experts ? e : h * E + e);
    return out;
  }
  static constexpr std::array<std::array<index_t, E>, L> experts_of = [] {
    std::array<std::array<index_t, E>, L> out{};
    for (int h = 0; h < L; ++h) out[h] = expert_offsets(h);
    return out;
  }();
  static constexpr std::size_t tensor_count = Set::template tensor_count<D> + Step::router_tensor_count * std::size_t(L);
  static constexpr index_t params = router_offset(L);
  static constexpr index_t router_params = L * Step::router_params;

  // Router tensors: h.<base + h>.router.{ln.w, ln.b, w}.
  static constexpr void specs(TensorSpec* out, index_t layer_base) {
    Set::template specs<D>(out, layer_base);
    out += Set::template tensor_count<D>;
    for (int h = 0; h < L; ++h)
      for (const auto& t : Step::router_tensors(layer_base + h)) *out++ = t;
  }

  // ---- cost model -------------------------------------------------------------------------
  // Worst case per token: every step its attention, its router and K experts (no SKIP picked).
  static constexpr index_t flops_per_token(index_t seq) { return L * (Attn::flops_per_token(seq) + Step::flops_per_token()); }
  static constexpr index_t backward_flops_per_token(index_t seq) {
    return L * (Attn::backward_flops_per_token(seq) + Step::backward_flops_per_token());
  }
  // Forward (backward) FLOPs for a realised routing: picks(h, 0) gives step h's n×K class ids on the host.
  template <bool backward = false, class Picks>
  static index_t routed_flops(index_t batch, index_t seq, Picks&& picks) {
    const index_t n = batch * seq;
    const index_t attn = backward ? Attn::backward_flops_per_token(seq) : Attn::flops_per_token(seq);
    index_t total = 0;
    for (int h = 0; h < L; ++h) total += n * attn + Step::template routed_flops<backward>(n, picks(h, 0));
    return total;
  }

  // ---- workspace --------------------------------------------------------------------------
  struct Plan {
    std::array<typename Attn::Saved, L> attn{};
    std::array<index_t, L> u{};
    std::array<typename Step::Plan, L> step{};
    std::array<index_t, L> x_next{};
    index_t aux = 0;  // the balance losses of all steps, and the attention modules' own (ModuleWithAuxLoss)
  };
  static constexpr bool has_aux_loss = true;
  static constexpr Plan plan(Arena& a, index_t batch, index_t seq) {
    const index_t n = batch * seq;
    Plan p{};
    for (int h = 0; h < L; ++h) {
      p.attn[h] = Attn::plan(a, batch, seq);
      p.u[h] = a.take(n * d);
      p.step[h] = Step::plan(a, n);
      p.x_next[h] = a.take(n * d);
    }
    p.aux = a.take(1);
    return p;
  }
  // Scratch: the attention output f(x) in forward; the attention's or the MoE step's backward scratch.
  static constexpr index_t scratch(index_t batch, index_t seq) {
    return std::max({batch * seq * d, guarded_scratch<Attn>(batch, seq), Step::scratch(batch * seq)});
  }

  // ---- forward / backward -------------------------------------------------------------------
  template <class Be, class T>
  static MatrixView<const T> forward(Be& be, const T* p, T* ws, const Plan& plan, MatrixView<const T> x, T* scratch,
                                     index_t batch, index_t seq, std::span<const token_t> tokens) {
    const index_t n = batch * seq;
    const MatrixView<T> fa{scratch, n, d};
    const std::span<T> aux(ws + plan.aux, 1);  // summed on the device: the host never waits
    be.zero(aux);
    for (int h = 0; h < L; ++h) {
      const MatrixView<T> u{ws + plan.u[h], n, d}, x_next{ws + plan.x_next[h], n, d};
      checked<Attn>::forward(be, p + Set::template attention_offset<D>(h), ws, plan.attn[h], x, fa, batch, seq);
      if constexpr (ModuleWithAuxLoss<Attn>) be.axpy(aux, T(1), std::span<const T>(ws + plan.attn[h].aux, 1));
      be.add_forward(u.flat(), std::span<const T>(x.data, std::size_t(n * d)), std::span<const T>(fa.flat()));  // eq. (4)
      Step::forward(be, p, router_offset(h), experts_of[h], ws, plan.step[h], MatrixView<const T>(u), x_next, tokens,
                    seq);
      be.axpy(aux, T(1), std::span<const T>(ws + Step::selection(plan.step[h]).loss, 1));
      x = x_next;
    }
    return x;
  }

  template <class Be, class T>
  static void backward(Be& be, const T* p, T* g, const T* ws, const Plan& plan, MatrixView<const T> x0,
                       MatrixView<T> dres, T* scratch, index_t batch, index_t seq) {
    const index_t n = batch * seq;
    for (int h = L - 1; h >= 0; --h) {
      const MatrixView<const T> u{ws + plan.u[h], n, d};
      const MatrixView<const T> x = h == 0 ? x0 : MatrixView<const T>{ws + plan.x_next[h - 1], n, d};
      Step::backward(be, p, g, router_offset(h), experts_of[h], ws, plan.step[h], u, dres, scratch);
      const index_t at = Set::template attention_offset<D>(h);
      checked<Attn>::backward(be, p + at, g + at, ws, plan.attn[h], x, dres, MatrixView<const T>(dres), scratch, batch, seq);
    }
  }

  // ---- incremental decoding (infer/decoder.hpp; AssemblyDecoderOn) --------------------------------
  // Token-choice routing is per token, so a new token's step h is its attention against step h's
  // key/value cache, then the MoE step over the new rows alone (the gate picks its experts from its own
  // u_h, exactly as in forward).
  using decode_sequence_mixer = Attn;  // named by infer::Decoder when it cannot decode
  template <class Be>
  static constexpr bool decodes_on = DecodingSequenceMixerOn<Attn, Be>;
  struct DecodePlan {
    detail::DecodeRounds<L, d> rounds{};  // per-step caches and the rows' residual stream
    typename Attn::DecodeSaved attn{};
    typename Step::Plan step{};
  };
  static constexpr DecodePlan plan_decode(Arena& a, index_t slots, index_t max_len, index_t rows) {
    DecodePlan p{};
    p.rounds = detail::DecodeRounds<L, d>::take(a, slots, max_len, rows);
    p.attn = Attn::plan_decode(a, rows);
    p.step = Step::plan(a, rows);
    return p;
  }
  template <class Be, class T>
  static MatrixView<const T> decode(Be& be, const T* p, T* ws, const DecodePlan& plan, MatrixView<const T> x,
                                    std::span<const index_t> slot, std::span<const index_t> pos, index_t slots,
                                    index_t max_len, std::span<const token_t> tokens) {
    return plan.rounds.template run<Attn>(
        be, p, ws, plan.attn, [](int h) { return Set::template attention_offset<D>(h); }, x, slot, pos, slots,
        max_len, [&](int h, MatrixView<const T> u, MatrixView<T> x_next, MatrixView<T> /*f*/) {
          Step::forward(be, p, router_offset(h), experts_of[h], ws, plan.step, u, x_next, tokens);
        });
  }

  // ---- between optimizer steps (models/runtime.hpp, Model::update_buffers) ------------------
  // Every step's gate that keeps buffers outside gradient descent (DeepSeekMoE's selection bias).
  template <class Be, class T>
  static void update_buffers(Be& be, T* p, const T* g) {
    for (int h = 0; h < L; ++h) Step::update_buffers(be, p, g, router_offset(h));
  }

  // ---- routing read-back (statistics, realised FLOPs; models/routing_stats.hpp) -------------
  // One router family ("ffn"): step h's picks, n×K class ids (SKIP = E).
  static constexpr int routing_routers = 1;
  static constexpr RoutingInfo routing_info(int /*router*/) { return {"ffn", C, L, Kp, C > E}; }
  template <class Be, class T>
  static void read_picks(Be& be, const T* ws, const Plan& plan, int h, int /*router*/, index_t n, std::span<token_t> out) {
    Step::read_picks(be, ws, plan.step[h], n, out);
  }
};

}  // namespace mom

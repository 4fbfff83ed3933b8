#pragma once
// DepthExecutorBase: what the executors of the depth routers share (assembly/depth.hpp has the
// overview and the equations): the routers of the routed layers, the unrouted layers, parameters,
// cost model, workspace and read-back. The routed block itself runs in the Derived executor:
// SelectedBlocks (assembly/depth_selected.hpp) or PackedBlocks (assembly/depth_packed.hpp); the block's
// FFN half is a type too (assembly/depth_block.hpp).
#include <algorithm>
#include <array>
#include <string>
#include <type_traits>
#include <vector>

#include "mom/assembly/assembly.hpp"
#include "mom/assembly/depth_block.hpp"
#include "mom/assembly/moe.hpp"
#include "mom/assembly/phi.hpp"
#include "mom/core/check.hpp"
#include "mom/routers/depth.hpp"
#include "mom/modules/checked.hpp"
#include "mom/routing/dispatch.hpp"

namespace mom {


namespace detail {

// One routed layer's causal decision over the last forward (read_causal of the depth executors: here and
// Mixture-of-Recursions'): its BCE and correct decisions out of `tokens`.
struct DepthCausalStats {
  int layer = 0;
  double bce = 0, correct = 0, tokens = 0;
};

// What the depth executors share: the router of every routed layer (its parameters, decision, auxiliary
// losses and their backward), the unrouted layers, the parameter layout, the cost model and the
// read-back. How a routed layer runs its block is the Derived executor's (CRTP): SelectedBlocks (MoD,
// exactly C tokens per sequence: a dense block over (batch, C); assembly/depth_selected.hpp) or
// PackedBlocks (a skip criterion or MoD's causal routing: a variable number of run rows, one row group;
// assembly/depth_packed.hpp). Derived provides plan_attention, attention_scratch, block_forward,
// block_backward and rows_run.
template <class Derived, class Policy, class A, Dims D>
struct DepthExecutorBase : WorkspaceViews {
  using Cfg = typename Policy::config;
  using Set = typename A::module_set;
  using Ffn = typename Set::template ffn<D>;
  static_assert(std::is_same_v<typename A::phi_type, phi::LayerSkip>,
                "mom::Router<BlockChoice> and Router<Skipping> assemble with phi::LayerSkip (eq. (9)): "
                "Assembly<R, M, K<1>, H<L>, phi::LayerSkip>");
  static constexpr int L = A::h;
  static constexpr index_t d = D.d_model;
  static constexpr bool block_choice = Cfg::block_choice;
  // Exactly C tokens per sequence (top-C): a dense block over (batch, C). Otherwise (a skip criterion,
  // or MoD's causal routing at inference) a variable number: packed attention over the running tokens.
  static constexpr bool exact_c = block_choice && !Cfg::causal_routing;
  // Layer-skip with AttendToSkipped: a layer's running tokens attend to every token (the skipped ones'
  // keys/values from their current state), so K/V run over all tokens, Q and the rest over the run rows.
  static constexpr bool attend_all = Cfg::attend_skipped;
  static constexpr KeySource keys = attend_all ? KeySource::AllTokens : KeySource::Routed;
  // MoD runs its blocks densely over (batch, C); skip criteria run attention over the run rows.
  using Attn = std::conditional_t<exact_c, typename Set::template attention<D>, typename Set::template routed_attention<D>>;
  // Skip criteria run attention over the packed run rows (row groups); MoD over (batch, C), densely.
  static_assert(sizeof(std::conditional_t<exact_c, VerifyModule<typename Set::template attention<D>>,
                                          VerifyRoutedSequenceMixer<typename Set::template attention<D>>>) > 0);
  static_assert(!ModuleWithAuxLoss<typename Set::template attention<D>> && !ModuleWithAuxLoss<typename Set::template ffn<D>>,
                "mom::phi::LayerSkip: modules with an auxiliary loss (SigmaMoE, SwitchHead) run in the dense stack, under "
                "parameter sharing and as MoE's attention; the depth executors do not add their loss yet");
  static_assert(!block_choice || Cfg::capacity_tokens(D.context) >= 1,
                "mom::BlockChoice: Capacity<p, q> gives C = floor(p/q * context) = 0 tokens per sequence at the "
                "model's context: no token would ever run a routed block");
  static constexpr index_t PW = Cfg::predictor_width;
  static constexpr bool unit_weight = Cfg::unit_weight;
  // MoDE staged: every layer's FFN is an MoE step over the rows it runs (see the header).
  static constexpr bool moe = Set::experts_per_step;
  static_assert(!moe || block_choice,
                "mom::Router<Skipping> with Experts<FFN, E, PerStep>: only Mixture-of-Depths routes before experts "
                "(MoDE staged): use Router<BlockChoice<...>>");
  static_assert(!moe || !block_choice || exact_c,  // (Skipping over experts: the message above alone)
                "mom::BlockChoice<..., CausalRouting> over per-layer experts (MoDE staged at inference) is not "
                "supported: its MoE step would run over a token count known only on the device");
  static_assert(moe || !Cfg::expert_router_given,
                "mom::ExpertRouter<R> routes the experts of MoDE staged: it needs ModuleSet<MHA<L>, Experts<FFN, E, "
                "PerStep>, Skip>");
  // The block's FFN half (assembly/depth_block.hpp): the set's token mixer, or MoDE staged's MoE step.
  using Block = std::conditional_t<moe, MoEBlockFfn<Set, D, typename Cfg::expert_router_t::router, A::k>,
                                   PlainBlockFfn<Set, D>>;
  static constexpr bool has_aux_loss = true;  // Plan::aux (0 when no auxiliary loss is configured)
  static constexpr bool is_depth_routed = true;  // read_selected / read_causal (models/depth_stats.hpp)

  static constexpr bool routed(int h) { return Cfg::routes(h); }
  static constexpr int n_routed = [] {
    int n = 0;
    for (int h = 0; h < L; ++h) n += routed(h) ? 1 : 0;
    return n;
  }();
  // The routed layer before h, or -1.
  static constexpr int previous_routed(int h) {
    for (int i = h - 1; i >= 0; --i)
      if (routed(i)) return i;
    return -1;
  }
  // Index of routed layer h among the routed layers.
  static constexpr int routed_index(int h) {
    int j = 0;
    for (int i = 0; i < h; ++i) j += routed(i) ? 1 : 0;
    return j;
  }

  // ---- parameters: the blocks (names h.<base+i>.*, the Dense<L> layout), then per routed layer its
  // router (h.<i>.router.w [1×d], h.<i>.router.b for the gate) and predictor (h.<i>.predictor.*) ----
  static constexpr index_t router_size = (Cfg::has_router ? d : 0) + (Cfg::has_bias ? 1 : 0);
  static constexpr index_t predictor_size = PW > 0 ? PW * d + PW + PW + 1 : 0;
  static constexpr index_t per_routed = router_size + predictor_size;
  static constexpr index_t router_base = Set::template params<D> + Block::params;
  struct RouterOffsets {
    index_t w, b, w1, b1, w2, b2;
  };
  static constexpr RouterOffsets router_offsets(int h) {
    const index_t at = router_base + routed_index(h) * per_routed;
    RouterOffsets o{};
    o.w = at;
    o.b = at + d;
    o.w1 = at + router_size;
    o.b1 = o.w1 + PW * d;
    o.w2 = o.b1 + PW;
    o.b2 = o.w2 + PW;
    return o;
  }
  static constexpr std::size_t per_routed_tensors = Cfg::layer_tensor_count;
  static constexpr std::size_t tensor_count =
      Set::template tensor_count<D> + Block::tensor_count + std::size_t(n_routed) * per_routed_tensors;
  static constexpr index_t params = router_base + n_routed * per_routed;
  static constexpr index_t router_params = n_routed * router_size;
  static constexpr index_t predictor_params = n_routed * predictor_size;

  static constexpr void specs(TensorSpec* out, index_t layer_base) {
    Set::template specs<D>(out, layer_base);
    out += Set::template tensor_count<D>;
    Block::specs(out, layer_base);
    out += Block::tensor_count;
    for (int h = 0; h < L; ++h) {
      if (!routed(h)) continue;
      for (const auto& t : Cfg::layer_tensors(layer_base + h, d, moe)) *out++ = t;
    }
  }

  // ---- cost model (FLOPs as in models/lm.hpp: 2·m·n·k per product, causal attention) ----------
  // C = ⌊capacity·seq⌋ tokens per sequence in a routed MoD block.
  static constexpr index_t capacity_tokens(index_t seq) { return index_t(Cfg::capacity_tokens(seq)); }
  // Per token run: attention's products, then the FFN (MoDE staged: the MoE router and k experts).
  static constexpr index_t ffn_flops = Block::flops, ffn_backward_flops = Block::backward_flops;
  static constexpr index_t block_linear_flops = Attn::kv_flops + Attn::query_flops + ffn_flops;
  // Per token of a routed layer: the score wᵀx, the predictor, the skip cost's sum of gates.
  static constexpr index_t router_flops =
      (Cfg::has_router ? 2 * d : 0) + (PW > 0 ? 2 * d * PW + 2 * PW : 0) + (Cfg::gate_mean ? 2 : 0);
  // Forward FLOPs of one layer over a sequence of `seq` tokens of which it runs `run`, whose running
  // queries see `pairs` (query, key) pairs in all: c(c+1)/2 among c running tokens, or with
  // AttendToSkipped Σ (position + 1) over the running tokens (every earlier token is a key). Attention
  // costs 4·d per pair (2·d·c(c+1) among c tokens, as Attention::flops_per_token); with
  // AttendToSkipped the K/V projection runs over every token, Q and the output projection per run token.
  static constexpr index_t pairs_among(index_t c) { return c * (c + 1) / 2; }
  static constexpr index_t layer_flops(index_t seq, index_t run, index_t pairs, bool is_routed) {
    const index_t linear = is_routed && attend_all ? seq * Attn::kv_flops + run * (Attn::query_flops + ffn_flops)
                                                   : run * block_linear_flops;
    return linear + Attn::pair_flops * pairs + (is_routed ? seq * router_flops + gate_loss_flops : 0);
  }
  // The gate loss's square c·(ḡ − ρ)², a 1×1 product on the device once per batch (counted per
  // sequence by layer_flops: an upper bound; realised_flops counts it once).
  static constexpr index_t gate_loss_flops = Cfg::gate_mean ? 2 : 0;
  // The router's w gets a gradient (and its backward runs) unless its score only selects (Unit weight, no
  // causal loss on it).
  static constexpr bool router_trained = Cfg::has_router && (!unit_weight || Cfg::causal_aux);
  static constexpr index_t layer_backward_flops(index_t seq, index_t run, index_t pairs, bool is_routed) {
    // two products per linear; attention 10·d per pair (5 causal products); router: dx and dw (4d),
    // predictor: dw only (its input is stop-gradient) plus the hidden layer's dx and dw.
    const index_t router =
        (router_trained ? 4 * d : 0) + (PW > 0 ? 2 * d * PW + 4 * PW : 0) + (Cfg::gate_mean ? 2 : 0);
    const index_t linear =
        is_routed && attend_all ? seq * Attn::kv_backward_flops + run * (Attn::query_backward_flops + ffn_backward_flops)
                                : run * (Attn::kv_backward_flops + Attn::query_backward_flops + ffn_backward_flops);
    return linear + Attn::pair_backward_flops * pairs + (is_routed ? seq * router : 0);
  }
  // Worst case per sequence: MoD runs exactly C tokens per routed block (worst = expected); a skip
  // criterion may run every token.
  static constexpr index_t worst_run(index_t seq) { return exact_c ? capacity_tokens(seq) : seq; }
  static constexpr index_t flops_per_sequence(index_t seq) {
    index_t total = 0;
    for (int h = 0; h < L; ++h) {
      const index_t run = routed(h) ? worst_run(seq) : seq;
      total += layer_flops(seq, run, pairs_among(run), routed(h));
    }
    return total;
  }
  static constexpr index_t backward_flops_per_sequence(index_t seq) {
    index_t total = 0;
    for (int h = 0; h < L; ++h) {
      const index_t run = routed(h) ? worst_run(seq) : seq;
      total += layer_backward_flops(seq, run, pairs_among(run), routed(h));
    }
    return total;
  }
  // Per token (the LM's convention; rounded down where C/seq does not divide evenly).
  static constexpr index_t flops_per_token(index_t seq) { return flops_per_sequence(seq) / seq; }
  static constexpr index_t backward_flops_per_token(index_t seq) { return backward_flops_per_sequence(seq) / seq; }
  // Expected forward FLOPs per token when a routed layer runs a fraction `run_fraction` of every
  // sequence (MoD: C/seq exactly; layer-skip: the measured fraction, e.g. from read_counts), the run
  // tokens spread evenly over the positions.
  static constexpr double expected_flops_per_token(index_t seq, double run_fraction) {
    double total = 0;
    const double S = double(seq);
    for (int h = 0; h < L; ++h) {
      const double run = routed(h) ? run_fraction * S : S;
      const double pairs = routed(h) && attend_all ? run_fraction * S * (S + 1) / 2 : run * (run + 1) / 2;
      const double linear = routed(h) && attend_all ? S * double(Attn::kv_flops) + run * double(Attn::query_flops + ffn_flops)
                                                    : run * double(block_linear_flops);
      total += linear + double(Attn::pair_flops) * pairs + (routed(h) ? double(seq * router_flops) : 0.0);
    }
    return total / S;
  }

  // ---- workspace ----------------------------------------------------------------------------
  // Rows a routed layer can run: batch·C (MoD) or every token (skip).
  static constexpr index_t max_rows(index_t batch, index_t seq) {
    return exact_c ? batch * capacity_tokens(seq) : batch * seq;
  }
  struct Layer {
    typename Attn::Saved attn{};  // unrouted layers; MoD: over (batch, C)
    typename Set::template routed_attention<D>::template GroupedSaved<1> gattn{};  // skip: the run rows (one group)
    typename Block::Saved ffn{};  // the block's FFN half (MoDE staged: the MoE step) over the rows run
    index_t xg = 0, u = 0, fo = 0;  // gathered inputs x̃, u = x̃ + attention, f(x̃) (routed layers)
    index_t x_next = 0;
    index_t logits = 0, gate = 0, wsel = 0, mask = 0, bce = 0;  // T: [n], [n], [rows], [n], [2]
    index_t hid = 0, act = 0, pred = 0;                          // predictor [n×PW], [n×PW], [n]
    index_t idx = 0, groups = 0;  // token_t: [rows]; the run rows' offsets {0, count} (count on the device)
  };
  // A routed layer's block rows as the routing layer sees them (routing/dispatch.hpp): the tokens its router
  // picked (l.idx) and their weights (l.wsel; none under unit weights), in the run's row group g (the packed
  // layout) or ungrouped (the top-C layout).
  template <class T>
  static dispatch::RoutedRows<T> picked(const T* ws, const Layer& l, index_t rows, RowGroups g = {}) {
    return dispatch::picked_rows(std::span<const token_t>(toks(ws, l.idx), std::size_t(rows)),
                                 unit_weight ? std::span<const T>{} : std::span<const T>(ws + l.wsel, std::size_t(rows)), g);
  }
  struct Plan {
    std::array<Layer, L> layer{};
    index_t alive = 0;  // token_t [n]: early exit's "ran every routed layer so far"
    index_t ones = 0;   // T [n] of 1 (the early-exit mean gate's in-play mask)
    index_t aux = 0;    // the auxiliary losses of this part (written by forward)
  };
  static constexpr Plan plan(Arena& a, index_t batch, index_t seq) {
    const index_t n = batch * seq, rows = max_rows(batch, seq);
    Plan p{};
    for (int h = 0; h < L; ++h) {
      Layer& l = p.layer[h];
      if (!routed(h)) {
        l.attn = Attn::plan(a, batch, seq);
        l.u = a.take(n * d);
        l.ffn = Block::plan(a, n);
        l.x_next = a.take(n * d);
        continue;
      }
      l.logits = a.take(n);
      l.gate = a.take(n);
      l.idx = a.take(tok_elems(rows));
      l.groups = a.take(tok_elems(2));
      l.wsel = a.take(rows);
      l.xg = a.take(rows * d);
      Derived::plan_attention(a, l, n, rows);
      l.u = a.take(rows * d);
      l.ffn = Block::plan(a, rows);
      l.fo = a.take(rows * d);
      l.x_next = a.take(n * d);
      l.mask = a.take(n);
      l.bce = a.take(2);
      if constexpr (PW > 0) {
        l.hid = a.take(n * PW);
        l.act = a.take(n * PW);
        l.pred = a.take(n);
      }
    }
    p.alive = a.take(tok_elems(n));
    p.ones = a.take(n);
    p.aux = a.take(1);
    return p;
  }

  // Scratch shared with the other parts. Forward: the FFN output of a layer [n×d]. Backward: the
  // routed layer's buffers, then the modules' own backward scratch.
  struct Scratch {
    index_t df, g, dwsel, dlogits, dgate, dpred, dact, dhid, module, total;
  };
  static constexpr Scratch scratch_plan(index_t batch, index_t seq) {
    const index_t n = batch * seq, rows = max_rows(batch, seq);
    Arena a;
    Scratch s{};
    s.df = a.take(n * d);  // forward: a module's output; backward: dL/df (routed) 
    s.g = a.take(rows * d);
    s.dwsel = a.take(rows);
    s.dlogits = a.take(n);
    s.dgate = a.take(n);
    s.dpred = a.take(n);
    s.dact = a.take(n * std::max<index_t>(PW, 1));
    s.dhid = a.take(n * std::max<index_t>(PW, 1));
    s.module = a.take(std::max({guarded_scratch<Attn>(batch, seq), guarded_scratch<Ffn>(batch, seq), Derived::attention_scratch(n, rows),
                                Block::scratch(n)}));
    s.total = a.used;
    return s;
  }
  static constexpr index_t scratch(index_t batch, index_t seq) { return scratch_plan(batch, seq).total; }

  // A skip layer's run rows as one row group {0, count} (core/groups.hpp), so the block runs over
  // a count the host never reads, with host bounds of n rows.
  template <class T>
  static RowGroups run_groups(const T* ws, const Layer& l) {
    return {toks(ws, l.groups), 1};
  }

  // ---- forward ------------------------------------------------------------------------------
  template <class Be, class T>
  static MatrixView<const T> forward(Be& be, const T* p, T* ws, const Plan& plan, MatrixView<const T> x, T* scratch,
                                     index_t batch, index_t seq, std::span<const token_t> /*tokens*/) {
    const index_t n = batch * seq;
    const Scratch s = scratch_plan(batch, seq);
    if constexpr (Cfg::early_exit) be.fill(sp(toks(ws, plan.alive), n), token_t(1));
    if constexpr (Cfg::early_exit && Cfg::gate_mean) be.fill(sp(ws + plan.ones, n), T(1));  // once per forward
    const std::span<T> aux = sp(ws + plan.aux, 1);  // summed on the device: the host never waits
    be.zero(aux);
    for (int h = 0; h < L; ++h) {
      const Layer& l = plan.layer[h];
      const MatrixView<T> x_next = mv(ws + l.x_next, n, d);
      if (!routed(h)) {  // as Dense<L>: u = x + Attn(x), x' = u + FFN(u)
        const T* pa = p + Set::template attention_offset<D>(h);
        const MatrixView<T> fo = mv(scratch + s.df, n, d), u = mv(ws + l.u, n, d);
        checked<Attn>::forward(be, pa, ws, l.attn, x, fo, batch, seq);
        be.add_forward(u.flat(), sp(x.data, n * d), sp<const T>(fo.data, n * d));
        Block::forward_residual(be, p, ws, l.ffn, h, MatrixView<const T>(u), x_next, fo, aux);
        x = x_next;
        continue;
      }
      route_forward(be, p, ws, plan, l, h, x, aux, batch, seq);
      be.copy(x_next.flat(), sp(x.data, n * d));  // x_{h+1} = x_h for every token, then + w·f on S
      Derived::block_forward(be, p, ws, l, h, x, x_next, scratch + s.df, aux, batch, seq);
      x = x_next;
    }
    return x;
  }

  // The routing decision of routed layer h: scores, selection, weights; its auxiliary losses
  // are added to aux (device memory).
  template <class Be, class T>
  static void route_forward(Be& be, const T* p, T* ws, const Plan& plan, const Layer& l, int h, MatrixView<const T> x,
                            std::span<T> aux, index_t batch, index_t seq) {
    const index_t n = batch * seq;
    const RouterOffsets o = router_offsets(h);
    const MatrixView<T> logits = mv(ws + l.logits, n, 1);
    if constexpr (Cfg::has_router)
      be.linear_forward(logits, x, mv(p + o.w, 1, d), Cfg::has_bias ? sp(p + o.b, 1) : std::span<const T>{});
    else
      be.fill(logits.flat(), T(1));  // Never: every token runs
    if constexpr (!exact_c) be.fill(sp(toks(ws, l.groups), 1), token_t(0));  // run_groups' offsets[0]
    const std::span<token_t> count = sp(toks(ws, l.groups) + 1, 1);
    if constexpr (Cfg::causal_routing) {  // inference: the causal decision instead of top-C (MoD §3.5)
      const T* decision = logits.data;   // method 1: the router's own sign
      if constexpr (PW > 0) {            // method 2: the predictor's
        predictor_forward(be, p, ws, l, o, x, n);
        decision = ws + l.pred;
      }
      be.skip_select(sp(toks(ws, l.idx), n), count, std::span<token_t>{}, sp(decision, n));
      if constexpr (!unit_weight)
        be.gather_rows(mv(ws + l.wsel, n, 1), MatrixView<const T>(logits), sp<const token_t>(toks(ws, l.idx), n),
                       run_groups(ws, l));
    } else if constexpr (block_choice) {
      const index_t C = capacity_tokens(seq), m = batch * C;
      const auto idx = sp(toks(ws, l.idx), m);
      be.select_topc_per_sequence(idx, sp<const T>(logits.data, n), batch, seq);
      if (!unit_weight && m > 0)
        be.gather_rows(mv(ws + l.wsel, m, 1), MatrixView<const T>(logits), std::span<const token_t>(idx));
      // Top-C membership: the causal losses' targets and the accuracy of the causal decision.
      be.selection_mask(sp(ws + l.mask, n), std::span<const token_t>(idx));
      if constexpr (Cfg::causal_aux) {  // method 1: BCE on the router's own logits
        be.bce_logits_forward(sp(ws + l.bce, 2), sp<const T>(logits.data, n), sp<const T>(ws + l.mask, n));
        be.axpy(aux, T(Cfg::aux_coef), sp<const T>(ws + l.bce, 1));
      } else if constexpr (PW > 0) {  // method 2: the predictor on stop-gradient inputs
        predictor_forward(be, p, ws, l, o, x, n);
        be.bce_logits_forward(sp(ws + l.bce, 2), sp<const T>(ws + l.pred, n), sp<const T>(ws + l.mask, n));
        // Not added to the model loss: on stop-gradient inputs it is a separate objective (its
        // gradient reaches the predictor alone), and the model loss stays the LM's (+ method 1's).
      } else {  // no causal method: the accuracy of the router's sign as the decision, no loss
        be.bce_logits_forward(sp(ws + l.bce, 2), sp<const T>(logits.data, n), sp<const T>(ws + l.mask, n));
      }
    } else {
      be.skip_select(sp(toks(ws, l.idx), n), count,
                     Cfg::early_exit ? sp(toks(ws, plan.alive), n) : std::span<token_t>{}, sp<const T>(logits.data, n));
      if constexpr (!unit_weight) {
        be.sigmoid_forward(sp(ws + l.gate, n), sp<const T>(logits.data, n));
        be.gather_rows(mv(ws + l.wsel, n, 1), mv<const T>(ws + l.gate, n, 1), sp<const token_t>(toks(ws, l.idx), n),
                       run_groups(ws, l));
        if constexpr (Cfg::gate_mean) gate_mean_forward(be, ws, plan, l, h, aux, n);
      }
    }
  }

  // The skip gates' auxiliary loss p/q·ḡ + c·(ḡ − ρ)² on the device. ḡ = (1/n) Σ_i a_i σ_i over the
  // tokens still in play (a_i = 1; with early exit, a_i = 1 iff token i ran the previous routed
  // layer: an exited token's gate decides nothing), as one product of the gates with the 0/1 row a.
  // l.bce holds {Σ a_i σ_i, ḡ − ρ} for the backward.
  template <class Be, class T>
  static void gate_mean_forward(Be& be, T* ws, const Plan& plan, const Layer& l, int h, std::span<T> aux, index_t n) {
    const std::span<T> in_play = sp(ws + l.mask, n);
    const int prev = previous_routed(h);
    if (Cfg::early_exit && prev >= 0) {  // 1 at the previous routed layer's run rows
      const Layer& lp = plan.layer[std::size_t(prev)];
      be.zero(in_play);
      be.scatter_add_rows(mv(in_play.data(), n, 1), mv<const T>(ws + plan.ones, n, 1),
                          sp<const token_t>(toks(ws, lp.idx), n), std::span<const T>{}, run_groups(ws, lp));
    } else {
      be.fill(in_play, T(1));
    }
    const MatrixView<T> sum = mv(ws + l.bce, 1, 1), off = mv(ws + l.bce + 1, 1, 1);
    be.linear_forward(sum, mv<const T>(ws + l.gate, 1, n), mv<const T>(in_play.data(), 1, n), std::span<const T>{});
    be.fill(off.flat(), T(-Cfg::run_target));
    be.axpy(off.flat(), T(1) / T(n), sum.flat());  // ḡ − ρ
    be.axpy(aux, T(Cfg::skip_cost) / T(n), std::span<const T>(sum.flat()));
    be.gemm(MatrixView<T>(aux.data(), 1, 1), MatrixView<const T>(off), Be::Trans::N, MatrixView<const T>(off),
            Be::Trans::N, T(Cfg::run_target_coef), T(1));  // + c·(ḡ − ρ)²
  }

  // The causal predictor P(x_i) = w2ᵀ ReLU(W1 x_i + b1) + b2 (logits in l.pred), MoD §3.5 method 2.
  template <class Be, class T>
  static void predictor_forward(Be& be, const T* p, T* ws, const Layer& l, const RouterOffsets& o,
                                MatrixView<const T> x, index_t n) {
    be.linear_forward(mv(ws + l.hid, n, PW), x, mv(p + o.w1, PW, d), sp(p + o.b1, PW));
    be.relu_forward(sp(ws + l.act, n * PW), sp<const T>(ws + l.hid, n * PW));
    be.linear_forward(mv(ws + l.pred, n, 1), mv<const T>(ws + l.act, n, PW), mv(p + o.w2, 1, PW), sp(p + o.b2, 1));
  }

  // ---- backward -----------------------------------------------------------------------------
  // dres holds dL/dx_L on entry and dL/dx_0 on exit. A routed layer's identity path (every token)
  // leaves dres as it is; the block adds its input gradient for the tokens it ran.
  template <class Be, class T>
  static void backward(Be& be, const T* p, T* g, const T* ws, const Plan& plan, MatrixView<const T> x0,
                       MatrixView<T> dres, T* sc, index_t batch, index_t seq) {
    MOM_CHECK(!Cfg::causal_routing, "Router<BlockChoice<..., CausalRouting>> is an inference mode (autoregressive "
              "sampling): train the same type without CausalRouting");
    const index_t n = batch * seq;
    const Scratch s = scratch_plan(batch, seq);
    for (int h = L - 1; h >= 0; --h) {
      const Layer& l = plan.layer[h];
      const MatrixView<const T> x = h == 0 ? x0 : mv<const T>(ws + plan.layer[h - 1].x_next, n, d);
      if (!routed(h)) {
        const index_t oa = Set::template attention_offset<D>(h);
        const MatrixView<const T> u = mv<const T>(ws + l.u, n, d);
        Block::backward_residual(be, p, g, ws, l.ffn, h, u, dres, sc + s.module);
        checked<Attn>::backward(be, p + oa, g + oa, ws, l.attn, x, dres, MatrixView<const T>(dres), sc + s.module, batch, seq);
        continue;
      }
      const MatrixView<T> dlogits = mv(sc + s.dlogits, n, 1);
      be.zero(dlogits.flat());
      if constexpr (!block_choice) be.zero(sp(sc + s.dgate, n));
      Derived::block_backward(be, p, g, ws, l, h, x, dres, sc, s, batch, seq);
      route_backward(be, p, g, ws, l, h, x, dres, sc, s, n);
    }
  }

  template <class Be, class T>
  static void route_backward(Be& be, const T* p, T* g, const T* ws, const Layer& l, int h, MatrixView<const T> x,
                             MatrixView<T> dres, T* sc, const Scratch& s, index_t n) {
    if constexpr (!Cfg::has_router) return;
    const RouterOffsets o = router_offsets(h);
    T* dlogits = sc + s.dlogits;
    const auto logits = sp<const T>(ws + l.logits, n);
    if constexpr (block_choice) {
      if constexpr (Cfg::causal_aux)
        be.bce_logits_backward(sp(dlogits, n), logits, sp<const T>(ws + l.mask, n), T(Cfg::aux_coef / double(n)));
      if constexpr (PW > 0) {  // the predictor's own loss; its input is stop-gradient (no dx)
        const std::span<T> dpred = sp(sc + s.dpred, n);
        be.zero(dpred);
        be.bce_logits_backward(dpred, sp<const T>(ws + l.pred, n), sp<const T>(ws + l.mask, n),
                               T(Cfg::predictor_coef / double(n)));
        const MatrixView<T> dact = mv(sc + s.dact, n, PW), dhid = mv(sc + s.dhid, n, PW);
        be.zero(dact.flat());
        be.zero(dhid.flat());
        be.linear_backward(dact, mv(g + o.w2, 1, PW), sp(g + o.b2, 1), mv<const T>(dpred.data(), n, 1),
                           mv<const T>(ws + l.act, n, PW), mv(p + o.w2, 1, PW));
        be.relu_backward(dhid.flat(), sp<const T>(ws + l.hid, n * PW), sp<const T>(dact.data, n * PW));
        be.linear_backward(MatrixView<T>{}, mv(g + o.w1, PW, d), sp(g + o.b1, PW), MatrixView<const T>(dhid), x,
                           mv(p + o.w1, PW, d));
      }
      if constexpr (unit_weight && !Cfg::causal_aux) return;  // nothing reaches the router's w
    } else {
      // dL/dσ: the block weights' gradient (in dgate) + the cost p/q·mean σ; then through σ.
      const std::span<T> dgate = sp(sc + s.dgate, n);
      if constexpr (Cfg::gate_mean) {  // d/dσ_i of p/q·ḡ + c·(ḡ − ρ)² = a_i (p/q + 2c(ḡ − ρ)) / n
        // a·p/q/n, then a·(ḡ − ρ)·2c/n as a product with the device scalar ḡ − ρ (l.bce[1]).
        be.axpy(dgate, T(Cfg::skip_cost) / T(n), sp<const T>(ws + l.mask, n));
        be.gemm(mv(dgate.data(), n, 1), mv<const T>(ws + l.mask, n, 1), Be::Trans::N, mv<const T>(ws + l.bce + 1, 1, 1),
                Be::Trans::N, T(2 * Cfg::run_target_coef) / T(n), T(1));
      }
      be.sigmoid_backward(sp(dlogits, n), sp<const T>(ws + l.gate, n), std::span<const T>(dgate));
    }
    be.linear_backward(dres, mv(g + o.w, 1, d), Cfg::has_bias ? sp(g + o.b, 1) : std::span<T>{},
                       mv<const T>(dlogits, n, 1), x, mv(p + o.w, 1, d));
  }

  // ---- read-back: selections, counts, causal accuracy ---------------------------------------
  // Flat indices of the tokens routed layer h ran in the last forward (ascending).
  template <class Be, class T>
  static std::vector<token_t> read_selected(Be& be, const T* ws, const Plan& plan, int h, index_t batch, index_t seq) {
    const Layer& l = plan.layer[h];
    std::vector<token_t> out(std::size_t(Derived::rows_run(be, ws, l, batch, seq)));
    be.to_host(std::span<token_t>(out), std::span<const token_t>(toks(ws, l.idx), out.size()));
    return out;
  }
  // Per routed layer of the last forward (MoD): the causal decision's BCE and number of correct
  // predictions of top-C membership, out of batch·seq tokens. The decision is the predictor's sign
  // (CausalPredictor), else the router's sign r_i > 0 (CausalAux, or none: how causal the plain
  // router happens to be).
  using CausalStats = DepthCausalStats;
  template <class Be, class T>
  static std::vector<CausalStats> read_causal(Be& be, const T* ws, const Plan& plan, index_t batch, index_t seq) {
    std::vector<CausalStats> out;
    if constexpr (exact_c) {
      for (int h = 0; h < L; ++h) {
        if (!routed(h)) continue;
        T v[2];
        be.to_host(std::span<T>(v, 2), std::span<const T>(ws + plan.layer[h].bce, 2));
        out.push_back({h, double(v[0]), double(v[1]), double(batch * seq)});
      }
    }
    return out;
  }
  // Forward (backward) FLOPs of the last forward (per routed layer its realised per-sequence counts).
  template <bool backward = false, class Be, class T>
  static index_t realised_flops(Be& be, const T* ws, const Plan& plan, index_t batch, index_t seq) {
    index_t total = 0;
    for (int h = 0; h < L; ++h) {
      if (!routed(h)) {
        total += batch * (backward ? layer_backward_flops(seq, seq, pairs_among(seq), false)
                                   : layer_flops(seq, seq, pairs_among(seq), false));
        continue;
      }
      const auto sel = read_selected(be, ws, plan, h, batch, seq);
      std::vector<index_t> run(std::size_t(batch), 0), pairs(std::size_t(batch), 0);
      for (token_t t : sel) {
        const auto b = std::size_t(t / seq);
        ++run[b];
        pairs[b] += attend_all ? t % seq + 1 : run[b];  // keys: every earlier token, or the earlier run ones
      }
      if constexpr (backward) {
        for (std::size_t b = 0; b < run.size(); ++b) total += layer_backward_flops(seq, run[b], pairs[b], true);
      } else {
        for (std::size_t b = 0; b < run.size(); ++b) total += layer_flops(seq, run[b], pairs[b], true) - gate_loss_flops;
        total += gate_loss_flops;
      }
    }
    return total;
  }
};
}  // namespace detail

}  // namespace mom

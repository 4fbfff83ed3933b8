#pragma once
// Executor of Router<Recursion<...>> under phi::Recursion: Mixture-of-Recursions with expert-choice
// routing and recursion-wise key/value caching (Bae et al. 2025, arXiv 2507.10524, §2.2). The tuple
// <M, R, φ, K, H>: M = {the shared block (Block<B>: B layers), SKIP}, R = one linear router per
// recursion, φ = φ_recursion (assembly/phi.hpp), K = 1, H = N_r recursions.
//
//   MoR<B, Nr>            Assembly<Router<Recursion<>>, ModuleSet<Block<B>, Skip>, K<1>, H<Nr>, phi::Recursion>
//   MoRMiddleCycle<B, Nr> Chunked<Layer, MoR<B, Nr>, Layer>: first and last layer unshared ("middle-cycle")
//
// Recursion r (0-based) with state x_r (x_0: the part's input), k_r = ⌊p_r/q · S⌋ tokens per sequence:
//   l_t = θ_rᵀ x_{r,t}                                  the router's score of every token
//   S_r = top-k_r of l over the candidates of every sequence, the candidates being S_{r−1} (all tokens
//         at r = 0): hierarchical filtering, S_r ⊆ S_{r−1}; a token outside S_r has exited
//   x̃ = x_r[S_r] (causal order kept); y_0 = x̃; per layer j of the block: u_j = y_j + Attn_j(y_j),
//         y_{j+1} = u_j + FFN_j(u_j) (pre-norm, dense over (batch, k_r): attention among S_r only, which is
//         the paper's recursion-wise KV caching)
//   f = y_B − x̃ (AddBlockOutput: f = y_B, as the authors' code);
//   x_{r+1,t} = x_{r,t} + g_t f_t for t ∈ S_r, x_{r+1,t} = x_{r,t} otherwise                           (eq. (2))
//   g_t = α σ(l_t) (Weighting<Sigmoid>), α l_t (Raw) or 1 (Unit)
// Every recursion runs the same B layers' parameters (Φ' shared); the routers are per recursion,
// named h.<base>.expert.<r>.router.w (each recursion depth is an "expert", as the paper calls it).
// CausalAux<p, q> adds p/q · mean BCE(l_t, [t ∈ S_r]) over the candidates of each recursion whose
// capacity is below 1; the BCE and the accuracy of the decision l_t > 0 are kept for every such
// recursion (models/depth_stats.hpp reports them per recursion as a depth-routed part).
// CausalRouting (inference: S_r = {t ∈ S_{r−1} : l_t > 0}) and TokenChoice<R> (each token's depth chosen once by
// an ExpertGate over the N_r depths; S_r = {t : i_t ≥ r}) run a count known only on the device: the block over
// packed rows. Both are causal and decode with recursion-wise caches (below). The block itself, in both
// layouts: assembly/recursion_blocks.hpp.
#include <array>
#include <span>
#include <utility>
#include <vector>

#include "mom/assembly/assembly.hpp"
#include "mom/assembly/chunked.hpp"
#include "mom/assembly/decode_rounds.hpp"
#include "mom/assembly/depth.hpp"
#include "mom/assembly/depth_block.hpp"
#include "mom/assembly/grouped_dispatch.hpp"
#include "mom/assembly/phi.hpp"
#include "mom/assembly/recursion_blocks.hpp"
#include "mom/routers/recursion.hpp"
#include "mom/modules/checked.hpp"

namespace mom {

namespace detail {
// Token-choice MoR's gate over the N_r depths (an ExpertGate: routers/gate.hpp), named only when used.
template <class Cfg, Dims D, int Nr, bool on = Cfg::token_choice>
struct DepthGate {
  struct Plan {};
  static constexpr index_t params = 0;
  static constexpr std::size_t tensor_count = 0;
  static constexpr void specs(TensorSpec*, index_t) {}
  static constexpr index_t flops_per_token() { return 0; }
  static constexpr index_t backward_flops_per_token() { return 0; }
  static constexpr index_t scratch(index_t) { return 0; }
};
template <class Cfg, Dims D, int Nr>
struct DepthGate<Cfg, D, Nr, true> {
  using R = typename Cfg::token_router_t;
  static_assert(ExpertGatePolicy<typename R::policy>,
                "mom::TokenChoice<R>: R must be a Router whose policy gates experts, e.g. Router<TopK<Softmax>, "
                "Renormalise<false>>");
  using Gate = typename R::policy::template gate<D, Nr, 1, false, typename R::options>;
  using Plan = typename Gate::Plan;
  static constexpr index_t params = Gate::params;
  static constexpr std::size_t tensor_count = Gate::tensors(0).size();
  static constexpr void specs(TensorSpec* out, index_t layer) {
    for (const auto& t : Gate::tensors(layer)) *out++ = t;
  }
  static constexpr index_t flops_per_token() { return Gate::flops_per_token(); }
  static constexpr index_t backward_flops_per_token() { return Gate::backward_flops_per_token(); }
  static constexpr index_t scratch(index_t rows) { return Gate::scratch(rows); }
};
}  // namespace detail

template <class... Os, class A, Dims D>
struct Executor<Recursion<Os...>, A, D> : WorkspaceViews {
  using Cfg = typename Recursion<Os...>::config;
  using Set = typename A::module_set;
  using Attn = typename Set::template attention<D>;
  using Block = detail::PlainBlockFfn<Set, D>;
  using Ffn = typename Set::template ffn<D>;
  using RAttn = typename Set::template routed_attention<D>;
  // CausalRouting (inference) and token choice: a variable number of tokens per recursion, the block over one
  // row group of packed rows.
  static constexpr bool causal = Cfg::causal_routing, token = Cfg::token_choice, packed = causal || token;
  // KVShare: recursions r >= 1 attend to recursion 0's keys and values (packed rows, every token's keys).
  static constexpr bool share_kv = Cfg::kv_share;
  static constexpr bool shares(int r) { return share_kv && r > 0; }
  static_assert(!share_kv || requires { requires RAttn::given_keys; },
                "mom::Recursion<KVShare>: the block's attention module must take its keys from another state "
                "(KeySource::Given, modules/module.hpp: a module with given_keys)");
  using DGate = detail::DepthGate<Cfg, D, A::h>;
  static_assert(std::is_same_v<typename A::phi_type, phi::Recursion>,
                "mom::Router<Recursion> assembles with phi::Recursion: Assembly<R, ModuleSet<Block<B>, Skip>, K<1>, "
                "H<Nr>, phi::Recursion>");
  static_assert(sizeof(VerifyModule<Attn>) > 0 && sizeof(VerifyModule<typename Set::template ffn<D>>) > 0);
  static_assert(!ModuleWithAuxLoss<Attn> && !ModuleWithAuxLoss<typename Set::template ffn<D>>,
                "mom::phi::Recursion: modules with an auxiliary loss (SigmaMoE, SwitchHead) are not supported in the "
                "recursion block");
  // The block runs dense attention over the k_r selected tokens, which would rotate them by rank.
  static_assert(!D.rope(), "mom::Router<Recursion> does not support RoPE positions yet: the recursion block runs dense "
                           "attention over the selected tokens, which would rotate them by rank, not position");
  static constexpr Dims dims = D;
  using Blocks = detail::RecursionBlocks<Executor>;  // the block's forward / backward (assembly/recursion_blocks.hpp)
  static constexpr int Nr = A::h;                // recursions
  static constexpr int B = Set::n_attention;     // layers of the shared block
  static constexpr index_t d = D.d_model;
  static_assert(Cfg::tokens(Nr - 1, Nr, D.context) >= 1,
                "mom::Recursion: the last recursion's capacity gives k = 0 tokens per sequence at the model's context");
  static constexpr bool unit_weight = Cfg::unit_weight;
  static constexpr bool has_aux_loss = true;     // Plan::aux: CausalAux's BCE (0 without it)
  static constexpr bool is_depth_routed = true;  // read_selected / read_causal per recursion (models/depth_stats.hpp)
  // Top-k_r of a sequence depends on its later tokens: no incremental decode (infer/decoder.hpp) but with
  // CausalRouting, whose decision for a token reads that token alone.
  static constexpr bool routes_causally = packed;
  // For depth statistics, the "layers" are the recursions, every one routed.
  static constexpr int L = Nr;
  static constexpr bool routed(int) { return true; }

  static constexpr index_t tokens(int r, index_t seq) { return index_t(Cfg::tokens(r, Nr, seq)); }
  static constexpr bool full(int r) { return Cfg::full(r, Nr); }
  // Rows recursion r may run: batch·k_r, or every token with CausalRouting.
  static constexpr index_t worst_run(int r, index_t seq) { return packed ? seq : tokens(r, seq); }
  static constexpr index_t max_rows(int r, index_t batch, index_t seq) { return batch * worst_run(r, seq); }
  // The router's θ_r gets a gradient through the weight g or CausalAux's loss.
  static constexpr bool aux_on(int r) { return Cfg::causal_aux && !full(r); }
  static constexpr bool router_trained(int r) { return !token && (!unit_weight || aux_on(r)); }

  // ---- parameters: the block (the Block<B> layout, h.<base>..h.<base+B−1>), then the Nr routers (token
  // choice: the depth gate, h.<base>.router.*) ----
  static constexpr index_t router_base = Set::template params<D>;
  static constexpr index_t router_offset(int r) { return router_base + index_t(r) * d; }
  static constexpr index_t params = router_base + (token ? DGate::params : Nr * d);
  static constexpr std::size_t tensor_count = Set::template tensor_count<D> + (token ? DGate::tensor_count : std::size_t(Nr));
  static constexpr void specs(TensorSpec* out, index_t layer_base) {
    Set::template specs<D>(out, layer_base);
    out += Set::template tensor_count<D>;
    if constexpr (token) DGate::specs(out, layer_base);
    else
      for (int r = 0; r < Nr; ++r) *out++ = TensorSpec{"router.w", layer_base, 1, d, Init::Normal, r};
  }

  // ---- cost model (FLOPs: 2·m·n·k per product, causal attention among the k_r tokens) ----------
  static constexpr index_t block_linear_flops =
      B * (Attn::kv_flops + Attn::query_flops + Block::flops);
  static constexpr index_t block_linear_backward_flops =
      B * (Attn::kv_backward_flops + Attn::query_backward_flops + Block::backward_flops);
  static constexpr index_t pairs_among(index_t c) { return c * (c + 1) / 2; }
  // Recursion r over one sequence of `seq` tokens that ran `run` of them, `pairs` (query, key) pairs.
  static constexpr index_t recursion_flops(index_t seq, index_t run, index_t pairs) {
    return (token ? 0 : seq * 2 * d) + run * block_linear_flops + B * Attn::pair_flops * pairs;
  }
  static constexpr index_t recursion_backward_flops(int r, index_t seq, index_t run, index_t pairs) {
    return (router_trained(r) ? seq * 4 * d : 0) + run * block_linear_backward_flops + B * Attn::pair_backward_flops * pairs;
  }
  // KVShare, r >= 1: the keys and values of every token (recomputed from recursion 0's saved inputs: the same
  // values), queries and FFN for the run tokens; `pairs` = Σ (position + 1) over them.
  static constexpr index_t shared_recursion_flops(index_t seq, index_t run, index_t pairs) {
    return (token ? 0 : seq * 2 * d) + B * (seq * Attn::kv_flops + run * (Attn::query_flops + Block::flops)) +
           B * Attn::pair_flops * pairs;
  }
  static constexpr index_t shared_recursion_backward_flops(int r, index_t seq, index_t run, index_t pairs) {
    return (router_trained(r) ? seq * 4 * d : 0) +
           B * (seq * Attn::kv_backward_flops + run * (Attn::query_backward_flops + Block::backward_flops)) +
           B * Attn::pair_backward_flops * pairs;
  }
  // Worst case of Σ (position + 1) over c of seq tokens: the last c positions.
  static constexpr index_t pairs_to_all(index_t c, index_t seq) { return c * seq - c * (c - 1) / 2; }
  static constexpr index_t flops_per_sequence(index_t seq) {
    index_t total = seq * DGate::flops_per_token();  // token choice's gate, once per token
    for (int r = 0; r < Nr; ++r) {
      const index_t c = worst_run(r, seq);
      total += shares(r) ? shared_recursion_flops(seq, c, pairs_to_all(c, seq)) : recursion_flops(seq, c, pairs_among(c));
    }
    return total;
  }
  static constexpr index_t flops_per_token(index_t seq) { return flops_per_sequence(seq) / seq; }
  static constexpr index_t backward_flops_per_token(index_t seq) {
    index_t total = seq * DGate::backward_flops_per_token();
    for (int r = 0; r < Nr; ++r) {
      const index_t c = worst_run(r, seq);
      total += shares(r) ? shared_recursion_backward_flops(r, seq, c, pairs_to_all(c, seq))
                         : recursion_backward_flops(r, seq, c, pairs_among(c));
    }
    return total / seq;
  }

  // ---- workspace ----------------------------------------------------------------------------
  struct LayerWs {
    typename Attn::Saved attn{};                                  // training: dense over (batch, k_r)
    typename RAttn::template GroupedSaved<1> gattn{};             // CausalRouting, token choice: the run rows
    typename Block::Saved ffn{};
    index_t u = 0, y = 0;  // u_j and y_{j+1} (the last layer's y is fo)
  };
  struct Rec {
    std::array<LayerWs, std::size_t(B)> layer{};
    index_t logits = 0, gate = 0, mask = 0, scores = 0;  // T [n] each (token choice: gate = c_t, scores = decision)
    index_t idx = 0;                                     // token_t [m]: S_r, flat, ascending
    index_t groups = 0;                                  // token_t [2]: CausalRouting's row group {0, count}
    index_t wsel = 0, xg = 0, fo = 0;                    // T [m], [m×d], [m×d]: g on S_r, x̃, f
    index_t cand_l = 0, cand_t = 0, bce = 0;             // T [m_prev], [m_prev] (r >= 1), [2]
    index_t x_next = 0;                                  // T [n×d]
  };
  struct Plan {
    std::array<Rec, std::size_t(Nr)> rec{};
    index_t alive = 0;  // token_t [n]: CausalRouting's "ran every recursion so far"
    index_t aux = 0;
    typename DGate::Plan gate{};  // token choice
  };
  static constexpr Plan plan(Arena& a, index_t batch, index_t seq) {
    const index_t n = batch * seq;
    Plan p{};
    for (int r = 0; r < Nr; ++r) {
      Rec& R = p.rec[std::size_t(r)];
      const index_t kr = tokens(r, seq), m = max_rows(r, batch, seq), mp = r == 0 ? n : batch * tokens(r - 1, seq);
      R.logits = a.take(n);
      R.gate = a.take(n);
      R.mask = a.take(n);
      R.scores = a.take(n);
      R.idx = a.take(tok_elems(m));
      R.groups = a.take(tok_elems(2));
      R.wsel = a.take(m);
      R.xg = a.take(m * d);
      for (LayerWs& l : R.layer) {
        if (shares(r)) l.gattn = RAttn::template plan_grouped<1, KeySource::Given>(a, n, m);
        else if (packed) l.gattn = RAttn::template plan_grouped<1, KeySource::Routed>(a, n, m);
        else l.attn = Attn::plan(a, batch, kr);
        l.u = a.take(m * d);
        l.ffn = Block::plan(a, m);
        l.y = a.take(m * d);
      }
      R.fo = a.take(m * d);
      if (r > 0) {  // recursion 0's candidates are its own logits and mask (candidates())
        R.cand_l = a.take(mp);
        R.cand_t = a.take(mp);
      }
      R.bce = a.take(2);
      R.x_next = a.take(n * d);
    }
    p.alive = a.take(tok_elems(n));
    p.aux = a.take(1);
    if constexpr (token) p.gate = DGate::Gate::plan(a, n);
    return p;
  }
  struct Scratch {
    index_t fm = 0, df = 0, dy = 0, dy2 = 0, dw = 0, dgate = 0, dlogits = 0, dcand = 0, gate = 0, dshared = 0, module = 0,
            total = 0;
  };
  static constexpr Scratch scratch_plan(index_t batch, index_t seq) {
    const index_t n = batch * seq;
    Arena a;
    Scratch s{};
    s.fm = a.take(n * d);
    s.df = a.take(n * d);
    s.dy = a.take(n * d);
    s.dw = a.take(n);
    s.dgate = a.take(n);
    s.dlogits = a.take(n);
    s.dcand = a.take(n);
    if constexpr (token || share_kv) s.dy2 = a.take(n * d);
    if constexpr (token) s.gate = a.take(DGate::scratch(n));
    if constexpr (share_kv) s.dshared = a.take(B * n * d);  // dL/d(recursion 0's layer inputs) through the shared keys
    index_t module = std::max(guarded_scratch<Attn>(batch, seq), Block::scratch(n));
    if constexpr (packed) module = std::max(module, RAttn::template scratch_grouped<1, KeySource::Routed>(n, n));
    if constexpr (share_kv) module = std::max(module, RAttn::template scratch_grouped<1, KeySource::Given>(n, n));
    s.module = a.take(module);
    s.total = a.used;
    return s;
  }
  static constexpr index_t scratch(index_t batch, index_t seq) { return scratch_plan(batch, seq).total; }

  // ---- forward ------------------------------------------------------------------------------
  template <class Be, class T>
  static MatrixView<const T> forward(Be& be, const T* p, T* ws, const Plan& plan, MatrixView<const T> x, T* scratch,
                                     index_t batch, index_t seq, std::span<const token_t> input_tokens) {
    const index_t n = batch * seq;
    const Scratch s = scratch_plan(batch, seq);
    const std::span<T> aux = sp(ws + plan.aux, 1);
    be.zero(aux);
    if constexpr (token) gate_forward(be, p, ws, plan, x, aux, input_tokens);
    for (int r = 0; r < Nr; ++r) {
      const Rec& R = plan.rec[std::size_t(r)];
      const index_t kr = tokens(r, seq), m = batch * kr;
      const MatrixView<T> x_next = mv(ws + R.x_next, n, d), logits = mv(ws + R.logits, n, 1);
      be.copy(x_next.flat(), sp(x.data, n * d));  // x_{r+1} = x_r for every token, then + g·f on S_r
      if constexpr (!token) be.linear_forward(logits, x, mv(p + router_offset(r), 1, d), std::span<const T>{});
      if constexpr (packed) {
        if (causal && r == 0) be.fill(sp(toks(ws, plan.alive), n), token_t(1));
        select_packed(be, ws, plan, r, n);
        Blocks::block_forward_packed(be, p, ws, R, x, x_next, scratch + s.fm, n, seq, shares(r) ? &plan.rec[0] : nullptr);
      } else if (m > 0) {
        select(be, ws, plan, r, batch, seq);
        if (!full(r)) causal_forward(be, ws, plan, r, aux, batch, seq);
        if (shares(r)) {  // the k_r tokens of every sequence as one packed row group {0, m}
          be.fill(sp(toks(ws, R.groups), 1), token_t(0));
          be.fill(sp(toks(ws, R.groups) + 1, 1), token_t(m));
          Blocks::block_forward_packed(be, p, ws, R, x, x_next, scratch + s.fm, m, seq, &plan.rec[0]);
        } else {
          Blocks::block_forward(be, p, ws, R, x, x_next, scratch + s.fm, aux, batch, kr);
        }
      }
      x = x_next;
    }
    return x;
  }

  // S_r: the top-k_r of every sequence among the candidates S_{r−1}: the scores of the other tokens are
  // pushed to −big (exactly l_t for a candidate: −big + big·1 + l_t), so with k_r ≤ k_{r−1} only
  // candidates are picked. The weights g on S_r.
  template <class Be, class T>
  static void select(Be& be, T* ws, const Plan& plan, int r, index_t batch, index_t seq) {
    const Rec& R = plan.rec[std::size_t(r)];
    const index_t n = batch * seq, m = batch * tokens(r, seq);
    const auto idx = sp(toks(ws, R.idx), m);
    const std::span<const T> logits = sp<const T>(ws + R.logits, n);
    std::span<const T> scores = logits;
    if (r > 0) {
      constexpr T big = T(1e30);
      const std::span<T> masked = sp(ws + R.scores, n);
      be.fill(masked, -big);
      be.axpy(masked, big, sp<const T>(ws + plan.rec[std::size_t(r - 1)].mask, n));
      be.add_forward(masked, std::span<const T>(masked), logits);
      scores = masked;
    }
    be.select_topc_per_sequence(idx, scores, batch, seq);
    be.selection_mask(sp(ws + R.mask, n), std::span<const token_t>(idx));
    weights(be, ws, R, n, m, [&](MatrixView<T> out, MatrixView<const T> in) {
      be.gather_rows(out, in, std::span<const token_t>(idx));
    });
  }

  // g on the rows: α σ(l), α l or nothing (Unit); gather(out [m×1], in [n×1]) takes the run rows' entries.
  template <class Be, class T, class Gather>
  static void weights(Be& be, T* ws, const Rec& R, index_t n, index_t m, Gather&& gather) {
    if constexpr (!unit_weight) {
      if constexpr (Cfg::sigmoid) {
        be.sigmoid_forward(sp(ws + R.gate, n), sp<const T>(ws + R.logits, n));
        gather(mv(ws + R.wsel, m, 1), mv<const T>(ws + R.gate, n, 1));
      } else {
        gather(mv(ws + R.wsel, m, 1), mv<const T>(ws + R.logits, n, 1));
      }
      if constexpr (Cfg::alpha != 1.0) be.scale(sp(ws + R.wsel, m), T(Cfg::alpha));
    }
  }

  // Token choice: the gate picks each token's depth i_t (its last recursion) and weight g_t, once, from the
  // part's input; its losses (balance, z-loss) join the part's.
  template <class Be, class T>
  static void gate_forward(Be& be, const T* p, T* ws, const Plan& plan, MatrixView<const T> x, std::span<T> aux,
                           std::span<const token_t> input_tokens) {
    DGate::Gate::forward(be, p + router_base, ws, plan.gate, x, input_tokens);
    be.axpy(aux, T(1), sp<const T>(ws + DGate::Gate::selection(plan.gate).loss, 1));
  }
  template <class T>
  static std::span<const token_t> depth_picks(const T* ws, const Plan& plan, index_t n) {
    return {toks(ws, DGate::Gate::selection(plan.gate).picks), std::size_t(n)};
  }

  // The run rows of recursion r, packed (ascending; the count stays on the device: the block runs over the row
  // group {0, count}), and their update factors in wsel.
  //   CausalRouting: S_r = {t ∈ S_{r−1} : l_t > 0}, every token in play at a recursion of capacity 1 (the
  //                  alive flags carry S_{r−1}); g_t as in training
  //   token choice:  S_r = {t : i_t ≥ r}; c_t = g_t where i_t = r, 1 before (depth_choice_rows)
  static RowGroups run_groups(const auto* ws, const Rec& R) { return {toks(ws, R.groups), 1}; }
  template <class Be, class T>
  static void select_packed(Be& be, T* ws, const Plan& plan, int r, index_t n) {
    const Rec& R = plan.rec[std::size_t(r)];
    const auto idx = sp<const token_t>(toks(ws, R.idx), n);
    be.fill(sp(toks(ws, R.groups), 1), token_t(0));
    if constexpr (token) {
      be.depth_choice_rows(sp(ws + R.scores, n), sp(ws + R.gate, n), depth_picks(ws, plan, n),
                           sp<const T>(ws + DGate::Gate::selection(plan.gate).weights, n), r);
      be.skip_select(sp(toks(ws, R.idx), n), sp(toks(ws, R.groups) + 1, 1), std::span<token_t>{},
                     sp<const T>(ws + R.scores, n));
      be.gather_rows(mv(ws + R.wsel, n, 1), mv<const T>(ws + R.gate, n, 1), idx, run_groups(ws, R));
    } else {
      std::span<const T> decision = sp<const T>(ws + R.logits, n);
      if (full(r)) {
        be.fill(sp(ws + R.scores, n), T(1));
        decision = sp<const T>(ws + R.scores, n);
      }
      be.skip_select(sp(toks(ws, R.idx), n), sp(toks(ws, R.groups) + 1, 1), sp(toks(ws, plan.alive), n), decision);
      const RowGroups g = run_groups(ws, R);
      weights(be, ws, R, n, n, [&](MatrixView<T> out, MatrixView<const T> in) { be.gather_rows(out, in, idx, g); });
    }
  }

  // Recursion r's candidates (S_{r−1}; every token at r = 0): their logits and 0/1 targets [t ∈ S_r], the
  // token's own rows at r = 0, the rows gathered by causal_forward after.
  template <class T>
  static std::pair<std::span<const T>, std::span<const T>> candidates(const T* ws, const Rec& R, int r, index_t mp) {
    if (r == 0) return {sp<const T>(ws + R.logits, mp), sp<const T>(ws + R.mask, mp)};
    return {sp<const T>(ws + R.cand_l, mp), sp<const T>(ws + R.cand_t, mp)};
  }
  // The candidates' BCE and the accuracy of the decision l_t > 0 into R.bce; CausalAux adds p/q · BCE to the loss.
  template <class Be, class T>
  static void causal_forward(Be& be, T* ws, const Plan& plan, int r, std::span<T> aux, index_t batch, index_t seq) {
    const Rec& R = plan.rec[std::size_t(r)];
    const index_t n = batch * seq, mp = r == 0 ? n : batch * tokens(r - 1, seq);
    if (r > 0) {
      const auto prev = sp<const token_t>(toks(ws, plan.rec[std::size_t(r - 1)].idx), mp);
      be.gather_rows(mv(ws + R.cand_l, mp, 1), mv<const T>(ws + R.logits, n, 1), prev);
      be.gather_rows(mv(ws + R.cand_t, mp, 1), mv<const T>(ws + R.mask, n, 1), prev);
    }
    const auto [logits, targets] = candidates(ws, R, r, mp);
    be.bce_logits_forward(sp(ws + R.bce, 2), logits, targets);
    if constexpr (Cfg::causal_aux) be.axpy(aux, T(Cfg::aux_coef), sp<const T>(ws + R.bce, 1));
  }

  // ---- backward -----------------------------------------------------------------------------
  // dres: dL/dx_{Nr} on entry, dL/dx_0 on exit. A recursion's identity path (every token) leaves dres as
  // it is; the block adds its input gradient on S_r, the router its score's.
  template <class Be, class T>
  static void backward(Be& be, const T* p, T* g, const T* ws, const Plan& plan, MatrixView<const T> x0,
                       MatrixView<T> dres, T* sc, index_t batch, index_t seq) {
    MOM_CHECK(!causal, "Router<Recursion<..., CausalRouting>> is an inference mode (autoregressive sampling): train the "
              "same type without CausalRouting");
    const index_t n = batch * seq;
    const Scratch s = scratch_plan(batch, seq);
    T* dshared = share_kv ? sc + s.dshared : nullptr;
    if constexpr (share_kv) be.zero(sp(dshared, B * n * d));
    if constexpr (token) {
      token_backward(be, p, g, ws, plan, x0, dres, sc, s, n, seq, dshared);
      return;
    }
    for (int r = Nr - 1; r >= 0; --r) {
      const Rec& R = plan.rec[std::size_t(r)];
      const index_t kr = tokens(r, seq), m = batch * kr;
      if (m == 0) continue;  // nobody ran recursion r (a short sequence): no loss reads its router
      const MatrixView<const T> x = r == 0 ? x0 : mv<const T>(ws + plan.rec[std::size_t(r - 1)].x_next, n, d);
      const std::span<T> dw = sp(sc + s.dw, m), dlogits = sp(sc + s.dlogits, n);
      if (shares(r))
        Blocks::block_backward_packed(be, p, g, ws, R, x, dres, sc, s, m, seq, &plan.rec[0], dshared);
      else
        Blocks::block_backward(be, p, g, ws, R, dres, sc, s, batch, kr, r == 0 ? dshared : nullptr);
      be.zero(dlogits);
      const auto idx = sp<const token_t>(toks(ws, R.idx), m);
      if constexpr (!unit_weight) {  // dL/dg back to the score
        if constexpr (Cfg::alpha != 1.0) be.scale(dw, T(Cfg::alpha));
        if constexpr (Cfg::sigmoid) {
          const std::span<T> dgate = sp(sc + s.dgate, n);
          be.zero(dgate);
          be.scatter_add_rows(mv(dgate.data(), n, 1), mv<const T>(dw.data(), m, 1), idx);
          be.sigmoid_backward(dlogits, sp<const T>(ws + R.gate, n), std::span<const T>(dgate));
        } else {
          be.scatter_add_rows(mv(dlogits.data(), n, 1), mv<const T>(dw.data(), m, 1), idx);
        }
      }
      if (aux_on(r)) {
        const index_t mp = r == 0 ? n : batch * tokens(r - 1, seq);
        const std::span<T> dc = sp(sc + s.dcand, mp);
        const auto [logits, targets] = candidates(static_cast<const T*>(ws), R, r, mp);
        be.zero(dc);
        be.bce_logits_backward(dc, logits, targets, T(Cfg::aux_coef / double(mp)));
        if (r == 0) be.axpy(dlogits, T(1), std::span<const T>(dc));
        else
          be.scatter_add_rows(mv(dlogits.data(), n, 1), mv<const T>(dc.data(), mp, 1),
                              sp<const token_t>(toks(ws, plan.rec[std::size_t(r - 1)].idx), mp));
      }
      if (router_trained(r))
        be.linear_backward(dres, mv(g + router_offset(r), 1, d), std::span<T>{}, mv<const T>(dlogits.data(), n, 1), x,
                           mv(p + router_offset(r), 1, d));
    }
  }

  // Token choice: each recursion's block backward over its packed rows, dL/dc_t back to the gate weight of
  // the tokens whose last recursion it is, then the gate (its input is the part's input x_0).
  template <class Be, class T>
  static void token_backward(Be& be, const T* p, T* g, const T* ws, const Plan& plan, MatrixView<const T> x0,
                             MatrixView<T> dres, T* sc, const Scratch& s, index_t n, index_t seq, T* dshared) {
    const std::span<T> dweights = sp(sc + s.dcand, n), dcoef = sp(sc + s.dgate, n);
    be.zero(dweights);
    for (int r = Nr - 1; r >= 0; --r) {
      const Rec& R = plan.rec[std::size_t(r)];
      const MatrixView<const T> x = r == 0 ? x0 : mv<const T>(ws + plan.rec[std::size_t(r - 1)].x_next, n, d);
      Blocks::block_backward_packed(be, p, g, ws, R, x, dres, sc, s, n, seq, shares(r) ? &plan.rec[0] : nullptr, dshared);
      be.zero(dcoef);
      be.scatter_add_rows(mv(dcoef.data(), n, 1), mv<const T>(sc + s.dw, n, 1), sp<const token_t>(toks(ws, R.idx), n),
                          std::span<const T>{}, run_groups(ws, R));
      be.depth_choice_rows_backward(dweights, std::span<const T>(dcoef), depth_picks(ws, plan, n), r);
    }
    // The gate takes dL/d(weight) in its selection's group order (core/selection.hpp): position j is slot row_slot[j].
    const auto& sel = DGate::Gate::selection(plan.gate);
    const std::span<T> dwp = sp(sc + s.dw, n);
    be.gather_rows(mv(dwp.data(), n, 1), mv<const T>(dweights.data(), n, 1), sp<const token_t>(toks(ws, sel.row_slot), n));
    DGate::Gate::backward(be, p + router_base, g + router_base, ws, plan.gate, x0, dres, std::span<const T>(dwp),
                          sc + s.gate);
  }
  // ---- incremental decoding with CausalRouting (infer/decoder.hpp; docs/inference.md) ------------
  // A new token's recursions depend on its own state only (l_t > 0 at each recursion while it is in play),
  // so a step is the causal forward over the step's rows (batch = rows, seq = 1). Recursion-wise caching
  // (the paper's §2.2.2): one key/value cache per (recursion, layer of the block), written only by the tokens
  // that run that recursion, one row after another per sequence; a query sees exactly training's keys under
  // CausalRouting: the earlier tokens of its sequence that ran the recursion. A token that exited writes
  // nothing there.
  template <class Be>
  static constexpr bool decodes_on = packed && RoutedDecodingSequenceMixerOn<Attn, Be>;
  // Its decode reads the step's rows to the host (DecodeRows): infer::Decoder runs it op by op, not as a CUDA graph.
  static constexpr bool decode_reads_host = true;
  struct DecodePlan {
    Plan plan{};  // the causal forward's workspace for `rows` tokens of one position
    std::array<std::array<index_t, std::size_t(B)>, std::size_t(Nr)> k{}, v{};  // [slots·max_len × d] each
    typename Attn::DecodeSaved attn{};
    index_t a = 0;       // [rows × d]: a module's output
    index_t counts = 0;  // token_t [Nr × slots]: how many of a sequence's tokens each recursion's caches hold
    index_t staged = 0;  // the run rows' slots, positions and cache rows (detail::DecodeRows::stage)
  };
  static constexpr DecodePlan plan_decode(Arena& a, index_t slots, index_t max_len, index_t rows) {
    DecodePlan p{};
    p.plan = plan(a, rows, 1);
    for (auto* kv : {&p.k, &p.v})  // KVShare: recursion 0's caches only
      for (int r = 0; r < (share_kv ? 1 : Nr); ++r)
        for (index_t& c : (*kv)[std::size_t(r)]) c = a.take(slots * max_len * d);
    p.attn = Attn::plan_decode(a, rows);
    p.a = a.take(rows * d);
    p.counts = a.take(tok_elems(Nr * slots));
    p.staged = detail::DecodeRows::take(a, rows);
    return p;
  }
  template <class Be, class T>
  static MatrixView<const T> decode(Be& be, const T* p, T* ws, const DecodePlan& dp, MatrixView<const T> x,
                                    std::span<const index_t> slot, std::span<const index_t> pos, index_t slots,
                                    index_t max_len, std::span<const token_t> input_tokens) {
    const index_t rows = x.rows;
    const Plan& plan = dp.plan;
    detail::DecodeRows& host = detail::DecodeRows::begin(be, slot, pos, rows);
    host.load_counts(be, ws, dp.counts, Nr, slots);
    be.fill(sp(toks(ws, plan.alive), rows), token_t(1));
    const std::span<T> aux = sp(ws + plan.aux, 1);
    be.zero(aux);
    const MatrixView<T> a = mv(ws + dp.a, rows, d);
    if constexpr (token) gate_forward(be, p, ws, plan, x, aux, input_tokens);
    for (int r = 0; r < Nr; ++r) {
      const Rec& R = plan.rec[std::size_t(r)];
      const MatrixView<T> x_next = mv(ws + R.x_next, rows, d);
      be.copy(x_next.flat(), sp(x.data, rows * d));
      if constexpr (!token)
        be.linear_forward(mv(ws + R.logits, rows, 1), x, mv(p + router_offset(r), 1, d), std::span<const T>{});
      select_packed(be, ws, plan, r, rows);
      token_t run = 0;  // the count alone: no per-step allocation
      be.to_host(std::span<token_t>(&run, 1), std::span<const token_t>(toks(ws, R.groups) + 1, 1));
      if (run > 0) {  // the run rows' sequences, positions and cache rows (host), then the block over them
        const auto idx = sp<const token_t>(toks(ws, R.idx), run);
        be.to_host(std::span<token_t>(host.idx.data(), std::size_t(run)), idx);
        host.place(0, run, shares(r) ? -1 : r, slots);  // KVShare: a query's own row is its position
        const auto rr = host.stage(be, ws, dp.staged, run);
        const MatrixView<T> xg = mv(ws + R.xg, run, d), fo = mv(ws + R.fo, run, d), ar = a.row_block(0, run);
        be.gather_rows(xg, x, idx);
        MatrixView<const T> y = xg;
        for (int j = 0; j < B; ++j) {
          const LayerWs& l = R.layer[std::size_t(j)];
          const T* pa = p + Set::template attention_offset<D>(j);
          const std::size_t c = shares(r) ? 0 : std::size_t(r);  // KVShare: recursion 0's keys, nothing written
          const MatrixView<T> kc = mv(ws + dp.k[c][std::size_t(j)], slots * max_len, d);
          const MatrixView<T> vc = mv(ws + dp.v[c][std::size_t(j)], slots * max_len, d);
          const MatrixView<T> u = mv(ws + l.u, run, d), out = j == B - 1 ? fo : mv(ws + l.y, run, d);
          if (!shares(r))
            Attn::decode_keys(be, pa, ws, dp.attn, y, kc, vc, rr.slot, rr.pos, rr.at, max_len);
          Attn::decode_queries(be, pa, ws, dp.attn, y, ar, MatrixView<const T>(kc), MatrixView<const T>(vc), rr.slot,
                               rr.pos, rr.at, max_len);
          be.add_forward(u.flat(), sp(y.data, run * d), sp<const T>(ar.data, run * d));
          Block::forward_residual(be, p, ws, l.ffn, j, MatrixView<const T>(u), out, ar, aux);
          y = out;
        }
        if constexpr (!Cfg::add_block_output) be.axpy(fo.flat(), T(-1), sp<const T>(xg.data, run * d));
        be.scatter_add_rows(x_next, MatrixView<const T>(fo), idx,
                            unit_weight && !token ? std::span<const T>{} : sp<const T>(ws + R.wsel, run));
      }
      x = x_next;
    }
    host.store_counts(be, ws, dp.counts);
    return x;
  }

  // ---- read-back: selections, causal accuracy, realised FLOPs --------------------------------
  // Flat indices of the tokens recursion r ran in the last forward (ascending).
  template <class Be, class T>
  static std::vector<token_t> read_selected(Be& be, const T* ws, const Plan& plan, int r, index_t batch, index_t seq) {
    token_t m = token_t(batch * tokens(r, seq));
    if constexpr (packed)
      be.to_host(std::span<token_t>(&m, 1), std::span<const token_t>(toks(ws, plan.rec[std::size_t(r)].groups) + 1, 1));
    std::vector<token_t> out(static_cast<std::size_t>(m));
    be.to_host(std::span<token_t>(out), std::span<const token_t>(toks(ws, plan.rec[std::size_t(r)].idx), out.size()));
    return out;
  }
  // Per recursion with capacity below 1: the BCE of the decision l_t > 0 against t ∈ S_r over the
  // candidates, and its correct decisions over all tokens (a token that exited before recursion r is
  // not run at r by the decision either: counted correct).
  using CausalStats = detail::DepthCausalStats;
  template <class Be, class T>
  static std::vector<CausalStats> read_causal(Be& be, const T* ws, const Plan& plan, index_t batch, index_t seq) {
    std::vector<CausalStats> out;
    const index_t n = batch * seq;
    for (int r = 0; r < Nr; ++r) {
      if (packed || full(r) || tokens(r, seq) == 0) continue;  // CausalRouting, token choice: no top-k to compare with
      T v[2];
      be.to_host(std::span<T>(v, 2), std::span<const T>(ws + plan.rec[std::size_t(r)].bce, 2));
      const index_t mp = r == 0 ? n : batch * tokens(r - 1, seq);
      out.push_back({r, double(v[0]), double(v[1]) + double(n - mp), double(n)});
    }
    return out;
  }
  // Forward (backward) FLOPs of the last forward, from the tokens each recursion ran per sequence.
  template <bool backward = false, class Be, class T>
  static index_t realised_flops(Be& be, const T* ws, const Plan& plan, index_t batch, index_t seq) {
    index_t total = batch * seq * (backward ? DGate::backward_flops_per_token() : DGate::flops_per_token());
    for (int r = 0; r < Nr; ++r) {
      std::vector<index_t> run(std::size_t(batch), 0), pairs(std::size_t(batch), 0);
      for (token_t t : read_selected(be, ws, plan, r, batch, seq)) {
        const auto b = std::size_t(t / seq);
        ++run[b];
        pairs[b] += shares(r) ? t % seq + 1 : run[b];  // keys: every earlier token (KVShare), or the earlier run ones
      }
      for (std::size_t b = 0; b < run.size(); ++b) {
        if constexpr (backward)
          total += shares(r) ? shared_recursion_backward_flops(r, seq, run[b], pairs[b])
                             : recursion_backward_flops(r, seq, run[b], pairs[b]);
        else
          total += shares(r) ? shared_recursion_flops(seq, run[b], pairs[b]) : recursion_flops(seq, run[b], pairs[b]);
      }
    }
    return total;
  }
};

// Autoregressive sampling of a Mixture-of-Recursions trained with CausalAux: the same parameters routed by
// the router's sign (CausalRouting) instead of the top-k_r (assembly/depth.hpp declares causal_sampling_arch).
template <class... Os, class M, class Kn, class Hn>
  requires(Recursion<Os...>::config::causal_aux && !Recursion<Os...>::config::causal_routing)
struct causal_sampling_arch<Assembly<Router<Recursion<Os...>>, M, Kn, Hn, phi::Recursion>> {
  using type = Assembly<Router<Recursion<Os..., CausalRouting>>, M, Kn, Hn, phi::Recursion>;
};

// Mixture-of-Recursions over a shared block of B layers, Nr recursions, router options appended (expert choice;
// token choice with TokenChoice<R>).
template <int B, int Nr, class... Options>
using MoR = Assembly<Router<Recursion<Options...>>, ModuleSet<Block<B>, Skip>, K<1>, H<Nr>, phi::Recursion>;
// The paper's preferred "middle-cycle" sharing: the first and last layers are unshared, the B layers
// between them recurse (same layer names as Dense<B + 2>, plus the routers).
template <int B, int Nr, class... Options>
using MoRMiddleCycle = Chunked<Layer, MoR<B, Nr, Options...>, Layer>;

}  // namespace mom

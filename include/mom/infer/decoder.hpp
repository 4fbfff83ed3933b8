#pragma once
// Incremental decoding with a key/value cache: a Decoder holds, for `slots` independent sequences of up
// to `max_len` tokens, every attention use's keys and values, so one new token costs one pass over the
// weights plus its attention over the cached positions, instead of a forward over the whole window.
//
//   auto model = Model::make<cpu::Backend<float>>(1);          // trained parameters loaded into it
//   infer::Decoder dec(model, /*slots=*/4, /*max_len=*/Model::dims.context);   // the only allocation
//   dec.prefill(prompts);                     // prompts[b] into slot b (lengths may differ), in passes of prompt tokens
//   auto logits = dec.step(next_tokens);      // one token per slot -> [slots × vocab]
//   auto out = infer::generate(dec, prompts, {.max_new_tokens = 100, .sampling = {.temperature = 0.8}});
//
// Exact: the logits of a token are those of a full forward over its sequence up to it (the same ops
// per row; tests/models/decode_test.cpp checks it in double to 1e-12). An architecture decodes when
// every part's executor meets AssemblyDecoderOn: the dense stack, parameter sharing, token-choice MoE
// (MoE, MoE(share), MoDE integrated), MoM, layer-skip / early exit and Mixture-of-Depths routed by its
// causal method; Decoder's static_asserts name what does not (non-causal routing: MoD's top-C, MoDE staged,
// expert-choice MoE).
//
// Backends: the CPU and CUDA backends both decode (DecodeBackend). The decoder keeps the step's slots,
// positions and tokens on the host, where it checks them, and copies them into its workspace for the parts
// (one ordered host -> backend copy each per step: on CUDA no wait for the GPU). The routed executors
// (MoM, layer-skip, causal MoD, MoR) read their picks back to the host each round (a wait on CUDA).
// step() returns logits in backend memory; last_logits() is host memory on every backend.
//
// CUDA graphs: on a backend that records them (RecordsGraphs: cuda::Backend) and for an architecture whose decode
// stays on the device (no executor with decode_reads_host: the dense stack, sharing, token-choice MoE, MoEUT,
// ModuleFormer), a step of every slot in slot order (step(tokens); generate's steps while every sequence runs) runs
// op by op once, is recorded as one graph on its next call and is replayed from then on: one launch per token
// instead of one per op. The graph reads the step's positions and tokens from the workspace, where each step
// copies them first. A recording the backend refuses leaves the decoder op by op; use_graphs(false) asks for that.
#include <algorithm>
#include <concepts>
#include <cstdint>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "mom/backend/backend_concept.hpp"
#include "mom/core/check.hpp"
#include "mom/core/layout.hpp"
#include "mom/core/tensor.hpp"
#include "mom/assembly/decode_rounds.hpp"
#include "mom/models/runtime.hpp"

namespace mom::infer {

// An executor that decodes incrementally on backend Be (assembly/sequential.hpp has one):
//   decodes_on<Be>                      true when its modules can (modules/module.hpp, DecodingSequenceMixerOn)
//   DecodePlan plan_decode(Arena&, slots, max_len, rows)   its caches and step workspace
//   decode(be, p, ws, plan, x, slot, pos, slots, max_len, tokens) -> the rows' residual stream after the part
//                                       (slot, pos, tokens: the step's rows' sequences, positions and token
//                                       ids, in backend memory as every op takes them)
template <class E, class Be, class T = typename Be::scalar>
concept AssemblyDecoderOn =
    requires { { E::template decodes_on<Be> } -> std::convertible_to<bool>; } && E::template decodes_on<Be> &&
    requires(Arena& a, Be& be, const T* p, T* ws, const typename E::DecodePlan& plan, MatrixView<const T> x,
             std::span<const index_t> s, std::span<const token_t> tok, index_t i) {
      { E::plan_decode(a, i, i, i) } -> std::same_as<typename E::DecodePlan>;
      { E::decode(be, p, ws, plan, x, s, s, i, i, tok) } -> std::same_as<MatrixView<const T>>;
    };

// The backend ops a decode step uses beyond the training ones (cpu/decode.hpp).
template <class Be, class T = typename Be::scalar>
concept DecodeBackend = requires(const Be& be, MatrixView<T> m, MatrixView<const T> c, std::span<const index_t> s,
                                 std::span<const token_t> tok, index_t i) {
  be.embedding_forward(m, tok, c, c, s);  // row r at position s[r]
  be.kv_write(m, m, c, s, s, i);
  be.attention_decode(m, c, c, c, s, s, i, i);
};

// A backend that records the ops a function enqueues as a graph and replays it (cuda::Backend, backend/cuda/graph.hpp).
template <class Be>
concept RecordsGraphs = requires(const Be& be, const typename Be::Graph& g) {
  { be.record([] {}) } -> std::same_as<typename Be::Graph>;
  be.replay(g);
};

// An executor whose decode reads the step's rows back to the host (MoM, layer-skip, causal MoD, MoR: DecodeRows).
template <class E>
concept DecodeReadsHost = requires { requires E::decode_reads_host; };

// An executor that says its routing is not causal (Mixture-of-Depths' expert-choice top-C during training,
// Mixture-of-Recursions' top-k per recursion, expert-choice MoE: a token's selection depends on later tokens of its sequence).
template <class E>
concept NonCausalExecutor = requires { requires !E::routes_causally; };
template <class Model>
inline constexpr bool routes_causally =
    []<class... Es>(TypeList<Es...>) { return !(NonCausalExecutor<Es> || ...); }(typename Model::core::executors{});

// True when Model decodes incrementally on backend Be: every part has a decode and routes causally.
template <class Model, class Be>
inline constexpr bool decodes = []<class... Es>(TypeList<Es...>) {
  return DecodeBackend<Be> && (AssemblyDecoderOn<Es, Be> && ...) && !(NonCausalExecutor<Es> || ...);
}(typename Model::core::executors{});

// True when Model's decode step on Be can be recorded as one graph: Be records graphs and no part reads the host.
template <class Model, class Be>
inline constexpr bool decodes_as_graph = RecordsGraphs<Be> && []<class... Es>(TypeList<Es...>) {
  return !(DecodeReadsHost<Es> || ...);
}(typename Model::core::executors{});

namespace detail {
// An executor that names its attention module (decode_sequence_mixer) and whose module cannot decode: the
// module's missing member is named by explain_decoding_sequence_mixer's static_asserts.
template <class E, class Be>
constexpr bool names_missing_decode() {
  if constexpr (requires { typename E::decode_sequence_mixer; }) {
    if constexpr (!DecodingSequenceMixerOn<typename E::decode_sequence_mixer, Be>)
      return explain_decoding_sequence_mixer<typename E::decode_sequence_mixer, Be>::named;
  }
  return false;
}
template <class Model, class Be>
inline constexpr bool decode_refusal_named =
    []<class... Es>(TypeList<Es...>) { return (names_missing_decode<Es, Be>() || ...); }(typename Model::core::executors{});
template <bool ok, class Executors>
struct DecodePlans {
  using type = std::tuple<>;  // the static_asserts of Decoder have fired
};
template <class... Es>
struct DecodePlans<true, TypeList<Es...>> {
  using type = std::tuple<typename Es::DecodePlan...>;
};
template <class Be, bool graphs>
struct GraphOf {
  struct type {};  // no graphs on this backend or for this architecture
};
template <class Be>
struct GraphOf<Be, true> {
  using type = typename Be::Graph;
};
}  // namespace detail

template <class Instance>
class Decoder {
 public:
  using Model = typename Instance::model_type;
  using Be = typename Instance::backend_type;
  using T = typename Instance::scalar;
  static constexpr Dims dims = Model::dims;
  static constexpr index_t d = dims.d_model, vocab = dims.vocab;

 private:
  using Executors = typename Model::core::executors;
  static_assert(DecodeBackend<Be>, "mom::infer::Decoder: this backend has no decode ops (kv_write, attention_decode, "
                                   "embedding_forward at positions); "
                                   "the CPU and CUDA backends have them");
  static_assert(routes_causally<Model>,
                "mom::infer::Decoder: this architecture's routing is not causal (Mixture-of-Depths' top-C, "
                "Mixture-of-Recursions' top-k per recursion and expert-choice MoE pick tokens by the later tokens too): for Mixture-of-Depths decode "
                "mom::causal_sampling_arch<Arch>::type, the same parameters routed by a trained causal method "
                "(BlockChoice<..., CausalAux<> or CausalPredictor<>>); expert-choice MoE has no causal method");
  static_assert(!DecodeBackend<Be> || !routes_causally<Model> || decodes<Model, Be> ||
                    detail::decode_refusal_named<Model, Be>,
                "mom::infer::Decoder: a part of this architecture has no incremental decode yet (its executor does "
                "not meet mom::infer::AssemblyDecoderOn)");
  static constexpr bool ok = decodes<Model, Be>;
  using Plans = typename detail::DecodePlans<ok, Executors>::type;

 public:
  // Whether whole steps run as recorded graphs (see the top of this file).
  static constexpr bool records_graphs = ok && decodes_as_graph<Model, Be>;

 private:
  using Graph = typename detail::GraphOf<Be, records_graphs>::type;

 public:
  // Caches for `slots` sequences of up to max_len (<= context) tokens, sized from the executors' plans
  // (memory_elements() of T): allocated here, never again. prefill_rows: how many prompt tokens one prefill
  // pass runs together (default: 128, at least slots, at most slots·max_len); the step workspace is sized
  // for them.
  Decoder(Instance& model, index_t slots, index_t max_len = dims.context, index_t prefill_rows = 0)
      : model_(model), slots_(slots), max_len_(max_len) {
    MOM_CHECK(slots > 0, "Decoder: slots ", slots, " must be > 0");
    MOM_CHECK(max_len > 0 && max_len <= dims.context, "Decoder: max_len ", max_len, " must be in [1, context ",
              dims.context, "]");
    MOM_CHECK(prefill_rows >= 0, "Decoder: prefill_rows ", prefill_rows, " must be >= 0 (0: the default)");
    rows_cap_ = std::min(slots * max_len, std::max(slots, prefill_rows > 0 ? prefill_rows : index_t(128)));
    Arena a;
    if constexpr (ok)
      for_each_part([&]<std::size_t i, class E>() { std::get<i>(plans_) = E::plan_decode(a, slots, max_len, rows_cap_); });
    x0_ = a.take(rows_cap_ * d);
    slot_dev_ = a.take(dispatch::index_elems(rows_cap_));
    pos_dev_ = a.take(dispatch::index_elems(rows_cap_));
    tok_dev_ = a.take(dispatch::tok_elems(rows_cap_));
    last_rows_ = a.take(dispatch::tok_elems(slots));
    lnf_ = a.take(slots * d);
    mean_ = a.take(slots);
    rstd_ = a.take(slots);
    logits_ = a.take(slots * vocab);
    last_ = a.take(slots * vocab);
    ws_ = model_.backend().template alloc<T>(a.used);
    model_.backend().zero(ws_.span());
    if constexpr (!host_memory<Be>) last_host_.resize(std::size_t(vocab));
    length_.assign(std::size_t(slots), 0);
    all_slots_.resize(std::size_t(slots));
    for (index_t s = 0; s < slots; ++s) all_slots_[std::size_t(s)] = s;
  }

  index_t slots() const { return slots_; }
  index_t max_len() const { return max_len_; }
  // Tokens fed to a slot so far (its next token goes to this position).
  index_t length(index_t slot) const { return length_.at(std::size_t(slot)); }
  // Elements of T the decoder holds (caches and step workspace).
  index_t memory_elements() const { return ws_.size(); }

  // Graphs on (the default) or off: every step op by op (records_graphs false: always off).
  void use_graphs(bool on) { use_graphs_ = on; }
  // Steps replayed from a recorded graph so far.
  index_t graph_steps() const { return graph_steps_; }

  // Empties every slot (their caches are overwritten as tokens arrive).
  void reset() { std::fill(length_.begin(), length_.end(), index_t(0)); }
  void reset(index_t slot) { length_.at(std::size_t(slot)) = 0; }

  // Appends tokens[r] to sequence slots[r] (distinct slots, each with room left). Returns the new tokens'
  // logits [rows × vocab] (valid until the next step); last_logits(slot) keeps each slot's latest row.
  MatrixView<const T> step(std::span<const index_t> slots, std::span<const token_t> tokens) {
    const index_t rows = ssize(slots);
    MOM_CHECK(rows > 0 && rows <= slots_ && ssize(tokens) == rows, "Decoder::step: ", tokens.size(), " tokens for ",
              slots.size(), " slots (1 to ", slots_, ")");
    pos_.resize(std::size_t(rows));
    for (index_t r = 0; r < rows; ++r) {
      const index_t s = slots[std::size_t(r)];
      MOM_CHECK(s >= 0 && s < slots_, "Decoder::step: slot ", s, " outside [0, ", slots_, ")");
      for (index_t q = 0; q < r; ++q)
        MOM_CHECK(slots[std::size_t(q)] != s, "Decoder::step: slot ", s, " appears twice in one step");
      MOM_CHECK(length_[std::size_t(s)] < max_len_, "Decoder::step: sequence ", s, " is full (", max_len_,
                " tokens, the decoder's max_len): start it again with reset(", s, ")");
      MOM_CHECK(tokens[std::size_t(r)] >= 0 && tokens[std::size_t(r)] < vocab, "Decoder::step: token ",
                tokens[std::size_t(r)], " outside the vocabulary [0, ", vocab, ")");
      pos_[std::size_t(r)] = length_[std::size_t(s)];
    }
    return run(slots, tokens, false);
  }

 private:
  // The rows through every part: row r is tokens[r] at position pos_[r] of sequence slots[r]. A slot may hold
  // several rows of consecutive positions, in order (prefill): each part writes a layer's keys for all rows
  // before any row reads the cache, and a row reads only the positions up to its own, so the rows see exactly
  // the tokens a step-by-step decode shows them. last_only: the head runs on each slot's last row alone (its
  // logits into last_logits), instead of on every row.
  MatrixView<const T> run(std::span<const index_t> slots, std::span<const token_t> tokens, bool last_only) {
    const index_t rows = ssize(slots);
    auto& be = model_.backend();
    T* ws = ws_.data();
    // The rows' slots, positions and tokens into backend memory, for the ops.
    const auto slot_dev = dispatch::from_host_at(be, ws, slot_dev_, slots);
    const auto pos_dev = dispatch::from_host_at(be, ws, pos_dev_, std::span<const index_t>(pos_));
    const auto tok_dev = dispatch::from_host_at(be, ws, tok_dev_, tokens);
    // A step of every slot in slot order: the head writes each slot's logits in place (last_), and the step's ops,
    // which read nothing from the host, may run as a recorded graph.
    if (!last_only && rows == slots_ && std::equal(slots.begin(), slots.end(), all_slots_.begin())) {
      const MatrixView<T> out{ws + last_, rows, vocab};
      run_whole([&] { head(forward(rows, slot_dev, pos_dev, tok_dev), out); });
      advance(slots);
      return out;
    }
    MatrixView<const T> x = forward(rows, slot_dev, pos_dev, tok_dev);
    // The head's rows: every row, or (last_only) each slot's last row, gathered in slot order of appearance.
    std::vector<index_t>& head_slots = head_slots_;  // the slot of each head row (host, reused)
    head_slots.clear();
    if (last_only) {
      last_rows_host_.clear();
      for (index_t r = 0; r < rows; ++r)
        if (r + 1 == rows || slots[std::size_t(r + 1)] != slots[std::size_t(r)]) {
          last_rows_host_.push_back(token_t(r));
          head_slots.push_back(slots[std::size_t(r)]);
        }
      const index_t k = ssize(last_rows_host_);
      const std::span<token_t> idx(dispatch::toks(ws, last_rows_), std::size_t(k));
      be.from_host(idx, std::span<const token_t>(last_rows_host_));
      // Into x0_'s first rows: the embeddings are spent by now, and the final LayerNorm then reads one buffer and
      // writes another (row i comes from row idx[i] >= i, so even an alias would read each row before it is written).
      const MatrixView<T> xl{ws + x0_, k, d};
      be.gather_rows(xl, x, std::span<const token_t>(idx));
      x = MatrixView<const T>(xl);
    } else {
      head_slots.assign(slots.begin(), slots.end());
    }
    const index_t hr = ssize(head_slots);
    const MatrixView<T> logits{ws + logits_, hr, vocab};
    head(x, logits);
    for (index_t r = 0; r < hr; ++r)
      be.copy(std::span<T>(ws + last_ + head_slots[std::size_t(r)] * vocab, std::size_t(vocab)),
              std::span<const T>(logits.row(r), std::size_t(vocab)));
    advance(slots);
    return logits;
  }

  // The rows through the embedding and every part: their residual stream [rows × d]. Row r is token tok[r] at
  // position pos[r] of sequence slot[r] (backend memory). x_0 = wte[token] + wpe[position]; a RoPE model has no
  // wpe (x_0 = wte[token]): its attention modules rotate queries and keys by pos instead.
  MatrixView<const T> forward(index_t rows, std::span<const index_t> slot, std::span<const index_t> pos,
                              std::span<const token_t> tok) {
    auto& be = model_.backend();
    T* ws = ws_.data();
    const T* p = model_.params().data();
    be.embedding_forward(MatrixView<T>{ws + x0_, rows, d}, tok, model_.param(Model::layout[0]), model_.wpe(), pos);
    MatrixView<const T> x{ws + x0_, rows, d};
    if constexpr (ok)
      for_each_part([&]<std::size_t i, class E>() {
        x = E::decode(be, p + Model::core::part_offset[i], ws, std::get<i>(plans_), x, slot, pos, slots_, max_len_,
                      tok);
      });
    return x;
  }
  // logits = LN_f(x) · wteᵀ (the tied head).
  void head(MatrixView<const T> x, MatrixView<T> logits) {
    auto& be = model_.backend();
    T* ws = ws_.data();
    const index_t hr = x.rows;
    const MatrixView<T> lnf{ws + lnf_, hr, d};
    be.layernorm_forward(lnf, std::span<T>(ws + mean_, std::size_t(hr)), std::span<T>(ws + rstd_, std::size_t(hr)),
                         x, model_.params().subspan(std::size_t(Model::core::ln_f_offset), std::size_t(d)),
                         model_.params().subspan(std::size_t(Model::core::ln_f_offset + d), std::size_t(d)));
    be.linear_forward(logits, MatrixView<const T>(lnf), model_.param(Model::layout[0]), std::span<const T>{});
  }
  void advance(std::span<const index_t> slots) {
    for (const index_t s : slots) ++length_[std::size_t(s)];
  }

  // A whole step's ops (ops(): enqueues them). With graphs: the first whole step (and the first after the
  // parameters' buffer, the backend's precision or its scratch buffers changed) runs op by op, so that what grows on
  // first use grows outside a recording (the key is taken after it); the next is recorded; the rest replay it. A
  // refused recording: op by op from then on.
  template <class Ops>
  void run_whole(Ops&& ops) {
    if constexpr (records_graphs) {
      if (use_graphs_ && graph_state_ != GraphState::failed) {
        auto& be = model_.backend();
        const GraphKey key = graph_key();
        if (graph_state_ == GraphState::warm && key == graph_key_) {
          try {
            graph_ = be.record(ops);
            graph_state_ = GraphState::recorded;
          } catch (const Error&) {
            graph_state_ = GraphState::failed;  // and this step op by op, below
          }
        }
        if (graph_state_ == GraphState::recorded && key == graph_key_) {
          be.replay(graph_);
          ++graph_steps_;
          return;
        }
        if (graph_state_ != GraphState::failed) {
          graph_state_ = GraphState::warm;
          ops();
          graph_key_ = graph_key();  // after what this step grew
          return;
        }
      }
    }
    ops();
  }
  // What a recorded step depends on beyond the workspace: the parameters' buffer, the backend's precision and its
  // scratch buffers (replaced when they grow: scratch_generation).
  struct GraphKey {
    const T* params = nullptr;
    int precision = 0;
    index_t scratch = 0;
    bool operator==(const GraphKey&) const = default;
  };
  GraphKey graph_key() {
    GraphKey k{model_.params().data(), 0, 0};
    if constexpr (requires { model_.backend().precision(); }) k.precision = int(model_.backend().precision());
    if constexpr (requires { model_.backend().scratch_generation(); }) k.scratch = model_.backend().scratch_generation();
    return k;
  }
  enum class GraphState { none, warm, recorded, failed };

 public:
  // One token for every slot, in slot order.
  MatrixView<const T> step(std::span<const token_t> tokens) { return step(std::span<const index_t>(all_slots_), tokens); }

  // Empties the slots, then feeds prompts[b] (at least one token, at most max_len) to slot b: the prompts'
  // tokens, slot after slot in position order, in passes of up to prefill_rows tokens (one pass: every
  // prompt token of the pass through each weight matrix at once, a GEMM instead of a GEMV per position). Each
  // slot's last_logits are then those of its prompt's last token.
  void prefill(std::span<const std::vector<token_t>> prompts) {
    MOM_CHECK(!prompts.empty() && ssize(prompts) <= slots_, "Decoder::prefill: ", prompts.size(),
              " prompts for ", slots_, " slots");
    for (std::size_t b = 0; b < prompts.size(); ++b)
      MOM_CHECK(!prompts[b].empty() && ssize(prompts[b]) <= max_len_, "Decoder::prefill: prompt ", b, " has ",
                prompts[b].size(), " tokens; it needs 1 to ", max_len_, " (the decoder's max_len)");
    std::vector<index_t> rows;
    std::vector<token_t> toks;
    for (std::size_t b = 0; b < prompts.size(); ++b)
      for (const token_t t : prompts[b]) {
        MOM_CHECK(t >= 0 && t < vocab, "Decoder::prefill: token ", t, " of prompt ", b, " outside the vocabulary [0, ",
                  vocab, ")");
        rows.push_back(index_t(b));
        toks.push_back(t);
      }
    reset();  // only once every prompt is valid: a refused prefill leaves the slots as they were
    for (std::size_t at = 0; at < rows.size(); at += std::size_t(rows_cap_)) {
      const std::size_t k = std::min(rows.size() - at, std::size_t(rows_cap_));
      pos_.resize(k);
      for (std::size_t r = 0, run_len = 0; r < k; ++r) {  // a slot's rows: its length, then one more per row
        run_len = r > 0 && rows[at + r - 1] == rows[at + r] ? run_len + 1 : 0;
        pos_[r] = length_[std::size_t(rows[at + r])] + index_t(run_len);
      }
      run(std::span<const index_t>(rows).subspan(at, k), std::span<const token_t>(toks).subspan(at, k), true);
    }
  }

  // The logits of the last token fed to `slot` [vocab], in host memory: the workspace itself on a backend
  // whose memory is the host's, else a copy (valid until the next call).
  std::span<const T> last_logits(index_t slot) const {
    MOM_CHECK(slot >= 0 && slot < slots_ && length_[std::size_t(slot)] > 0, "Decoder::last_logits: slot ", slot,
              " holds no token");
    const std::span<const T> row(ws_.data() + last_ + slot * vocab, std::size_t(vocab));
    if constexpr (host_memory<Be>) {
      return row;
    } else {
      model_.backend().to_host(std::span<T>(last_host_), row);
      return last_host_;
    }
  }

 private:
  template <class F>
  void for_each_part(F&& f) {
    [&]<class... Es, std::size_t... is>(TypeList<Es...>, std::index_sequence<is...>) {
      (f.template operator()<is, Es>(), ...);
    }(Executors{}, std::make_index_sequence<Executors::size>{});
  }

  Instance& model_;
  index_t slots_, max_len_, rows_cap_ = 0;
  bool use_graphs_ = true;
  GraphState graph_state_ = GraphState::none;
  GraphKey graph_key_{};
  Graph graph_{};
  index_t graph_steps_ = 0;
  Plans plans_{};
  index_t x0_ = 0, lnf_ = 0, mean_ = 0, rstd_ = 0, logits_ = 0, last_ = 0, last_rows_ = 0;
  index_t slot_dev_ = 0, pos_dev_ = 0, tok_dev_ = 0;  // the rows' slots, positions, tokens in backend memory
  typename Be::template Buffer<T> ws_;
  mutable std::vector<T> last_host_;  // last_logits' copy on a backend whose memory is not the host's
  std::vector<index_t> length_, pos_, all_slots_, head_slots_;
  std::vector<token_t> last_rows_host_;
};

}  // namespace mom::infer

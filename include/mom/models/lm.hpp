#pragma once
// LM<dims, Arch>: a GPT-2 style language model around an architecture:
//   x_0 = wte[token] + wpe[position]          (learned position embedding, dims.positions = Learned)
//   x_0 = wte[token]                          (dims.positions = RoPE: no wpe; attention rotates its
//                                              queries and keys instead, arXiv 2104.09864; with_rope(dims))
//   x_0 = wte[token]                          (dims.positions = None: attention encodes order itself, as
//                                              stick-breaking does; without_positions(dims))
//   x   = Arch(x_0)                           (an Assembly or a Chunked sequence of them)
//   logits = LN_f(x) · wteᵀ                   (LM head tied to the token embedding)
// and its constexpr cost model: parameter layout and count, forward FLOPs per token,
// activation memory for (batch, seq). Model::make<Backend>(seed) gives a runnable instance
// (models/runtime.hpp).
//
// Cost model conventions (docs/architecture.md):
// - params: every tensor of the layout once (tied head counted once, in wte).
// - FLOPs: 2*m*n*k per matrix product (a multiply-add is 2 FLOPs), forward only; for
//   attention, QKᵀ and PV over the causal triangle (token t sees t+1 keys). Elementwise work
//   (LayerNorm, GELU, softmax, residual adds, biases, embedding) is not counted. A training
//   step costs about 3x the forward (backward = two products per forward product).
// - activations: every buffer of the workspace that reserve(batch, seq) allocates (saved
//   activations, logits, backward scratch), plus the token and target copies.
#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <tuple>
#include <type_traits>

// Included directly (not only through each other) in dependency order, so that a failed
// check's "In file included from" note is two lines, not eight.
#include "mom/backend/backend_concept.hpp"
#include "mom/core/check.hpp"
#include "mom/core/dims.hpp"
#include "mom/core/layout.hpp"
#include "mom/core/meta.hpp"
#include "mom/modules/module.hpp"
#include "mom/modules/mha.hpp"
#include "mom/modules/ffn.hpp"
#include "mom/modules/skip.hpp"
#include "mom/modules/experts.hpp"
#include "mom/modules/module_set.hpp"
#include "mom/routers/router.hpp"
#include "mom/routers/options.hpp"
#include "mom/routers/sequential.hpp"
#include "mom/routers/gru.hpp"
#include "mom/routers/share.hpp"
#include "mom/routers/topk.hpp"
#include "mom/assembly/phi.hpp"
#include "mom/assembly/assembly.hpp"
#include "mom/assembly/chunked.hpp"
#include "mom/assembly/sequential.hpp"
#include "mom/assembly/grouped_dispatch.hpp"
#include "mom/assembly/gru.hpp"
#include "mom/assembly/share.hpp"
#include "mom/assembly/moe.hpp"
#include "mom/modules/block.hpp"
#include "mom/routers/depth.hpp"
#include "mom/assembly/depth.hpp"

namespace mom {

template <class Model, class Backend>
class ModelInstance;  // models/runtime.hpp

// What a model needs from a backend type: the op set of mom::Backend (backend/backend_concept.hpp).
template <class Be>
concept BackendType = Backend<Be>;

namespace detail {

// Validity of one part: reading Assembly::valid instantiates the Assembly, so its checks
// fire (at the user's line, through "required from here").
template <class P>
inline constexpr bool part_valid = false;
template <class R, class M, class Kn, class Hn, class Phi>
inline constexpr bool part_valid<Assembly<R, M, Kn, Hn, Phi>> = Assembly<R, M, Kn, Hn, Phi>::valid;

template <class Arch>
struct parts_of {
  using type = TypeList<>;
  static constexpr bool valid = false;
};
template <class R, class M, class Kn, class Hn, class Phi>
struct parts_of<Assembly<R, M, Kn, Hn, Phi>> {
  using type = TypeList<Assembly<R, M, Kn, Hn, Phi>>;
  static constexpr bool valid = part_valid<Assembly<R, M, Kn, Hn, Phi>>;
};
template <class... Ps>
struct parts_of<Chunked<Ps...>> {
  using type = typename Chunked<Ps...>::parts;  // instantiates Chunked: its checks fire here
  static constexpr bool valid = sizeof...(Ps) > 0 && (part_valid<Ps> && ...);
};

// Every part's Executor is defined for these dims: a router policy with neither an executor of its own nor an expert
// gate (phi::MoE) is one message here, and the model falls back to the stand-ins below (no message per member).
template <class P, Dims D>
struct ExecutorDefined {
  static constexpr bool ok = requires { sizeof(typename P::template executor<D>); };
  static_assert(ok, "mom::Executor<Policy, Assembly, Dims>: this router policy has no executor: a policy for MoE "
                    "experts (phi::MoE) declares `static constexpr bool gates_experts = true` and a gate "
                    "(routers/gate.hpp, mom::ExpertGatePolicy); any other policy specialises mom::Executor "
                    "(docs/extending.md)");
};
template <Dims D, class Arch>
constexpr bool executors_defined() {
  if constexpr (VerifyDims<D>::ok && parts_of<Arch>::valid)
    return []<class... Ps>(TypeList<Ps...>) { return (ExecutorDefined<Ps, D>::ok && ...); }(
        typename parts_of<Arch>::type{});
  else return false;
}

// Stand-ins used after a failed check so that one mistake gives one error message.
inline constexpr Dims placeholder_dims{.d_model = 1, .heads = 1, .d_ff = 1, .vocab = 1, .context = 1};

// Model-level tensors before the parts: wte, and wpe for learned positions (none with RoPE or None).
template <Dims D>
inline constexpr std::size_t embedding_tensors = D.learned_positions() ? 2 : 1;

template <Dims D, class... Ps>
constexpr auto lm_specs() {
  constexpr std::size_t n = embedding_tensors<D> + 2 + (0 + ... + Ps::template executor<D>::tensor_count);
  std::array<TensorSpec, n> out{};
  TensorSpec* at = out.data();
  *at++ = {"wte", -1, D.vocab, D.d_model, Init::Normal};
  if constexpr (D.learned_positions()) *at++ = {"wpe", -1, D.context, D.d_model, Init::Normal};
  index_t layer = 0;
  ((Ps::template executor<D>::specs(at, layer), at += Ps::template executor<D>::tensor_count, layer += Ps::depth), ...);
  *at++ = {"ln_f.w", -1, 1, D.d_model, Init::One};
  *at++ = {"ln_f.b", -1, 1, D.d_model, Init::Zero};
  return out;
}

template <Dims D, class PartList>
struct LMCore;

template <Dims D, class... Ps>
struct LMCore<D, TypeList<Ps...>> {
  // The contracts of every part's modules and executor (one message naming a missing member).
  static_assert(sizeof(std::tuple<typename Ps::module_set::template Verify<D>...>) > 0);
  static_assert(sizeof(std::tuple<VerifyExecutor<typename Ps::template executor<D>>...>) > 0);
  template <class P>
  using exec = typename P::template executor<D>;
  using executors = TypeList<exec<Ps>...>;
  static constexpr std::size_t n_parts = sizeof...(Ps);
  static constexpr index_t d = D.d_model;

  static constexpr int depth = (0 + ... + Ps::depth);
  static constexpr int steps = (0 + ... + Ps::steps);

  static constexpr auto specs = lm_specs<D, Ps...>();
  static constexpr std::size_t tensor_count = specs.size();
  static constexpr auto names = build_names<total_name_chars(specs)>(specs);
  static constexpr std::array<ParamInfo, tensor_count> layout = build_layout(specs, names);
  static constexpr index_t params = layout.back().offset + layout.back().size();

  // Learned positions: layout[1] is wpe (RoPE and position-free models have none).
  static constexpr bool has_wpe = D.learned_positions();
  // Offset of each part's parameter block (after wte and, with learned positions, wpe).
  static constexpr std::array<index_t, n_parts> part_offset = [] {
    std::array<index_t, n_parts> out{};
    index_t at = (D.vocab + (has_wpe ? D.context : 0)) * D.d_model;
    std::size_t i = 0;
    ((out[i++] = at, at += exec<Ps>::params), ...);
    return out;
  }();
  static constexpr index_t ln_f_offset = layout[tensor_count - 2].offset;

  static constexpr index_t flops_per_token(index_t seq) {
    return (0 + ... + exec<Ps>::flops_per_token(seq)) + 2 * d * D.vocab;
  }
  static constexpr index_t backward_flops_per_token(index_t seq) {
    return (0 + ... + exec<Ps>::backward_flops_per_token(seq)) + 4 * d * D.vocab;
  }

  // Where every buffer of a step lives in the workspace, for (batch, seq).
  struct Plan {
    index_t batch = 0, seq = 0;
    index_t res0 = 0;                            // x_0 = embedding output [n x d]
    std::tuple<typename exec<Ps>::Plan...> parts{};  // each part's saved activations
    index_t lnf = 0, mean_f = 0, rstd_f = 0;     // final LayerNorm
    index_t logits = 0, lse = 0, loss = 0;       // [n x vocab] (rows logits_ld apart), [n], [1]; dlogits overwrite logits
    index_t logits_ld = 0;                       // the logits' row stride: vocab, or the backend's padded width
    index_t objective = 0;                       // [1]: loss + the parts' auxiliary losses
    index_t dres = 0, dlnf = 0;                  // backward: dL/d(residual stream), dL/d(LN_f out)
    index_t scratch = 0;                         // shared by the parts (max over them)
    index_t total = 0;                           // elements of T
  };
  // guards: where the workspace guard gaps start are appended there (core/layout.hpp), when given. logits_ld: the
  // row stride of the logits (0: vocab; ModelInstance passes padded_ld<Be>(vocab), backend/backend_concept.hpp).
  static constexpr Plan plan(index_t batch, index_t seq, std::vector<index_t>* guards = nullptr, index_t logits_ld = 0) {
    const index_t n = batch * seq;
    Arena a;
    a.guards = guards;
    Plan p{};
    p.batch = batch;
    p.seq = seq;
    p.res0 = a.take(n * d);
    p.parts = std::tuple<typename exec<Ps>::Plan...>{exec<Ps>::plan(a, batch, seq)...};  // in order
    p.lnf = a.take(n * d);
    p.mean_f = a.take(n);
    p.rstd_f = a.take(n);
    p.logits_ld = logits_ld > D.vocab ? logits_ld : D.vocab;
    p.logits = a.take(n * p.logits_ld);
    p.lse = a.take(n);
    p.loss = a.take(1);
    p.objective = a.take(1);
    p.dres = a.take(n * d);
    p.dlnf = a.take(n * d);
    index_t scratch = 0;
    ((scratch = scratch > exec<Ps>::scratch(batch, seq) ? scratch : exec<Ps>::scratch(batch, seq)), ...);
    p.scratch = a.take(scratch);
    p.total = a.used;
    return p;
  }
};

}  // namespace detail

template <Dims D, class Arch>
struct LM {
  static_assert(Architecture<Arch>,
                "mom::LM<dims, Arch>: Arch must be an Assembly (e.g. Dense<L>) or a Chunked<...> of Assemblies");
  // Both checks are instantiated (bitwise &, no short circuit), so every mistake is reported.
  static constexpr bool valid = (VerifyDims<D>::ok & detail::parts_of<Arch>::valid) && detail::executors_defined<D, Arch>();

  static constexpr Dims dims = valid ? D : detail::placeholder_dims;
  using arch = Arch;
  using parts = std::conditional_t<valid, typename detail::parts_of<Arch>::type, TypeList<Layer>>;
  using core = detail::LMCore<dims, parts>;
  using Plan = typename core::Plan;

  // ---- cost model (all constexpr) -------------------------------------------------------
  static constexpr int depth = core::depth;  // dense-equivalent layers (names h.0 .. h.<depth-1>)
  static constexpr int steps = core::steps;  // assembly steps run (H summed over parts)
  static constexpr index_t params = core::params;
  static constexpr std::size_t tensor_count = core::tensor_count;
  static constexpr std::array<ParamInfo, tensor_count> layout = core::layout;  // flat-buffer order

  // Forward FLOPs per token at sequence length seq (2*m*n*k per product, causal attention).
  static constexpr index_t flops_per_token(index_t seq) { return core::flops_per_token(seq); }
  static constexpr index_t forward_flops(index_t batch, index_t seq) { return batch * seq * flops_per_token(seq); }
  // Backward FLOPs per token as executed (two products per linear, five causal products for
  // attention, which recomputes its probabilities), and a whole training step (forward + backward).
  static constexpr index_t backward_flops_per_token(index_t seq) { return core::backward_flops_per_token(seq); }
  static constexpr index_t training_flops_per_token(index_t seq) {
    return flops_per_token(seq) + backward_flops_per_token(seq);
  }
  static constexpr index_t training_flops(index_t batch, index_t seq) {
    return batch * seq * training_flops_per_token(seq);
  }
  // Workspace of reserve(batch, seq), in elements of the scalar type, and in bytes (with the
  // token and target copies).
  static constexpr index_t activation_elements(index_t batch, index_t seq) { return core::plan(batch, seq).total; }
  template <class T = float>
  static constexpr index_t activation_bytes(index_t batch, index_t seq) {
    return activation_elements(batch, seq) * index_t(sizeof(T)) + 2 * batch * seq * index_t(sizeof(token_t));
  }

  // The layout entry called `name`: a compile error in a constant expression, a mom::Error at
  // run time, when there is none.
  static constexpr const ParamInfo& find(std::string_view name) {
    for (const auto& p : layout)
      if (p.name == name) return p;
    ::mom::detail::fail("LM::find: the model has no parameter named '", name, "'");
  }

  // A runnable model on backend Be with parameters initialised GPT-2 style from seed.
  template <class Be>
  static auto make(std::uint64_t seed) {
    if constexpr (!BackendType<Be>) {
      static_assert(dependent_false<Be>, "mom::LM::make<Be>: Be must be a backend, e.g. cpu::Backend<float>");
      return 0;
    } else {
      return ModelInstance<LM, Be>(seed);
    }
  }
};

// LM<with_rope(D), Arch>: the same model with rotary position embeddings (no wpe).
template <Dims D, class Arch>
using LMRoPE = LM<with_rope(D), Arch>;

template <class T>
inline constexpr bool is_lm = false;
template <Dims D, class A>
inline constexpr bool is_lm<LM<D, A>> = true;

}  // namespace mom

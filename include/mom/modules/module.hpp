#pragma once
// The module vocabulary: what a module family and a single module must provide, as concepts.
//
// A module family (MHA<N>, FFN<N>, Experts<FFN, E, PerStep>, Skip, Block<L>, or a user's own) is an
// element of a ModuleSet (the paper's M, eq. (1)). It names its `role`, how many modules it holds
// (`count`) and, for computing modules, the single-module type `template <Dims> single` that computes
// one of them. The single type is a parameter of the standard families, so a new module kind is a
// new type, not an edit of the library:
//   FFN<4, SwiGLU>                 four feed-forward modules computed by the user's SwiGLU<D>
//   MHA<8, GroupedQuery<2>::type>  eight attention modules with two key/value heads each
// (docs/extending.md walks through both.)
//
// The executors (assembly/) reach a module only through the members its role's concept lists. Every single
// module meets one contract, ModuleCore (its tensors, cost and workspace); TokenMixer<M> and SequenceMixer<M>
// are that one concept under the names of the two roles (below). The roles differ in what an executor may do
// with the rows, and in the backend members that follow from it:
//
//   token mixer       row i of f(x) depends on row i of x alone (FFN-like), so executors run it over any rows:
//                     densely over (batch, seq), over row groups (routed rows: MoM, MoE, MoD, layer-skip), and
//                     a decode step's new rows by its dense forward. Members: TokenMixerOn (dense + grouped).
//   sequence mixer    row i also reads the earlier rows of its sequence (attention-like), so it runs densely
//                     over whole (batch, seq) sequences: enough for the dense stack, parameter sharing, MoE's
//                     attention and MoD's (batch, C) blocks. Members: SequenceMixerOn (dense only);
//                     RoutedSequenceMixer<M> adds row groups in the two key/value modes the routed executors use
//                     (KeySource below; MoM and layer-skip / early-exit need it), DecodingSequenceMixerOn a
//                     key/value cache for decoding.
// The promise about rows is declared, not checked (no requires-expression can see it): by the family a module
// sits in (FFN<N, Impl> or MHA<N, Impl>) and, optionally, by the module's single_role (ModuleRole below), which
// those families check.
//
// A single module m computes f(LN(x)) with its own LayerNorm (pre-norm, paper eq. (4)); the assembling
// function phi adds the residual and the routing weights. Forward ops write, backward ops accumulate
// (+=) into dx and into the gradient block g. The forward/backward members are templates over the
// backend; `TokenMixerOn<M, Be>` / `SequenceMixerOn<M, Be>` (= `DenseModuleOn<M, Be>`) check them for one backend type.
#include <concepts>
#include <cstddef>
#include <span>
#include <tuple>

#include "mom/core/dims.hpp"
#include "mom/core/groups.hpp"
#include "mom/core/layout.hpp"
#include "mom/core/tensor.hpp"

namespace mom {

// The role a module family plays in a ModuleSet. Block is a pair (sequence mixer, token mixer) run
// as one transformer block (Mixture-of-Depths).
enum class ModuleRole { SequenceMixer, TokenMixer, Skip, Block };

// A family of modules inside a ModuleSet: `role` and `count`; computing families also give
// `template <Dims> using single = ...` (Block: `sequence_mixer` and `token_mixer`).
template <class F>
concept ModuleFamily = requires {
  { F::role } -> std::convertible_to<ModuleRole>;
  { F::count } -> std::convertible_to<int>;
};

// A single module may say which role it is written for, so that a family of the other role refuses it:
//   static constexpr ModuleRole single_role = ModuleRole::TokenMixer;      (modules::FeedForward, a user's SwiGLU)
//   static constexpr ModuleRole single_role = ModuleRole::SequenceMixer;   (modules::Attention, a user's attention)
// MHA<N, Impl> and FFN<N, Impl> check it: a feed-forward module placed where attention belongs is one error at
// the model's type, not a model that trains and then cannot save (its tensors would share names with the FFN's
// beside it). A module that declares nothing is accepted by both (mom::LM::make still refuses duplicate
// tensor names).
template <class M>
concept DeclaresSingleRole = requires {
  { M::single_role } -> std::convertible_to<ModuleRole>;
};
template <class M>
constexpr bool declares_role(ModuleRole r) {
  if constexpr (DeclaresSingleRole<M>) return ModuleRole(M::single_role) == r;
  else return false;
}
template <class M>
struct checked_sequence_mixer {
  static_assert(!declares_role<M>(ModuleRole::TokenMixer),
                "mom::MHA<N, Impl>: Impl is a token mixer (its single_role says so), not attention: put it in "
                "FFN<N, Impl>");
  using type = M;
};
template <class M>
struct checked_token_mixer {
  static_assert(!declares_role<M>(ModuleRole::SequenceMixer),
                "mom::FFN<N, Impl>: Impl is a sequence mixer (attention-like; its single_role says so), not a "
                "token mixer: put it in MHA<N, Impl>");
  using type = M;
};

// Where a sequence mixer's keys and values come from when it runs over row groups (routed rows):
//   AllTokens  every token of the sequence: module m computes LN_m and K/V over all n rows, the routed
//              rows only their queries (phi::MoM, the authors' semantics; layer-skip AttendToSkipped)
//   Routed     the routed rows only: a row attends to the earlier rows of its own group and sequence
//              (phi::MoMRoutedKV; layer-skip over the running tokens)
//   Given      every token's K/V from x (another state than the rows'), the rows' queries from their own
//              state xg (Mixture-of-Recursions' KV sharing: the first recursion's keys). Optional: a module
//              that takes it says so with `static constexpr bool given_keys = true` (modules::Attention).
enum class KeySource { AllTokens, Routed, Given };

// Members every computing module provides (D fixed by the single type):
//   tensors(layer)   its parameter tensors in layout order (std::array<TensorSpec, n>), names below h.<layer>
//   params           parameter count (the tensors' sizes summed, in the same order)
//   flops_per_token(seq), backward_flops_per_token(seq)   forward / backward FLOPs per token, dense
//   Saved plan(Arena&, batch, seq)   activations kept from forward for backward
//   scratch(batch, seq)              backward scratch elements
template <class M>
concept ModuleCore = requires(Arena& a, index_t i) {
  M::tensors(i);
  { M::tensors(i).size() } -> std::convertible_to<std::size_t>;
  { M::params } -> std::convertible_to<index_t>;
  { M::flops_per_token(i) } -> std::convertible_to<index_t>;
  { M::backward_flops_per_token(i) } -> std::convertible_to<index_t>;
  typename M::Saved;
  { M::plan(a, i, i) } -> std::same_as<typename M::Saved>;
  { M::scratch(i, i) } -> std::convertible_to<index_t>;
};

// A module may contribute an auxiliary loss (MoEUT's selection entropy regulariser, ...): it declares
//   static constexpr bool has_aux_loss = true;   and   Saved::aux
// the workspace offset of one scalar that its forward writes (the loss, already weighted by its
// coefficient). The executor adds it to the model's objective; the module's backward adds the loss's
// gradient itself (the objective is cross-entropy + every auxiliary loss, each with weight 1).
template <class M>
concept ModuleWithAuxLoss = requires(const typename M::Saved& s) {
  requires M::has_aux_loss;
  { s.aux } -> std::convertible_to<index_t>;
};

// A module that routes inside itself (σ-MoE, ModuleFormer's MoA and SMoE) may report its choices, so that
// routing statistics, expert usage and pruning (models/routing_stats.hpp, models/module_surgery.hpp) see them:
//   static constexpr RoutedChoices routed{classes, k}     k picks among `classes` per token
//   read_picks(be, ws, saved, n, std::span<token_t> out)  the last forward's n×k class ids
// The executors that run such a module once per step report it (assembly/sequential.hpp).
struct RoutedChoices {
  int classes = 0, k = 0;
};
template <class M>
concept ModuleWithRouting = requires(const typename M::Saved& s) {
  { M::routed } -> std::convertible_to<RoutedChoices>;
};

// One block of per-sub-module parameters inside a module that routes among sub-modules (MoA's heads,
// SMoE's experts): sub-module e's `size` values start at offset + e·size (module-relative).
struct ModuleSlice {
  index_t offset = 0, size = 0;
};

// Number of parameter tensors of a module (the size of its tensors() array).
template <class M>
inline constexpr std::size_t module_tensor_count = std::tuple_size_v<decltype(M::tensors(0))>;

// TokenMixer<M> and SequenceMixer<M>: one concept, ModuleCore, under the two role names (a module that meets
// one meets the other; what differs is the promise about rows and the backend members, in the header above).
// For a token mixer run over row groups (group g's rows run module g, whose parameters start at p[g]), Saved
// comes from plan(a, 1, rows) and scratch(1, rows), sized for all the packed rows.
template <class M>
concept TokenMixer = ModuleCore<M>;
template <class M>
concept SequenceMixer = ModuleCore<M>;  // the same concept as TokenMixer

// A routed sequence mixer additionally gives its grouped workspace for G modules and a key source, and
// its cost split as the routed executors count it:
//   GroupedSaved<G>, plan_grouped<G, keys>(a, n, rows), scratch_grouped<G, keys>(n, rows)
//   kv_flops, query_flops     forward FLOPs per row of the key/value side and of the query side
//                             (queries, output projection)
//   pair_flops                forward FLOPs per (query, visible key) pair
//   kv_backward_flops, query_backward_flops, pair_backward_flops   the same for backward
template <class M>
concept RoutedSequenceMixer = SequenceMixer<M> && requires(Arena& a, index_t i) {
  typename M::template GroupedSaved<1>;
  { M::template plan_grouped<1, KeySource::AllTokens>(a, i, i) } -> std::same_as<typename M::template GroupedSaved<1>>;
  { M::template plan_grouped<1, KeySource::Routed>(a, i, i) } -> std::same_as<typename M::template GroupedSaved<1>>;
  { M::template scratch_grouped<1, KeySource::AllTokens>(i, i) } -> std::convertible_to<index_t>;
  { M::template scratch_grouped<1, KeySource::Routed>(i, i) } -> std::convertible_to<index_t>;
  { M::kv_flops } -> std::convertible_to<index_t>;
  { M::query_flops } -> std::convertible_to<index_t>;
  { M::pair_flops } -> std::convertible_to<index_t>;
  { M::kv_backward_flops } -> std::convertible_to<index_t>;
  { M::query_backward_flops } -> std::convertible_to<index_t>;
  { M::pair_backward_flops } -> std::convertible_to<index_t>;
};

// The dense members every single module gives on backend Be (T = Be::scalar), over batch sequences of seq rows:
//   forward(be, p, ws, saved, x, f_out, batch, seq)                     f_out = f(x)
//   backward(be, p, g, ws, saved, x, dx, df, scratch, batch, seq)       dx += df·∂f/∂x, g += ∂L/∂p
// A sequence mixer's members (SequenceMixerOn) and a token mixer's dense ones (DenseTokenMixerOn: what the dense
// stack and parameter sharing call, and what decoding a step needs) are exactly these.
template <class M, class Be, class T = typename Be::scalar>
concept DenseModuleOn =
    ModuleCore<M> && requires(Be& be, const T* p, T* g, T* ws, const typename M::Saved& s, MatrixView<const T> x,
                              MatrixView<T> y, index_t i) {
      M::forward(be, p, ws, s, x, y, i, i);
      M::backward(be, p, g, ws, s, x, y, x, g, i, i);
    };
template <class M, class Be, class T = typename Be::scalar>
concept SequenceMixerOn = DenseModuleOn<M, Be, T>;
template <class M, class Be, class T = typename Be::scalar>
concept DenseTokenMixerOn = DenseModuleOn<M, Be, T>;

// Optional, for a module whose last op can add the residual stream itself (eq. (4)'s x + f(x) in its output product's
// epilogue, where the backend has one: Attention and FeedForward on a backend with their fused pairs):
//   forward_residual(be, p, ws, saved, x, out, batch, seq)             out = x + f(x)  (out and x distinct)
// The dense stack calls it where a module has it (assembly/sequential.hpp), forward and an add where not; saved is what
// forward leaves, so backward is unchanged.
template <class M, class Be, class T = typename Be::scalar>
concept AddsResidualOn = DenseModuleOn<M, Be, T> && requires(Be& be, const T* p, T* ws, const typename M::Saved& s,
                                                             MatrixView<const T> x, MatrixView<T> y, index_t i) {
  M::forward_residual(be, p, ws, s, x, y, i, i);
};

// A token mixer on backend Be: the dense members and the same over row groups, which its rows' independence
// allows (modules that route inside themselves, such as σ-MoE, have no row-group members: DenseTokenMixerOn):
//   forward_grouped(be, PerGroup p, ws, saved, x, f_out, RowGroups)      f_out = f(x) per row group
//   backward_grouped(be, PerGroup p, PerGroup g, ws, saved, x, dx, df, scratch, RowGroups)   dx += per row group
// and optionally the same with a trailing Store: Store::overwrite writes dx over the groups' rows, so the routed
// executors need not zero them first (modules/checked.hpp zeroes them for a module without it).
template <class M, class Be, class T = typename Be::scalar>
concept TokenMixerOn =
    DenseModuleOn<M, Be, T> && requires(Be& be, T* g, T* ws, const typename M::Saved& s, MatrixView<const T> x,
                                        MatrixView<T> y, PerGroup<const T> pg, PerGroup<T> gg, RowGroups gr) {
      M::forward_grouped(be, pg, ws, s, x, y, gr);
      M::backward_grouped(be, pg, gg, ws, s, x, y, x, g, gr);
    };

// Optional, for a token mixer whose grouped members read their input rows through an index: packed row r of the
// row groups reads x's row x_idx[r] (the routed rows' token rows, read in place), so the routed executors need
// not gather the rows into a copy first (routing/dispatch.hpp; assembly/grouped_dispatch.hpp's RoutedFfn):
//   static constexpr bool reads_rows_in_place = true;
//   forward_grouped(be, PerGroup p, ws, saved, x, x_idx, f_out, RowGroups)                 f_out [x_idx.size() × d]
//   backward_grouped(be, PerGroup p, PerGroup g, ws, saved, x, x_idx, dx, df, scratch, RowGroups, Store)
//                                                              dx [x_idx.size() × d]: the packed rows' gradient
// The flag is what the executors plan their workspace by (no backend is known there); checked<M> holds a module
// that sets it to these members where they are called (modules/checked.hpp); ReadsRowsInPlaceOn<M, Be> checks them
// for one backend type, as TokenMixerOn does. FeedForward reads its rows this way.
template <class M>
concept ReadsRowsInPlace = requires {
  { M::reads_rows_in_place } -> std::convertible_to<bool>;
  requires M::reads_rows_in_place;
};
template <class M, class Be, class T = typename Be::scalar>
concept ReadsRowsInPlaceOn =
    ReadsRowsInPlace<M> && requires(Be& be, T* g, T* ws, const typename M::Saved& s, MatrixView<const T> x,
                                    std::span<const token_t> idx, MatrixView<T> y, PerGroup<const T> pg,
                                    PerGroup<T> gg, RowGroups gr, Store st) {
      M::forward_grouped(be, pg, ws, s, x, idx, y, gr);
      M::backward_grouped(be, pg, gg, ws, s, x, idx, y, x, g, gr, st);
    };

// A sequence mixer that decodes incrementally (infer/decoder.hpp) on backend Be: one new token per
// active sequence against the module's key/value cache (backend ops kv_write / attention_decode):
//   DecodeSaved plan_decode(Arena&, rows)       its step workspace for up to `rows` new tokens
//   decode(be, p, ws, saved, x, f_out, k_cache, v_cache, slot, pos, max_len)
//       f_out [rows × d] = f(x) for row r = sequence slot[r] at position pos[r], which attends to
//       positions 0..pos[r] of its sequence (its own key and value are written to the cache first).
//       slot and pos are in backend memory, like x (device memory on CUDA): hand them to ops, do not read them.
// A token mixer needs nothing more: it runs its dense forward over the step's rows (batch rows, seq 1).
template <class M, class Be, class T = typename Be::scalar>
concept DecodingSequenceMixerOn =
    SequenceMixerOn<M, Be, T> &&
    requires(Arena& a, Be& be, const T* p, T* ws, const typename M::DecodeSaved& s, MatrixView<const T> x,
             MatrixView<T> y, std::span<const index_t> slot, index_t i) {
      { M::plan_decode(a, i) } -> std::same_as<typename M::DecodeSaved>;
      M::decode(be, p, ws, s, x, y, y, y, slot, slot, i);
    };

// Optional, decode's counterpart of AddsResidualOn (Attention on a backend with linear_forward_residual):
//   decode_residual(be, p, ws, saved, x, out, k_cache, v_cache, slot, pos, max_len)     out = x + decode's f(x)
// The dense decode step (assembly/decode_rounds.hpp) calls it where a module has it, decode and an add where not.
template <class M, class Be, class T = typename Be::scalar>
concept DecodesResidualOn =
    DecodingSequenceMixerOn<M, Be, T> &&
    requires(Be& be, const T* p, T* ws, const typename M::DecodeSaved& s, MatrixView<const T> x, MatrixView<T> y,
             std::span<const index_t> slot, index_t i) { M::decode_residual(be, p, ws, s, x, y, y, y, slot, slot, i); };

// What a sequence mixer lacks for DecodingSequenceMixerOn, named (infer::Decoder instantiates this for the
// attention module of a part that cannot decode: the module's type is in the note above the error).
template <class M, class Be, class T = typename Be::scalar>
struct explain_decoding_sequence_mixer {
  static constexpr bool has_plan = requires(Arena& a, index_t i) {
    typename M::DecodeSaved;
    { M::plan_decode(a, i) } -> std::same_as<typename M::DecodeSaved>;
  };
  static_assert(has_plan, "mom::infer::Decoder: the attention module has no 'using DecodeSaved = ...' and 'static "
                          "DecodeSaved plan_decode(Arena&, index_t rows)' (docs/extending.md, \"Make your attention "
                          "decode\")");
  static constexpr bool has_decode =
      requires(Be& be, const T* p, T* ws, const typename M::DecodeSaved& s, MatrixView<const T> x, MatrixView<T> y,
               std::span<const index_t> slot, index_t i) { M::decode(be, p, ws, s, x, y, y, y, slot, slot, i); };
  static_assert(!has_plan || has_decode,
                "mom::infer::Decoder: the attention module has no 'decode(be, p, ws, saved, x, f_out, k_cache, "
                "v_cache, slot, pos, max_len)' for this backend (docs/extending.md, \"Make your attention decode\")");
  static constexpr bool named = true;
};

// A routed sequence mixer that decodes inside a routed executor (MoM's phi::MoM / phi::MoMRoutedKV), where
// the tokens that write keys and the tokens that query are not the same rows: decode split in two.
//   decode_keys(be, p, ws, saved, x, k_cache, v_cache, slot, pos, at, max_len)
//       the rows' keys and values written to cache row slot[r]·max_len + at[r] (pos[r]: the position)
//   decode_queries(be, p, ws, saved, x, f_out, k_cache, v_cache, slot, pos, at, max_len)
//       f_out = f(x) for rows attending to cache rows 0..at[r] of their sequence (their own key included)
template <class M, class Be, class T = typename Be::scalar>
concept RoutedDecodingSequenceMixerOn =
    DecodingSequenceMixerOn<M, Be, T> &&
    requires(Be& be, const T* p, T* ws, const typename M::DecodeSaved& s, MatrixView<const T> x, MatrixView<T> y,
             std::span<const index_t> slot, index_t i) {
      M::decode_keys(be, p, ws, s, x, y, y, slot, slot, slot, i);
      M::decode_queries(be, p, ws, s, x, y, x, x, slot, slot, slot, i);
    };

// A routed sequence mixer's grouped members on backend Be:
//   forward_grouped<keys>(be, p, ws, gs, x, xg, out, idx, groups, seq)
//       out [rows × d] = module g's output for the rows of group g. idx [rows]: the flat token index
//       (b·seq + position) of each packed row; x [n × d]: every token's input (read in AllTokens mode);
//       xg [rows × d]: the packed rows' inputs (read in Routed mode).
//   backward_grouped<keys>(be, p, g, ws, gs, x, xg, dx, dxg, dout, idx, groups, seq, scratch)
//       AllTokens: every token's input gradient accumulated into dx [n × d]; Routed: the packed rows'
//       input gradient accumulated into dxg [rows × d].
template <class M, class Be, class T = typename Be::scalar>
concept RoutedSequenceMixerOn =
    RoutedSequenceMixer<M> && SequenceMixerOn<M, Be, T> &&
    requires(Be& be, T* g, T* ws, const typename M::template GroupedSaved<1>& gs, MatrixView<const T> x,
             MatrixView<T> y, PerGroup<const T> pg, PerGroup<T> gg, RowGroups gr, std::span<const token_t> idx, index_t i) {
      M::template forward_grouped<KeySource::AllTokens>(be, pg, ws, gs, x, x, y, idx, gr, i);
      M::template forward_grouped<KeySource::Routed>(be, pg, ws, gs, x, x, y, idx, gr, i);
      M::template backward_grouped<KeySource::AllTokens>(be, pg, gg, ws, gs, x, x, y, y, x, idx, gr, i, g);
      M::template backward_grouped<KeySource::Routed>(be, pg, gg, ws, gs, x, x, y, y, x, idx, gr, i, g);
    };

// The same contracts member by member, each static_assert naming the one that is missing, so a
// user's module that lacks a member gets one line in its terms. Instantiated where a ModuleSet's
// modules are fixed (LM<dims, Arch>); `ok` is the concept.
template <class M>
struct VerifyModule {
  static_assert(requires(index_t i) { M::tensors(i).size(); },
                "mom module: missing `static constexpr std::array<TensorSpec, n> tensors(index_t layer)`");
  static_assert(requires { { M::params } -> std::convertible_to<index_t>; }, "mom module: missing `static constexpr index_t params`");
  static_assert(requires(index_t i) { { M::flops_per_token(i) } -> std::convertible_to<index_t>; },
                "mom module: missing `static constexpr index_t flops_per_token(index_t seq)`");
  static_assert(requires(index_t i) { { M::backward_flops_per_token(i) } -> std::convertible_to<index_t>; },
                "mom module: missing `static constexpr index_t backward_flops_per_token(index_t seq)`");
  static_assert(requires { typename M::Saved; }, "mom module: missing `struct Saved` (its activation offsets)");
  static_assert(requires(Arena& a, index_t i) { M::plan(a, i, i); },
                "mom module: missing `static constexpr Saved plan(Arena&, index_t batch, index_t seq)`");
  static_assert(requires(index_t i) { { M::scratch(i, i) } -> std::convertible_to<index_t>; },
                "mom module: missing `static constexpr index_t scratch(index_t batch, index_t seq)`");
  static constexpr bool ok = ModuleCore<M>;
};
template <class M>
struct VerifyRoutedSequenceMixer : VerifyModule<M> {
  // Checked in order, each only when the ones before hold, so a dense-only module gets one line.
  static constexpr bool has_saved = requires { typename M::template GroupedSaved<1>; };
  static_assert(has_saved,
                "mom::RoutedSequenceMixer: missing `template <int G> struct GroupedSaved` (MoM chunks and layer-skip run "
                "attention over row groups; modules/module.hpp lists the members)");
  static constexpr bool has_plan =
      has_saved && requires(Arena& a, index_t i) { M::template plan_grouped<1, KeySource::Routed>(a, i, i); };
  static_assert(!has_saved || has_plan,
                "mom::RoutedSequenceMixer: missing `template <int G, KeySource> static constexpr GroupedSaved<G> "
                "plan_grouped(Arena&, index_t n, index_t rows)`");
  static constexpr bool has_scratch =
      has_plan && requires(index_t i) { M::template scratch_grouped<1, KeySource::Routed>(i, i); };
  static_assert(!has_plan || has_scratch,
                "mom::RoutedSequenceMixer: missing `template <int G, KeySource> static constexpr index_t "
                "scratch_grouped(index_t n, index_t rows)`");
  static constexpr bool has_cost = has_scratch && requires {
    M::kv_flops + M::query_flops + M::pair_flops + M::kv_backward_flops + M::query_backward_flops +
        M::pair_backward_flops;
  };
  static_assert(!has_scratch || has_cost,
                "mom::RoutedSequenceMixer: missing the grouped cost `kv_flops`, `query_flops`, `pair_flops` and their "
                "`*_backward_flops`");
  static constexpr bool ok = RoutedSequenceMixer<M>;
};

namespace detail {
// Views into a flat parameter / gradient / workspace buffer.
template <class T>
constexpr MatrixView<T> mat(T* base, index_t offset, index_t rows, index_t cols) {
  return {base + offset, rows, cols};
}
template <class T>
constexpr std::span<T> vec(T* base, index_t offset, index_t n) {
  return {base + offset, static_cast<std::size_t>(n)};
}
}  // namespace detail

}  // namespace mom

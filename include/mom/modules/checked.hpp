#pragma once
// checked<M>: how an executor calls a module's forward / backward members, each call checked against the
// signature modules/module.hpp lists for it, where it is used (as CuTe checks its layouts):
//
//   checked<Attn>::forward(be, p, ws, saved, x, f_out, batch, seq);
//
// calls Attn::forward with exactly these argument types when it accepts them; otherwise it is one error that
// names the member and its expected parameters (the module's type is in the note "In instantiation of
// checked<M>"), instead of a screen of overload candidates from inside an executor. Every executor calls the
// modules through it, so a user's module is held to the same list whichever executor runs it, and a member an
// architecture never calls is never required. (The decode members are checked by infer::Decoder,
// explain_decoding_sequence_mixer in modules/module.hpp.)
//
// Where workspace guards are on (debug and test builds, core/layout.hpp), each call also verifies them on a
// host-memory backend: after forward, every guard gap of the model's workspace (a module that writes past its
// Saved activations); around a token or sequence mixer's backward, the guard after the module's declared
// scratch (a scratch() that is too small; a routed attention's grouped scratch, scratch_grouped<G, keys>, has no
// guard of its own). An overrun is a mom::Error naming the module's type and the member.
#include <span>
#include <string_view>
#include <type_traits>

#include "mom/backend/backend_concept.hpp"
#include "mom/core/check.hpp"
#include "mom/core/groups.hpp"
#include "mom/core/layout.hpp"
#include "mom/core/meta.hpp"
#include "mom/core/tensor.hpp"
#include "mom/modules/module.hpp"

namespace mom {

namespace detail {
// The spelling of type M, from the compiler's name of this function (for messages only).
template <class M>
constexpr std::string_view type_name() {
  constexpr std::string_view f = __PRETTY_FUNCTION__, key = "M = ";
  const std::size_t at = f.find(key) + key.size();
  return f.substr(at, f.find_first_of(";]", at) - at);
}

// Guard checks of one module call (no-ops when workspace_guard is 0 or the backend's memory is not the host's).
template <class M, class Be, class T>
void verify_workspace_guards(const T* ws, const char* member) {
  if constexpr (workspace_guard > 0 && host_memory<Be>) {
    const ActiveGuards& a = active_guards;
    if (a.ws != ws || a.gaps == nullptr) return;
    for (const index_t at : *a.gaps)
      for (index_t i = 0; i < workspace_guard; ++i)
        MOM_CHECK(ws[at + i] == guard_value<T>, "mom module ", type_name<M>(), ": its ", member,
                  " wrote past its workspace (the guard at workspace element ", at + i,
                  "): its plan() reserves less than it writes");
  }
}
template <class Be, class T>
void arm_scratch_guard(T* scratch, index_t declared) {
  if constexpr (workspace_guard > 0 && host_memory<Be>)
    for (index_t i = 0; i < workspace_guard; ++i) scratch[declared + i] = guard_value<T>;
}
template <class M, class Be, class T>
void verify_scratch_guard(const T* scratch, index_t declared, const char* member) {
  if constexpr (workspace_guard > 0 && host_memory<Be>)
    for (index_t i = 0; i < workspace_guard; ++i)
      MOM_CHECK(scratch[declared + i] == guard_value<T>, "mom module ", type_name<M>(), ": its ", member,
                " wrote past its declared scratch (", declared, " elements, element ", declared + i,
                " written): its scratch() is too small");
}
}  // namespace detail

// The backward scratch an executor reserves for module M: M::scratch and the guard after it (core/layout.hpp).
template <class M>
constexpr index_t guarded_scratch(index_t batch, index_t seq) {
  return M::scratch(batch, seq) + workspace_guard;
}

template <class M>
struct checked {
  template <class T>
  using CMV = std::type_identity_t<MatrixView<const T>>;
  template <class T>
  using MV = std::type_identity_t<MatrixView<T>>;
  template <class T>
  using CPtr = std::type_identity_t<const T*>;
  template <class T>
  using Ptr = std::type_identity_t<T*>;

  // ---- over batch × seq (TokenMixerOn / SequenceMixerOn) ----
  template <class Be, class T, class S>
  static void forward(Be& be, const T* p, Ptr<T> ws, const S& saved, CMV<T> x, MV<T> f_out, index_t batch,
                      index_t seq) {
    if constexpr (requires { M::forward(be, p, ws, saved, x, f_out, batch, seq); }) {
      M::forward(be, p, ws, saved, x, f_out, batch, seq);
      detail::verify_workspace_guards<M, Be>(ws, "forward");
    } else
      static_assert(dependent_false<M>,
                    "mom module: no member `static void forward(Be&, const T* p, T* ws, const Saved&, "
                    "MatrixView<const T> x, MatrixView<T> f_out, index_t batch, index_t seq)` that takes these "
                    "arguments on this backend (modules/module.hpp)");
  }
  // out = x + f(x), eq. (4)'s residual step: the module's forward_residual where it has one (AddsResidualOn,
  // modules/module.hpp: the add in its output product), else forward into f_scratch [x's shape] and an add.
  template <class Be, class T, class S>
  static void forward_residual(Be& be, const T* p, Ptr<T> ws, const S& saved, CMV<T> x, MV<T> out, MV<T> f_scratch,
                               index_t batch, index_t seq) {
    if constexpr (AddsResidualOn<M, Be, T>) {
      M::forward_residual(be, p, ws, saved, x, out, batch, seq);
      detail::verify_workspace_guards<M, Be>(ws, "forward_residual");
    } else {
      forward(be, p, ws, saved, x, f_scratch, batch, seq);
      be.add_forward(out.flat(), x.flat(), CMV<T>(f_scratch).flat());
    }
  }
  template <class Be, class T, class S>
  static void backward(Be& be, const T* p, Ptr<T> g, CPtr<T> ws, const S& saved, CMV<T> x, MV<T> dx, CMV<T> df,
                       Ptr<T> scratch, index_t batch, index_t seq) {
    if constexpr (requires { M::backward(be, p, g, ws, saved, x, dx, df, scratch, batch, seq); }) {
      detail::arm_scratch_guard<Be>(scratch, M::scratch(batch, seq));
      M::backward(be, p, g, ws, saved, x, dx, df, scratch, batch, seq);
      detail::verify_scratch_guard<M, Be>(scratch, M::scratch(batch, seq), "backward");
    } else
      static_assert(dependent_false<M>,
                    "mom module: no member `static void backward(Be&, const T* p, T* g, const T* ws, const Saved&, "
                    "MatrixView<const T> x, MatrixView<T> dx, MatrixView<const T> df, T* scratch, index_t batch, "
                    "index_t seq)` that takes these arguments on this backend (modules/module.hpp)");
  }

  // ---- a token mixer over row groups (group g's rows run module g: MoM, MoE experts, packed depth blocks) ----
  template <class Be, class T, class S>
  static void forward_grouped(Be& be, PerGroup<const T> p, Ptr<T> ws, const S& saved, CMV<T> x, MV<T> f_out,
                              RowGroups groups) {
    if constexpr (requires { M::forward_grouped(be, p, ws, saved, x, f_out, groups); }) {
      M::forward_grouped(be, p, ws, saved, x, f_out, groups);
      detail::verify_workspace_guards<M, Be>(ws, "forward_grouped");
    } else
      static_assert(dependent_false<M>,
                    "mom module: no member `static void forward_grouped(Be&, PerGroup<const T> p, T* ws, const Saved&, "
                    "MatrixView<const T> x, MatrixView<T> f_out, RowGroups)` that takes these arguments on this "
                    "backend: this architecture runs the module over row groups (modules/module.hpp)");
  }
  template <class Be, class T, class S>
  static void backward_grouped(Be& be, PerGroup<const T> p, std::type_identity_t<PerGroup<T>> g, CPtr<T> ws,
                               const S& saved, CMV<T> x, MV<T> dx, CMV<T> df, Ptr<T> scratch, RowGroups groups) {
    if constexpr (requires { M::backward_grouped(be, p, g, ws, saved, x, dx, df, scratch, groups); }) {
      detail::arm_scratch_guard<Be>(scratch, M::scratch(1, x.rows));
      M::backward_grouped(be, p, g, ws, saved, x, dx, df, scratch, groups);
      detail::verify_scratch_guard<M, Be>(scratch, M::scratch(1, x.rows), "backward_grouped");
    } else
      static_assert(dependent_false<M>,
                    "mom module: no member `static void backward_grouped(Be&, PerGroup<const T> p, PerGroup<T> g, "
                    "const T* ws, const Saved&, MatrixView<const T> x, MatrixView<T> dx, MatrixView<const T> df, T* "
                    "scratch, RowGroups)` that takes these arguments on this backend: this architecture runs the "
                    "module over row groups (modules/module.hpp)");
  }
  // The same with dx's store chosen: Store::overwrite writes dL/dx over the groups' rows of dx (their old values
  // unread). A module that takes a trailing Store (the optional member in modules/module.hpp) writes it itself;
  // for one that only accumulates, the rows are zeroed first.
  template <class Be, class T, class S>
  static void backward_grouped(Be& be, PerGroup<const T> p, std::type_identity_t<PerGroup<T>> g, CPtr<T> ws,
                               const S& saved, CMV<T> x, MV<T> dx, CMV<T> df, Ptr<T> scratch, RowGroups groups,
                               Store dx_store) {
    if constexpr (requires { M::backward_grouped(be, p, g, ws, saved, x, dx, df, scratch, groups, dx_store); }) {
      detail::arm_scratch_guard<Be>(scratch, M::scratch(1, x.rows));
      M::backward_grouped(be, p, g, ws, saved, x, dx, df, scratch, groups, dx_store);
      detail::verify_scratch_guard<M, Be>(scratch, M::scratch(1, x.rows), "backward_grouped");
    } else {
      if (dx_store == Store::overwrite) be.zero_rows(dx, groups);
      backward_grouped(be, p, g, ws, saved, x, dx, df, scratch, groups);
    }
  }

  // ---- the same reading x's rows through x_idx in place of a gathered copy (ReadsRowsInPlaceOn, modules/module.hpp)
  template <class Be, class T, class S>
  static void forward_grouped(Be& be, PerGroup<const T> p, Ptr<T> ws, const S& saved, CMV<T> x,
                              std::span<const token_t> x_idx, MV<T> f_out, RowGroups groups) {
    if constexpr (requires { M::forward_grouped(be, p, ws, saved, x, x_idx, f_out, groups); }) {
      M::forward_grouped(be, p, ws, saved, x, x_idx, f_out, groups);
      detail::verify_workspace_guards<M, Be>(ws, "forward_grouped");
    } else
      static_assert(dependent_false<M>,
                    "mom module: reads_rows_in_place is set, but no member `static void forward_grouped(Be&, "
                    "PerGroup<const T> p, T* ws, const Saved&, MatrixView<const T> x, std::span<const token_t> x_idx, "
                    "MatrixView<T> f_out, RowGroups)` takes these arguments on this backend (modules/module.hpp; a module "
                    "derived from one that reads its rows in place can set reads_rows_in_place = false)");
  }
  template <class Be, class T, class S>
  static void backward_grouped(Be& be, PerGroup<const T> p, std::type_identity_t<PerGroup<T>> g, CPtr<T> ws,
                               const S& saved, CMV<T> x, std::span<const token_t> x_idx, MV<T> dx, CMV<T> df,
                               Ptr<T> scratch, RowGroups groups, Store dx_store) {
    if constexpr (requires { M::backward_grouped(be, p, g, ws, saved, x, x_idx, dx, df, scratch, groups, dx_store); }) {
      detail::arm_scratch_guard<Be>(scratch, M::scratch(1, df.rows));
      M::backward_grouped(be, p, g, ws, saved, x, x_idx, dx, df, scratch, groups, dx_store);
      detail::verify_scratch_guard<M, Be>(scratch, M::scratch(1, df.rows), "backward_grouped");
    } else
      static_assert(dependent_false<M>,
                    "mom module: reads_rows_in_place is set, but no member `static void backward_grouped(Be&, "
                    "PerGroup<const T> p, PerGroup<T> g, const T* ws, const Saved&, MatrixView<const T> x, "
                    "std::span<const token_t> x_idx, MatrixView<T> dx, MatrixView<const T> df, T* scratch, RowGroups, "
                    "Store)` takes these arguments on this backend (modules/module.hpp; a module derived from one that reads "
                    "its rows in place can set reads_rows_in_place = false)");
  }

  // ---- a routed sequence mixer over row groups, keys from `keys` (RoutedSequenceMixerOn) ----
  template <KeySource keys, class Be, class T, class S>
  static void forward_routed(Be& be, PerGroup<const T> p, Ptr<T> ws, const S& saved, CMV<T> x, CMV<T> xg,
                             MV<T> out, std::span<const token_t> idx, RowGroups groups, index_t seq) {
    if constexpr (requires { M::template forward_grouped<keys>(be, p, ws, saved, x, xg, out, idx, groups, seq); }) {
      M::template forward_grouped<keys>(be, p, ws, saved, x, xg, out, idx, groups, seq);
      detail::verify_workspace_guards<M, Be>(ws, "forward_grouped");
    } else
      static_assert(dependent_false<M>,
                    "mom attention module: no member `template <KeySource> static void forward_grouped(Be&, "
                    "PerGroup<const T> p, T* ws, const GroupedSaved<G>&, MatrixView<const T> x, MatrixView<const T> "
                    "xg, MatrixView<T> out, std::span<const token_t> idx, RowGroups, index_t seq)` that takes these "
                    "arguments on this backend, for the key source this architecture uses (modules/module.hpp)");
  }
  template <KeySource keys, class Be, class T, class S>
  static void backward_routed(Be& be, PerGroup<const T> p, std::type_identity_t<PerGroup<T>> g, CPtr<T> ws,
                              const S& saved, CMV<T> x, CMV<T> xg, MV<T> dx, MV<T> dxg, CMV<T> dout,
                              std::span<const token_t> idx, RowGroups groups, index_t seq, Ptr<T> scratch) {
    if constexpr (requires {
                    M::template backward_grouped<keys>(be, p, g, ws, saved, x, xg, dx, dxg, dout, idx, groups, seq,
                                                       scratch);
                  })
      M::template backward_grouped<keys>(be, p, g, ws, saved, x, xg, dx, dxg, dout, idx, groups, seq, scratch);
    else
      static_assert(dependent_false<M>,
                    "mom attention module: no member `template <KeySource> static void backward_grouped(Be&, "
                    "PerGroup<const T> p, PerGroup<T> g, const T* ws, const GroupedSaved<G>&, MatrixView<const T> x, "
                    "MatrixView<const T> xg, MatrixView<T> dx, MatrixView<T> dxg, MatrixView<const T> dout, "
                    "std::span<const token_t> idx, RowGroups, index_t seq, T* scratch)` that takes these arguments "
                    "on this backend, for the key source this architecture uses (modules/module.hpp)");
  }
};

}  // namespace mom

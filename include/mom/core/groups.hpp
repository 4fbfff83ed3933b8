#pragma once
// Row groups: the vocabulary of the routed ops that never read a routing decision on the host.
//
// A routed step (MoM, MoE, layer-skip) sorts its (token, module) pairs by module, so module g's
// rows of a packed matrix are the consecutive rows [offsets[g], offsets[g+1]). The offsets are
// computed by the backend (group_by_choice, skip_select) and stay in backend memory: on a GPU the
// host never learns the group sizes, so a training step has no host-device synchronisation
// (docs/design.md, "Data and the hot path"). Ops that take RowGroups read the offsets inside their
// kernels; only the bounds known from the cost model (the packed matrix's row count, the number of
// groups) are host values.
//
//   RowGroups   g.offsets: count + 1 non-decreasing row indices in backend memory.
//               Rows outside [offsets[0], offsets[count]) are neither read nor written by a
//               grouped op (for MoM these are the SKIP class's rows, which the router sorts last).
//   PerGroup<T> one tensor per group (module g's weight, bias, LayerNorm gain, key matrix...):
//               group g's tensor starts at base + at[g]; the offsets table is a host value
//               (parameter layout, known at compile time), passed to kernels by value.
//   ScaledRows<T>  a packed matrix read through a table: its row r is scale[r] · table[index[r]] (a routed
//               layer's dL/d(module output), the routing weight times its token's output gradient, never
//               stored; or an expert's input rows, x[token]); index empty: the table itself.
#include <array>
#include <span>

#include "mom/core/check.hpp"
#include "mom/core/tensor.hpp"

namespace mom {

// Most groups one grouped op serves (modules of one kind in a ModuleSet, experts of one MoE step).
inline constexpr int max_row_groups = 256;

struct RowGroups {
  const token_t* offsets = nullptr;  // count + 1 entries, backend memory
  int count = 0;
};

// Packed row r = scale[r] · table[index[r]] (scale empty: 1; index empty: the table's own row r, and no scale), in
// backend memory. A backend that reads such rows inside its products (the CPU's grouped_linear_backward) saves
// writing them out and reading them back; the CPU's linear ops take their stored operands in the same form.
template <class T>
struct ScaledRows {
  MatrixView<const T> table;
  std::span<const token_t> index;
  std::span<const T> scale;
  index_t rows() const { return index.empty() ? table.rows : index_t(index.size()); }
  // The packed matrix's shape (for shape checks; its data pointer is the table's).
  MatrixView<const T> shape() const { return {table.data, rows(), table.cols, table.ld}; }
};

template <class T>
struct PerGroup {
  T* base = nullptr;
  std::array<index_t, max_row_groups> at{};

  constexpr PerGroup() = default;
  // Group g's tensor at base + at(g) for g < count.
  template <class F>
  constexpr PerGroup(T* b, int count, F&& at_of) : base(b) {
    MOM_CHECK(count >= 0 && count <= max_row_groups, "PerGroup: ", count, " groups (at most ", max_row_groups, ")");
    for (int g = 0; g < count; ++g) at[std::size_t(g)] = index_t(at_of(g));
  }
  // PerGroup<T> converts to PerGroup<const T>.
  template <class U>
    requires(std::is_same_v<const U, T> && !std::is_same_v<U, T>)
  constexpr PerGroup(const PerGroup<U>& o) : base(o.base), at(o.at) {}

  constexpr bool empty() const { return base == nullptr; }
  constexpr T* operator[](int g) const { return base + at[std::size_t(g)]; }
  // The same groups' tensors `o` elements further on (from a module's parameter block to one of
  // its tensors, from row 0 to a column block).
  constexpr PerGroup plus(index_t o) const {
    PerGroup r = *this;
    if (r.base) r.base += o;
    return r;
  }
};

// `count` tensors of `stride` elements back to back from base (expert e's weights at base + e·stride: the
// expert blocks of σ-MoE, SwitchHead, MoA and SMoE).
template <class T>
constexpr PerGroup<T> uniform_groups(T* base, int count, index_t stride) {
  return PerGroup<T>(base, count, [stride](int g) { return index_t(g) * stride; });
}

// `count` groups that all read the one tensor at base: one module over one row group (a skip layer's
// run rows), or one packed matrix every group's rows index into (routed keys and values).
template <class T>
constexpr PerGroup<T> same_for_groups(T* base, int count = 1) {
  return PerGroup<T>(base, count, [](int) { return 0; });
}

}  // namespace mom

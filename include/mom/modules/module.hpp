#pragma once
// What every module family shares. A module family (MHA<N>, FFN<N>, Skip) is an element
// of a ModuleSet (the paper's M, eq. (1)); each family names how many modules it holds
// and which single-module type computes one of them.
//
// A single module m computes f(LN(x)) with its own LayerNorm (pre-norm, paper eq. (4));
// the assembling function phi adds the residual and the routing weights. Every single
// module type provides, for a Dims D:
//   tensors(layer)        its parameter tensors in layout order (TensorSpec, names below h.<layer>)
//   params                parameter count
//   flops_per_token(seq)  forward multiply-add FLOPs per token (2*m*n*k per GEMM)
//   Saved plan(Arena&, batch, seq)   activations kept from forward for backward
//   scratch(batch, seq)   backward scratch elements (shared by all modules)
//   forward / backward    generic over the backend, side by side
#include <concepts>
#include <span>

#include "mom/core/dims.hpp"
#include "mom/core/groups.hpp"
#include "mom/core/layout.hpp"
#include "mom/core/tensor.hpp"

namespace mom {

// Block: a family of L transformer blocks (attention + FFN pairs, modules/block.hpp).
enum class ModuleKind { Attention, FeedForward, Skip, Block };

// A family of modules inside a ModuleSet: `kind`, `count` and, for computing modules, the
// single-module type `template <Dims> single`.
template <class F>
concept ModuleFamily = requires {
  { F::kind } -> std::convertible_to<ModuleKind>;
  { F::count } -> std::convertible_to<int>;
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

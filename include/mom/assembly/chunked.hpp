#pragma once
// Chunked<Parts...>: a model cut into consecutive parts, each an Assembly, e.g. the paper's
// chunking strategy [1-1-4-1-1] (Appendix, Table "chunking"):
//   Chunked<Layer, Layer, Assembly<Router<GRU>, ModuleSet<MHA<4>, FFN<4>, Skip>, K<2>, H<6>>, Layer, Layer>
// Layer names continue across parts: part i's layers are named from the sum of the depths
// of the parts before it, so Chunked<Layer, Layer> has the same layout as Dense<2>.
#include "mom/assembly/assembly.hpp"

namespace mom {

template <class... Parts>
struct Chunked {
  static_assert(sizeof...(Parts) > 0, "mom::Chunked: a chunking needs at least one part, e.g. Chunked<Layer, Chunk, Layer>");
  static_assert((is_assembly<Parts> && ...),
                "mom::Chunked: every part must be an Assembly (Layer, Dense<L> or Assembly<R, M, K, H>)");
  using parts = TypeList<Parts...>;
};

template <class T>
inline constexpr bool is_chunked = false;
template <class... Ps>
inline constexpr bool is_chunked<Chunked<Ps...>> = true;

// An architecture, as LM<dims, Arch> accepts it.
template <class A>
concept Architecture = is_assembly<A> || is_chunked<A>;

}  // namespace mom

#pragma once
// The Mixture-of-Modules configurations of the paper (§4.1, Appendix A) as types.
//
//   KaHb<a, b>       Assembly<Router<GRU>, ModuleSet<MHA<4>, FFN<4>>, K<a>, H<b>>          (chunk, N = 4)
//   KaHbS<a, b>      the same with Skip in the module set (the paper's suffix S)
//   MoM_P = K2H6S (performant), MoM_I = K3H2S (interpolation), MoM_E = K3H1S (efficient)
//   Strategy_11411<Chunk>   [1-1-4-1-1]  an 8-layer model: 2 layers, one chunk of 4, 2 layers
//   MoMSmall<Chunk>         [1-1-4-1-4-1]                    on GPT-2 small (12 layers)
//   MoMMedium<Chunk>        [1-1-1-4-1-4-1-4-1-4-1-1]        on GPT-2 medium (24 layers)
//   MoMLarge<Chunk>         [1-4-1-1-4-1-1-4-1-1-4-1-1-4-1-1-4-1]  on GPT-2 large (36 layers): the
//                           paper prints [1-4-1-4-1-4-1-4-1-4-1-4-1], which has 31 layers, not 36;
//                           MoMLargeAsPrinted<Chunk> is that 31-layer strategy.
// Each strategy keeps every layer name of the dense model (a chunk of 4 owns h.i .. h.i+3), so a
// dense checkpoint of the same depth maps one to one (warm start, §3.4).
#include <span>
#include <vector>

#include "mom/assembly/chunked.hpp"
#include "mom/assembly/gru.hpp"
#include "mom/models/gpt2.hpp"
#include "mom/models/realised_flops.hpp"  // realised_forward_flops, kept reachable from here
#include "mom/models/lm.hpp"

namespace mom {

template <int a, int b, int N = 4, class R = Router<GRU>, class Phi = phi::MoM>
using KaHb = Assembly<R, ModuleSet<MHA<N>, FFN<N>>, K<a>, H<b>, Phi>;
template <int a, int b, int N = 4, class R = Router<GRU>, class Phi = phi::MoM>
using KaHbS = Assembly<R, ModuleSet<MHA<N>, FFN<N>, Skip>, K<a>, H<b>, Phi>;

template <class R = Router<GRU>, class Phi = phi::MoM>
using MoM_P = KaHbS<2, 6, 4, R, Phi>;
template <class R = Router<GRU>, class Phi = phi::MoM>
using MoM_I = KaHbS<3, 2, 4, R, Phi>;
template <class R = Router<GRU>, class Phi = phi::MoM>
using MoM_E = KaHbS<3, 1, 4, R, Phi>;

template <class Chunk>
using Strategy_11411 = Chunked<Layer, Layer, Chunk, Layer, Layer>;
template <class Chunk>
using MoMSmall = Chunked<Layer, Layer, Chunk, Layer, Chunk, Layer>;
template <class Chunk>
using MoMMedium = Chunked<Layer, Layer, Layer, Chunk, Layer, Chunk, Layer, Chunk, Layer, Chunk, Layer, Layer>;
template <class Chunk>
using MoMLarge = Chunked<Layer, Chunk, Layer, Layer, Chunk, Layer, Layer, Chunk, Layer, Layer, Chunk, Layer, Layer,
                         Chunk, Layer, Layer, Chunk, Layer>;
template <class Chunk>
using MoMLargeAsPrinted = Chunked<Layer, Chunk, Layer, Chunk, Layer, Chunk, Layer, Chunk, Layer, Chunk, Layer, Chunk, Layer>;

// The paper's three scales with a chunk configuration, on the GPT-2 shapes.
template <class Chunk>
using MoMSmallLM = LM<gpt2_small, MoMSmall<Chunk>>;
template <class Chunk>
using MoMMediumLM = LM<gpt2_medium, MoMMedium<Chunk>>;
template <class Chunk>
using MoMLargeLM = LM<gpt2_large, MoMLarge<Chunk>>;

}  // namespace mom

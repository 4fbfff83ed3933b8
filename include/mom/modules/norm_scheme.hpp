#pragma once
// Where a module puts its LayerNorm (MoEUT, arXiv 2405.16039, §2.4 and Fig. 3), for the modules that
// offer the choice (SigmaMoE, SwitchHead):
//   PreNorm   LN(x) feeds every projection of the module (GPT-2's pre-norm, paper eq. (4) of MoM)
//   PeriNorm  LN(x) feeds only the linear layers followed by a sigmoid or softmax: the expert selections,
//             and attention's query and key projections; the value path and the experts read x itself
// (Post-LayerNorm normalises the residual stream after the addition, an assembling-function choice that
// the library does not offer.)
#include <type_traits>

namespace mom {

struct PreNorm {};
struct PeriNorm {};

template <class N>
inline constexpr bool is_norm_scheme = std::is_same_v<N, PreNorm> || std::is_same_v<N, PeriNorm>;

}  // namespace mom

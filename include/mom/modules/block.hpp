#pragma once
// Block<L>: L whole transformer blocks (pre-norm attention then FFN, each adding to the residual
// stream), the unit Mixture-of-Depths routes tokens to or around (Raposo et al. 2024, §3.4: "f
// comprises self-attention and the subsequent MLP"). In a ModuleSet it stands for MHA<L> and
// FFN<L> paired, with the same parameters and names (h.<i>.ln_1.*, h.<i>.attn.*, h.<i>.ln_2.*,
// h.<i>.mlp.*), so a Dense<L> checkpoint maps one to one onto ModuleSet<Block<L>, Skip>.
#include "mom/modules/module.hpp"

namespace mom {

template <int L>
struct Block {
  static constexpr ModuleKind kind = ModuleKind::Block;
  static constexpr int count = L;
};

}  // namespace mom

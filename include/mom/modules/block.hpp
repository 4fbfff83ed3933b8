#pragma once
// Block<L>: L whole transformer blocks (pre-norm attention then FFN, each adding to the residual
// stream), the unit Mixture-of-Depths routes tokens to or around (Raposo et al. 2024, arXiv 2404.02258,
// §3.4: "f comprises self-attention and the subsequent MLP"). In a ModuleSet it stands for MHA<L> and
// FFN<L> paired, with the same parameters and names (h.<i>.ln_1.*, h.<i>.attn.*, h.<i>.ln_2.*,
// h.<i>.mlp.*), so a Dense<L> checkpoint maps one to one onto ModuleSet<Block<L>, Skip>. The block's
// sequence and token mixers are parameters (GPT-2's attention and FFN by default).
#include "mom/modules/ffn.hpp"
#include "mom/modules/mha.hpp"
#include "mom/modules/module.hpp"

namespace mom {

template <int L, template <Dims> class Seq = modules::Attention, template <Dims> class Tok = modules::FeedForward>
struct Block {
  static constexpr ModuleRole role = ModuleRole::Block;
  static constexpr int count = L;
  template <Dims D>
  using sequence_mixer = Seq<D>;
  template <Dims D>
  using token_mixer = Tok<D>;
};

}  // namespace mom

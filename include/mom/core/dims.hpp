#pragma once
// The shape of a model, as a value that can be a template argument:
//   constexpr Dims dims{.d_model = 256, .heads = 8, .d_ff = 1024, .vocab = 50257, .context = 256};
//   using Model = LM<dims, Dense<4>>;
// Dims is a structural class (public members, literal type), so two models with the same
// numbers are the same type. New fields go at the end with a default, so existing
// designated initializers keep compiling.
#include "mom/core/tensor.hpp"

namespace mom {

// How a model knows token positions:
//   Learned  GPT-2's learned position embedding: x_0 = wte[token] + wpe[position] (wpe [context × d])
//   RoPE     rotary position embedding (Su et al., arXiv 2104.09864): no wpe; every attention module
//            rotates its queries and keys by their positions (backend/cpu/rope.hpp), so attention
//            scores depend on relative positions only (as in MoEUT, arXiv 2405.16039)
//   None     no position signal in the embedding or in q/k: for attention that encodes order itself
//            (ModuleFormer's stick-breaking attention, arXiv 2306.04640 §3.2); no wpe, so the model
//            also runs on sequences longer than the one it was trained at (up to `context`)
enum class Positions { Learned, RoPE, None };

struct Dims {
  index_t d_model = 0;  // width of the residual stream
  index_t heads = 0;    // attention heads per MHA module; d_model % heads == 0
  index_t d_ff = 0;     // FFN hidden width; 0 means 4 * d_model (GPT-2)
  index_t vocab = 0;    // token embedding rows = LM head rows (tied)
  index_t context = 0;  // longest sequence (Learned: the rows of wpe)
  Positions positions = Positions::Learned;
  index_t rope_base = 10000;  // RoPE: θ_i = rope_base^(−2i/head_dim) (eq. (15) of 2104.09864); unused when Learned

  constexpr index_t ff() const { return d_ff == 0 ? 4 * d_model : d_ff; }
  constexpr index_t head_dim() const { return heads > 0 ? d_model / heads : 0; }
  constexpr bool rope() const { return positions == Positions::RoPE; }
  constexpr bool learned_positions() const { return positions == Positions::Learned; }  // has a wpe
  friend constexpr bool operator==(const Dims&, const Dims&) = default;
};

// The same shape with rotary position embeddings instead of a learned wpe (base: d.rope_base, 10000
// unless set, or the one given):
//   using Model = LM<with_rope(dims), Dense<4>>;        // or LMRoPE<dims, Dense<4>> (models/lm.hpp)
constexpr Dims with_rope(Dims d) {
  d.positions = Positions::RoPE;
  return d;
}
constexpr Dims with_rope(Dims d, index_t base) {
  d.rope_base = base;
  return with_rope(d);
}
// The same shape with no position embedding at all (Positions::None): the attention modules must
// encode order themselves (MoA's stick-breaking heads, modules/moa.hpp).
constexpr Dims without_positions(Dims d) {
  d.positions = Positions::None;
  return d;
}

// Checked when a model type is instantiated (LM<dims, ...>): every static_assert below
// reports at the user's line with a message in the user's terms. Conditions are guarded
// so that one mistake gives one message (no division by zero after "heads must be > 0").
template <Dims D>
struct VerifyDims {
  static_assert(D.d_model > 0, "mom::Dims: d_model must be > 0");
  static_assert(D.heads > 0, "mom::Dims: heads must be > 0");
  static_assert(D.heads <= 0 || D.d_model % D.heads == 0, "mom::Dims: d_model must be divisible by heads");
  static_assert(D.d_ff >= 0, "mom::Dims: d_ff must be > 0 (or 0 for the default 4 * d_model)");
  static_assert(D.vocab > 0, "mom::Dims: vocab must be > 0");
  static_assert(D.context > 0, "mom::Dims: context must be > 0");
  static constexpr bool heads_ok = D.d_model > 0 && D.heads > 0 && D.d_model % D.heads == 0;
  static_assert(!D.rope() || !heads_ok || D.head_dim() % 2 == 0,
                "mom::Dims: RoPE rotates pairs of columns: the head dimension d_model / heads must be even");
  static_assert(!D.rope() || D.rope_base > 1,
                "mom::Dims: rope_base must be > 1 (RoPE's theta_i = rope_base^(-2i/head_dim))");
  static constexpr bool ok = heads_ok && D.d_ff >= 0 && D.vocab > 0 && D.context > 0 &&
                             (!D.rope() || (D.head_dim() % 2 == 0 && D.rope_base > 1));
};

}  // namespace mom

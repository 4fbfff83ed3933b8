#pragma once
// The shape of a model, as a value that can be a template argument:
//   constexpr Dims dims{.d_model = 256, .heads = 8, .d_ff = 1024, .vocab = 50257, .context = 256};
//   using Model = LM<dims, Dense<4>>;
// Dims is a structural class (public members, literal type), so two models with the same
// numbers are the same type. New fields go at the end with a default, so existing
// designated initializers keep compiling.
#include "mom/core/tensor.hpp"

namespace mom {

struct Dims {
  index_t d_model = 0;  // width of the residual stream
  index_t heads = 0;    // attention heads per MHA module; d_model % heads == 0
  index_t d_ff = 0;     // FFN hidden width; 0 means 4 * d_model (GPT-2)
  index_t vocab = 0;    // token embedding rows = LM head rows (tied)
  index_t context = 0;  // learned position embedding rows = longest sequence

  constexpr index_t ff() const { return d_ff == 0 ? 4 * d_model : d_ff; }
  constexpr index_t head_dim() const { return heads > 0 ? d_model / heads : 0; }
  friend constexpr bool operator==(const Dims&, const Dims&) = default;
};

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
  static constexpr bool ok = D.d_model > 0 && D.heads > 0 && D.d_model % D.heads == 0 && D.d_ff >= 0 &&
                             D.vocab > 0 && D.context > 0;
};

}  // namespace mom

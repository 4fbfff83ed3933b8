#pragma once
// The GPT-2 shapes (Radford et al. 2019; Hugging Face gpt2, gpt2-medium, gpt2-large) as dense
// models: vocabulary 50257, context 1024, d_ff = 4 * d_model, tied LM head.
#include "mom/models/lm.hpp"

namespace mom {

inline constexpr Dims gpt2_small{.d_model = 768, .heads = 12, .d_ff = 3072, .vocab = 50257, .context = 1024};
inline constexpr Dims gpt2_medium{.d_model = 1024, .heads = 16, .d_ff = 4096, .vocab = 50257, .context = 1024};
inline constexpr Dims gpt2_large{.d_model = 1280, .heads = 20, .d_ff = 5120, .vocab = 50257, .context = 1024};
inline constexpr int gpt2_small_layers = 12;
inline constexpr int gpt2_medium_layers = 24;
inline constexpr int gpt2_large_layers = 36;

using GPT2Small = LM<gpt2_small, Dense<gpt2_small_layers>>;     // 124,439,808 parameters
using GPT2Medium = LM<gpt2_medium, Dense<gpt2_medium_layers>>;  // 354,823,168 parameters
using GPT2Large = LM<gpt2_large, Dense<gpt2_large_layers>>;     // 774,030,080 parameters

}  // namespace mom

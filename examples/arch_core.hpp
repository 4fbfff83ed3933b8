// mom-train's registry entries for the dense models (byte-level and GPT-2 shapes) and the Mixture-of-Modules
// models of issue 5 at dense8's shape (the paper's 8-layer [1-1-4-1-1] strategy; phase 2 warm-starts from a
// dense8 run, §3.4).
#pragma once
#include "architectures.hpp"

namespace mom::examples {

template <class Reg>
void core_architectures(Reg& reg) {
  reg.template add<Tiny>("tiny", "byte", "byte-level, the default; KJV in a few minutes on 2 cores");
  reg.template add<Small>("small", "byte", "byte-level, wider context");
  reg.template add<SmallBpe>("small-bpe", "gpt2", "GPT-2 BPE vocabulary");
  reg.template add<GPT2Small>("gpt2-small", "gpt2", "GPT-2 124M shape");
  reg.template add<GPT2Medium>("gpt2-medium", "gpt2", "GPT-2 355M shape");
  reg.template add<GPT2Large>("gpt2-large", "gpt2", "GPT-2 774M shape");
  reg.template add<Dense8>("dense8", "byte", "byte-level 8 layers, d 256: phase 1 / the dense twin of mom8-*");
  reg.template add<MoM8P, Dense8>("mom8-p", "byte", "MoM_P = K2H6S, [1-1-4-1-1]; phase 2: --init-from a dense8 run", "dense8");
  reg.template add<MoM8I, Dense8>("mom8-i", "byte", "MoM_I = K3H2S, [1-1-4-1-1]; phase 2: --init-from a dense8 run", "dense8");
  reg.template add<MoM8E, Dense8>("mom8-e", "byte", "MoM_E = K3H1S, [1-1-4-1-1]; phase 2: --init-from a dense8 run", "dense8");
}

}  // namespace mom::examples

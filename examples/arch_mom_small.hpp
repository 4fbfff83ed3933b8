// mom-train's registry entries for the Mixture-of-Modules paper's own models: MoM-small, the [1-1-4-1-4-1]
// chunking of GPT-2 small (arXiv 2407.06677, Table 1) with MoM_P / MoM_I / MoM_E chunks; phase 2 warm-starts
// from a gpt2-small run (or a Hugging Face GPT-2 model.safetensors). Sized for a GPU (--device cuda); in a
// family of their own so their training code compiles in its own translation units, beside the others.
#pragma once
#include "architectures.hpp"

namespace mom::examples {

template <class Reg>
void mom_small_architectures(Reg& reg) {
  reg.template add<GPT2SmallMoMP, GPT2Small>("gpt2-small-mom-p", "gpt2", "MoM_P on GPT-2 small, [1-1-4-1-4-1]; phase 2: --init-from a gpt2-small run", "gpt2-small");
  reg.template add<GPT2SmallMoMI, GPT2Small>("gpt2-small-mom-i", "gpt2", "MoM_I on GPT-2 small, [1-1-4-1-4-1]; phase 2: --init-from a gpt2-small run", "gpt2-small");
  reg.template add<GPT2SmallMoME, GPT2Small>("gpt2-small-mom-e", "gpt2", "MoM_E on GPT-2 small, [1-1-4-1-4-1]; phase 2: --init-from a gpt2-small run", "gpt2-small");
}

}  // namespace mom::examples

#pragma once
// mom: transformer architectures as C++20 types (the Mixture-of-Modules 5-tuple and its
// special cases), with a CPU backend. One include for users:
//   #include <mom/mom.hpp>
//   using namespace mom;
//   constexpr Dims dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 256, .context = 64};
//   using Model = LM<dims, Dense<4>>;
//   auto m = Model::make<cpu::Backend<float>>(1);
#include "mom/core/dims.hpp"
#include "mom/core/layout.hpp"
#include "mom/core/meta.hpp"
#include "mom/routing/dispatch.hpp"    // the routing layer: gather, weighted scatter, their backward
#include "mom/routing/expert_mlp.hpp"  // the expert MLP of σ-MoE and SMoE
#include "mom/routing/select.hpp"      // selections: softmax / sigmoid top-K, grouping
#include "mom/modules/experts.hpp"
#include "mom/modules/ffn.hpp"
#include "mom/modules/mha.hpp"
#include "mom/modules/module_set.hpp"
#include "mom/modules/skip.hpp"
#include "mom/routers/router.hpp"
#include "mom/routers/sequential.hpp"
#include "mom/routers/gru.hpp"
#include "mom/routers/share.hpp"
#include "mom/routers/topk.hpp"
#include "mom/routers/affinity.hpp"  // DeepSeekMoE's affinity gate (TopK<Sigmoid> is in topk.hpp)
#include "mom/assembly/assembly.hpp"
#include "mom/assembly/chunked.hpp"
#include "mom/assembly/phi.hpp"
#include "mom/assembly/sequential.hpp"
#include "mom/assembly/gru.hpp"
#include "mom/assembly/share.hpp"
#include "mom/assembly/moe.hpp"
#include "mom/modules/block.hpp"
#include "mom/routers/depth.hpp"
#include "mom/assembly/depth.hpp"
#include "mom/assembly/recursion.hpp"  // Mixture-of-Recursions
#include "mom/models/describe.hpp"
#include "mom/models/gpt2.hpp"
#include "mom/models/lm.hpp"
#include "mom/models/runtime.hpp"
#include "mom/models/mom_models.hpp"  // MoM_P / MoM_I / MoM_E, the paper's chunkings
#include "mom/models/moe_models.hpp"  // MoEStack, MoEShareStack, MoDEIntegrated, MoDEStaged
#include "mom/models/moeut_models.hpp"  // SigmaMoE, SwitchHead, MoEUTStack, MoEUT<dims, L, G>
#include "mom/backend/cpu.hpp"
#include "mom/infer/generate.hpp"  // Decoder (KV cache), generate

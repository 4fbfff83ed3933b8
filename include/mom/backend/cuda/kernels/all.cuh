#pragma once
// Every kernel family of the CUDA backend (one file per op family, each with its kernels and their launchers): what
// the compiled units mom_cuda.cu (float) and mom_cuda_double.cu (double) include before their explicit
// instantiations. Only nvcc (or the host compiler under MOM_CUDA_EMULATE, tests/cuda/emu/) reads it. A non-template
// function or kernel defined in these files is wrapped in #if defined(MOM_CUDA_FLOAT_UNIT), which mom_cuda.cu alone
// defines (else the two units would both define it: a link error), or made a template of nothing where both units
// launch it (dev::count_targets_kernel<>).
#include "mom/backend/cuda/kernels/common.cuh"  // launch, reductions, error report

#include "mom/backend/cuda/kernels/linear.cuh"  // fill, bias broadcast and column sums, bf16 staging
#include "mom/backend/cuda/kernels/embedding.cuh"
#include "mom/backend/cuda/kernels/layernorm.cuh"
#include "mom/backend/cuda/kernels/activation.cuh"  // gelu, relu, add, axpy, scale
#include "mom/backend/cuda/kernels/cross_entropy.cuh"
#include "mom/backend/cuda/kernels/attention.cuh"         // dense causal attention (SIMT)
#include "mom/backend/cuda/kernels/attention_packed.cuh"  // packed and grouped attention
#include "mom/backend/cuda/kernels/routing.cuh"           // router top-K, balance loss, group_by_module
#include "mom/backend/cuda/kernels/affinity.cuh"          // DeepSeekMoE's biased top-K, loads, bias update
#include "mom/backend/cuda/kernels/expert_choice.cuh"     // expert-choice MoE: each expert's top-c tokens
#include "mom/backend/cuda/kernels/rows.cuh"              // gather / scatter, topk_rows, softmax_rows
#include "mom/backend/cuda/kernels/gru.cuh"
#include "mom/backend/cuda/kernels/optim.cuh"  // grad_norm, AdamW
#include "mom/backend/cuda/kernels/depth.cuh"  // depth routing (DepthKernels)
#include "mom/backend/cuda/kernels/grouped.cuh"         // row groups on the device (GroupedKernels)
#include "mom/backend/cuda/kernels/grouped_linear.cuh"  // the grouped GEMMs
#include "mom/backend/cuda/kernels/grouped_rows.cuh"    // grouped LayerNorm and row ops
#include "mom/backend/cuda/kernels/attention_tc.cuh"    // dense attention on tensor cores (float)
#include "mom/backend/cuda/kernels/attention_packed_tc.cuh"  // packed and grouped attention on tensor cores
#include "mom/backend/cuda/kernels/rope.cuh"            // rotary position embedding (dense and grouped rows)
#include "mom/backend/cuda/kernels/stick_breaking.cuh"  // stick-breaking attention (ModuleFormer)
#include "mom/backend/cuda/kernels/decode.cuh"          // kv_write, attention_decode (KV-cache decoding)

// The compiled part of the CUDA backend: every kernel of kernels/ (one file per op family, each with
// its kernels and their launchers), instantiated for float and double. CMake builds it into
// mom::cuda; a project that uses the installed headers without CMake compiles this one file with
// nvcc (-std=c++20) and links it with cudart, cublas and cublasLt. The host-side declarations are
// kernels.hpp (Kernels<T>, Context), depth_kernels.hpp and grouped_kernels.hpp.
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
#include "mom/backend/cuda/kernels/rope.cuh"            // rotary position embedding (dense and grouped rows)
#include "mom/backend/cuda/kernels/stick_breaking.cuh"  // stick-breaking attention (ModuleFormer)
#include "mom/backend/cuda/kernels/decode.cuh"          // kv_write, attention_decode (KV-cache decoding)

namespace mom::cuda {
template struct Kernels<float>;
template struct Kernels<double>;
template struct DepthKernels<float>;
template struct DepthKernels<double>;
template struct GroupedKernels<float>;
template struct GroupedKernels<double>;
template void fill<float>(const Context&, float*, index_t, float);
template void fill<double>(const Context&, double*, index_t, double);
template void fill<token_t>(const Context&, token_t*, index_t, token_t);
}  // namespace mom::cuda

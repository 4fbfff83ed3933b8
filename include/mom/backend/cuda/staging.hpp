#pragma once
// The CUDA backend's staging and dispatch scratch, held in its Context (kernels.hpp) and grown, never shrunk:
//   reserve_bf16_staging   the bf16 copies of a Precision::BF16 GEMM's two operands (docs/cuda.md, "Precision")
//   reserve_workspace      the GEMMs' workspace, also the stick-breaking backward's table (32 MiB to start)
//   reserve_dispatch       group_by_module's CUB temp storage, pair ids, sorted keys and counts (the token
//                          dispatch of docs/design.md, "Data and the hot path"; docs/cuda.md, "Token dispatch")
// Growing synchronises the stream (cudaFree + cudaMalloc), so a caller sizes both once, outside the training
// step; the ops grow them on first use otherwise, after which a step of the same shapes never allocates.
// cuda::Backend's members of the same names call these.
#include <algorithm>
#include <cstddef>

#include <cuda_runtime_api.h>

#include "mom/backend/cuda/check.hpp"
#include "mom/backend/cuda/kernels.hpp"
#include "mom/core/check.hpp"

namespace mom::cuda {

// Sizes the bf16 staging for operands of up to `elements` elements together (A and B of one GEMM).
inline void reserve_bf16_staging(Context& c, index_t elements) {
  if (elements <= c.bf16_stage_size) return;
  MOM_CUDA_CHECK(cudaStreamSynchronize(c.stream), "reserve_bf16_staging");
  MOM_CUDA_CHECK(cudaFree(c.bf16_stage), "reserve_bf16_staging");
  c.bf16_stage = nullptr;
  c.bf16_stage_size = 0;
  MOM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&c.bf16_stage), static_cast<std::size_t>(elements) * 2),
                 "reserve_bf16_staging");
  c.bf16_stage_size = elements;
  ++c.bf16_stage_grows;
}

// Grows the context's workspace (cuBLASLt's, the split weight gradients' partials, the stick-breaking backward's
// table) to at least `bytes`.
inline void reserve_workspace(Context& c, std::size_t bytes) {
  if (bytes <= c.workspace_bytes) return;
  MOM_CUDA_CHECK(cudaStreamSynchronize(c.stream), "reserve_workspace");
  MOM_CUDA_CHECK(cudaFree(c.workspace), "reserve_workspace");
  c.workspace = nullptr;
  c.workspace_bytes = 0;
  MOM_CUDA_CHECK(cudaMalloc(&c.workspace, bytes), "reserve_workspace");
  c.workspace_bytes = bytes;
}

// Sizes group_by_module's CUB temp storage and scratch for up to n_pairs pairs and n_modules modules.
inline void reserve_dispatch(Context& c, index_t n_pairs, index_t n_modules) {
  MOM_CHECK(n_pairs >= 0 && n_modules >= 1, "reserve_dispatch: n_pairs ", n_pairs, ", n_modules ", n_modules);
  if (n_pairs <= c.dispatch_pairs && n_modules <= c.dispatch_modules) return;  // sized already
  n_pairs = std::max(n_pairs, c.dispatch_pairs);
  n_modules = std::max(n_modules, c.dispatch_modules);
  const std::size_t bytes = group_by_module_temp_bytes(n_pairs, n_modules);
  if (bytes > c.cub_temp_bytes) {
    MOM_CUDA_CHECK(cudaStreamSynchronize(c.stream), "reserve_dispatch");
    MOM_CUDA_CHECK(cudaFree(c.cub_temp), "reserve_dispatch");
    c.cub_temp = nullptr;
    c.cub_temp_bytes = 0;
    MOM_CUDA_CHECK(cudaMalloc(&c.cub_temp, bytes), "reserve_dispatch");
    c.cub_temp_bytes = bytes;
  }
  if (n_pairs > c.pair_ids_size) {
    MOM_CUDA_CHECK(cudaStreamSynchronize(c.stream), "reserve_dispatch");
    MOM_CUDA_CHECK(cudaFree(c.pair_ids), "reserve_dispatch");
    MOM_CUDA_CHECK(cudaFree(c.sorted_keys), "reserve_dispatch");
    c.pair_ids = c.sorted_keys = nullptr;
    c.pair_ids_size = 0;
    const std::size_t bytes_ids = static_cast<std::size_t>(n_pairs) * sizeof(token_t);
    MOM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&c.pair_ids), bytes_ids), "reserve_dispatch");
    MOM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&c.sorted_keys), bytes_ids), "reserve_dispatch");
    c.pair_ids_size = n_pairs;
  }
  if (n_modules + 1 > c.counts_size) {
    MOM_CUDA_CHECK(cudaStreamSynchronize(c.stream), "reserve_dispatch");
    MOM_CUDA_CHECK(cudaFree(c.counts), "reserve_dispatch");
    c.counts = nullptr;
    c.counts_size = 0;
    MOM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&c.counts), static_cast<std::size_t>(n_modules + 1) * sizeof(int)),
                   "reserve_dispatch");
    c.counts_size = n_modules + 1;
  }
  c.dispatch_pairs = n_pairs;
  c.dispatch_modules = n_modules;
}

}  // namespace mom::cuda

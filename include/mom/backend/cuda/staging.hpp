#pragma once
// The CUDA backend's staging and dispatch scratch, held in its Context (kernels.hpp) and grown, never shrunk:
//   reserve_bf16_staging   the bf16 copies of a Precision::BF16 GEMM's two operands (docs/cuda.md, "Precision")
//   reserve_workspace      the GEMMs' workspace, also the stick-breaking backward's table (32 MiB to start)
//   reserve_dispatch       group_by_module's CUB temp storage, pair ids, sorted keys and counts (the token
//                          dispatch of docs/design.md, "Data and the hot path"; docs/cuda.md, "Token dispatch")
// Growing synchronises the stream (cudaFree + cudaMalloc), so a caller sizes them once, outside the training
// step; the ops grow them on first use otherwise, after which a step of the same shapes never allocates.
// cuda::Backend's members of the same names call these.
#include <algorithm>
#include <cstddef>

#include <cuda_runtime_api.h>

#include "mom/backend/cuda/check.hpp"
#include "mom/backend/cuda/kernels.hpp"
#include "mom/core/check.hpp"

namespace mom::cuda {

// Replaces the device buffer p with one of `bytes` once the stream's work (which may still read p) is done; size, the
// buffer's recorded size, is 0 while it is being replaced (so a failed allocation leaves an empty buffer, not a lie).
// Counted in scratch_grows: a graph recorded before holds p's old value (infer::Decoder records again).
template <class U, class N>
void regrow(Context& c, U*& p, N& size, N new_size, std::size_t bytes, const char* op) {
  ++c.scratch_grows;
  MOM_CUDA_CHECK(cudaStreamSynchronize(c.stream), op);
  MOM_CUDA_CHECK(cudaFree(p), op);
  p = nullptr;
  size = 0;
  MOM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p), bytes), op);
  size = new_size;
}

// Sizes the bf16 staging for operands of up to `elements` elements together (A and B of one GEMM).
inline void reserve_bf16_staging(Context& c, index_t elements) {
  if (elements <= c.bf16_stage_size) return;
  regrow(c, c.bf16_stage, c.bf16_stage_size, elements, static_cast<std::size_t>(elements) * 2, "reserve_bf16_staging");
  ++c.bf16_stage_grows;
}

// Grows the context's workspace (cuBLASLt's, the split weight gradients' partials, the stick-breaking backward's
// table) to at least `bytes`.
inline void reserve_workspace(Context& c, std::size_t bytes) {
  if (bytes > c.workspace_bytes) regrow(c, c.workspace, c.workspace_bytes, bytes, bytes, "reserve_workspace");
}

// Sizes group_by_module's CUB temp storage and scratch for up to n_pairs pairs and n_modules modules.
inline void reserve_dispatch(Context& c, index_t n_pairs, index_t n_modules) {
  MOM_CHECK(n_pairs >= 0 && n_modules >= 1, "reserve_dispatch: n_pairs ", n_pairs, ", n_modules ", n_modules);
  if (n_pairs <= c.dispatch_pairs && n_modules <= c.dispatch_modules) return;  // sized already
  n_pairs = std::max(n_pairs, c.dispatch_pairs);
  n_modules = std::max(n_modules, c.dispatch_modules);
  const std::size_t bytes = group_by_module_temp_bytes(n_pairs, n_modules);
  if (bytes > c.cub_temp_bytes) regrow(c, c.cub_temp, c.cub_temp_bytes, bytes, bytes, "reserve_dispatch");
  if (n_pairs > c.pair_ids_size) {
    const std::size_t bytes_ids = static_cast<std::size_t>(n_pairs) * sizeof(token_t);
    index_t keys_size = c.pair_ids_size;  // sorted_keys has pair_ids' size (pair_ids_size, set by the second regrow)
    regrow(c, c.sorted_keys, keys_size, n_pairs, bytes_ids, "reserve_dispatch");
    regrow(c, c.pair_ids, c.pair_ids_size, n_pairs, bytes_ids, "reserve_dispatch");
  }
  if (n_modules + 1 > c.counts_size)
    regrow(c, c.counts, c.counts_size, n_modules + 1, static_cast<std::size_t>(n_modules + 1) * sizeof(int),
           "reserve_dispatch");
  c.dispatch_pairs = n_pairs;
  c.dispatch_modules = n_modules;
}

}  // namespace mom::cuda

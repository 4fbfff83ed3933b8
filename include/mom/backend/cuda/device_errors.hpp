#pragma once
// The CUDA backend's device-side errors, checked on the host. A kernel cannot throw: on a bad index (token
// id, target, gather/scatter index, top-k index, module id, packed positions, group offsets, cache slot or
// position) it skips the row and records the first error in Context::error ({DeviceError code, position,
// value, bound}; kernels.hpp). The backend's sync() (and so every read / to_host) calls
// check_device_errors, which throws that error as a mom::Error and clears it (docs/cuda.md, "Index errors").
#include <cuda_runtime_api.h>

#include "mom/backend/cuda/check.hpp"
#include "mom/backend/cuda/kernels.hpp"
#include "mom/core/check.hpp"

namespace mom::cuda {

// Throws the first device-side error recorded since the last check (a blocking read of Context::error:
// call it after the stream has been synchronised); returns when there is none.
inline void check_device_errors(const Context& ctx) {
  int e[4] = {0, 0, 0, 0};
  MOM_CUDA_CHECK(cudaMemcpy(e, ctx.error, sizeof(e), cudaMemcpyDeviceToHost), "sync");
  if (e[0] == 0) return;
  MOM_CUDA_CHECK(cudaMemset(ctx.error, 0, sizeof(e)), "sync");
  const char* op = "?";
  const char* what = "index";
  switch (static_cast<DeviceError>(e[0])) {
    case DeviceError::embedding_token: op = "embedding_forward", what = "token id"; break;
    case DeviceError::embedding_backward_token: op = "embedding_backward", what = "token id"; break;
    case DeviceError::cross_entropy_target: op = "cross_entropy", what = "target"; break;
    case DeviceError::gather_index: op = "gather_rows", what = "idx"; break;
    case DeviceError::scatter_index: op = "scatter_add_rows", what = "idx"; break;
    case DeviceError::scatter_backward_index: op = "scatter_add_rows_backward", what = "idx"; break;
    case DeviceError::topk_backward_index: op = "topk_rows_backward", what = "index"; break;
    case DeviceError::group_module: op = "group_by_module", what = "module id"; break;
    case DeviceError::group_choice: op = "group_by_choice", what = "pick"; break;
    case DeviceError::selection_index: op = "selection_mask", what = "idx"; break;
    case DeviceError::rope_position: op = "rope", what = "position"; break;
    case DeviceError::decode_position: op = "stick_breaking_decode", what = "slot or position"; break;
    case DeviceError::kv_write_position: op = "kv_write", what = "slot or position"; break;
    case DeviceError::attention_decode_position: op = "attention_decode", what = "slot or position"; break;
    case DeviceError::embedding_position: op = "embedding_forward", what = "position"; break;
    case DeviceError::group_offsets:
      mom::detail::fail("grouped op: group offsets must be non-decreasing in [0, ", e[3], "]; offsets[", e[1],
                        "] = ", e[2], " (found on the device)");
    case DeviceError::packed_positions:
      mom::detail::fail("attention_packed: query positions must be ascending and in range; q_tok[", e[1], "] = ",
                        e[2], " (found on the device)");
    default: break;
  }
  mom::detail::fail(op, ": ", what, " ", e[2], " at position ", e[1], " is out of range [0, ", e[3],
                    ") (found on the device; the row was skipped)");
}

}  // namespace mom::cuda

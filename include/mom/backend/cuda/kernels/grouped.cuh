#pragma once
// Row groups on the device (core/groups.hpp), shared by the grouped ops' kernel files
// (grouped_linear.cuh, grouped_rows.cuh; declared in grouped_kernels.hpp, the counterparts of
// backend/cpu/grouped.hpp).
//
// Every kernel reads the row groups' offsets from device memory. Grids come from host bounds (the
// packed matrix's rows, the number of groups); work beyond the grouped rows exits at once.
#include "mom/backend/cuda/kernels/common.cuh"
#include "mom/backend/cuda/grouped_kernels.hpp"

namespace mom::cuda {

namespace dev {

// ---- row groups on the device -------------------------------------------------------------------

struct RowRange {
  index_t lo = 0, hi = 0;
};

__device__ __forceinline__ index_t clamp_row(token_t v, index_t rows) {
  return v < 0 ? index_t(0) : (index_t(v) > rows ? rows : index_t(v));
}
// Rows of group i, clamped into [0, rows] with hi >= lo: bad offsets (reported by check_offsets)
// can make groups overlap but never reach outside the matrix.
__device__ __forceinline__ RowRange group_rows(RowGroups g, int i, index_t rows) {
  const index_t lo = clamp_row(g.offsets[i], rows);
  return {lo, max(lo, clamp_row(g.offsets[i + 1], rows))};
}
// All grouped rows: [offsets[0], offsets[count]).
__device__ __forceinline__ RowRange grouped_rows(RowGroups g, index_t rows) {
  const index_t lo = clamp_row(g.offsets[0], rows);
  return {lo, max(lo, clamp_row(g.offsets[g.count], rows))};
}
// The group of a grouped row r: the last i < count with offsets[i] <= r (empty groups are skipped
// because a later group starts at the same offset). Always in [0, count), whatever the offsets.
__device__ __forceinline__ int group_of(RowGroups g, index_t r) {
  int lo = 0, hi = g.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (index_t(g.offsets[mid]) <= r) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}
// The CPU checks the offsets on the host before any work; here block 0 of every grouped launch
// checks them and reports the first bad one (a value outside [0, rows], or a decrease).
__device__ inline void check_offsets(RowGroups g, index_t rows, int* error) {
  if (blockIdx.x != 0 || blockIdx.y != 0 || blockIdx.z != 0) return;
  for (int i = threadIdx.x; i <= g.count; i += blockDim.x) {
    const token_t v = g.offsets[i];
    if (v < 0 || index_t(v) > rows || (i > 0 && v < g.offsets[i - 1]))
      report(error, DeviceError::group_offsets, i, v, rows);
  }
}

// Block slot `slot` of a grid that enumerates every group's tiles of `tile` rows in group order
// (Σ_g ceil(n_g / tile) <= ceil(rows / tile) + count slots): its group and tile index, or false
// when the slot is beyond the last tile (the whole block then exits). One thread per group
// (count <= max_row_groups = blockDim.x) and a block scan; every thread must call it.
__device__ inline bool find_row_tile(RowGroups g, index_t rows, int tile, index_t slot, int* group,
                                     index_t* tile_index) {
  __shared__ int s_group;
  __shared__ int s_tile;
  const int t = threadIdx.x;
  int tiles = 0;
  if (t < g.count) {
    const RowRange r = group_rows(g, t, rows);
    tiles = int((r.hi - r.lo + tile - 1) / tile);
  }
  int total = 0;
  const int before = block_exclusive_scan(tiles, &total);
  if (slot >= total) return false;  // the same for every thread
  if (slot >= before && slot < before + tiles) {
    s_group = t;
    s_tile = int(slot - before);
  }
  __syncthreads();
  *group = s_group;
  *tile_index = s_tile;
  return true;
}

// Blocks for one warp per row over a host bound of `rows` rows.
inline unsigned warp_rows_blocks(index_t rows) { return blocks_exact(rows, warps_per_block); }
// Row-tile slots for a row-tiled grouped grid: Σ_g ceil(n_g / tile) <= ceil(rows / tile) + count.
inline unsigned row_tile_slots(index_t rows, int count, int tile) {
  return static_cast<unsigned>((rows + tile - 1) / tile + count);
}

}  // namespace dev

}  // namespace mom::cuda

#pragma once
// One row's top-k by insertion into a sorted list, written once for both backends: the CPU's ops
// (cpu/topk.hpp's topk_rows, cpu/routing.hpp's softmax router) and the CUDA kernels that mirror them
// (kernels/rows.cuh, kernels/routing.cuh: a thread per row), so both pick the same entries in the same order;
// affinity_row.hpp offers its kept groups' experts to the same insertion.
// Host and device code under nvcc; plain C++ everywhere else (the CUDA emulation included).
#include "mom/backend/host_device.hpp"
#include "mom/core/tensor.hpp"

namespace mom::backend_common {

// Offer candidate (x, j) to a list val / ind of the `filled` (at most k) largest so far, largest first: it goes after
// every kept entry that is >= it (an earlier candidate wins a tie), the last one falling off a full list.
template <class T>
MOM_HOST_DEVICE inline void topk_offer(T x, token_t j, index_t k, index_t& filled, T* val, token_t* ind) {
  if (filled == k && !(x > val[k - 1])) return;
  index_t pos = filled < k ? filled++ : k - 1;
  while (pos > 0 && x > val[pos - 1]) {
    val[pos] = val[pos - 1];
    ind[pos] = ind[pos - 1];
    --pos;
  }
  val[pos] = x;
  ind[pos] = j;
}

// The k largest of row[0..N) into val / ind, largest first: O(N k), an earlier index winning a tie.
template <class T>
MOM_HOST_DEVICE inline void topk_insert(const T* row, index_t N, index_t k, T* val, token_t* ind) {
  index_t filled = 0;
  for (index_t j = 0; j < N; ++j) topk_offer(row[j], static_cast<token_t>(j), k, filled, val, ind);
}

}  // namespace mom::backend_common

#pragma once
// One row's top-k by insertion into a sorted list, written once for both backends: the CPU's ops
// (cpu/topk.hpp's topk_rows, cpu/routing.hpp's softmax router) and the CUDA kernels that mirror them
// (kernels/rows.cuh, kernels/routing.cuh: a thread per row), so both pick the same entries in the same order.
// Host and device code under nvcc; plain C++ everywhere else (the CUDA emulation included).
#include "mom/core/tensor.hpp"

#if defined(__CUDACC__)
#define MOM_HOST_DEVICE __host__ __device__
#else
#define MOM_HOST_DEVICE
#endif

namespace mom::backend_common {

// The k largest of row[0..N) into val / ind, largest first: O(N k). A candidate goes after every kept entry that is
// >= it, so an earlier index wins a tie.
template <class T>
MOM_HOST_DEVICE inline void topk_insert(const T* row, index_t N, index_t k, T* val, token_t* ind) {
  index_t filled = 0;
  for (index_t j = 0; j < N; ++j) {
    const T xj = row[j];
    if (filled == k && !(xj > val[k - 1])) continue;
    index_t pos = filled < k ? filled++ : k - 1;
    while (pos > 0 && xj > val[pos - 1]) {
      val[pos] = val[pos - 1];
      ind[pos] = ind[pos - 1];
      --pos;
    }
    val[pos] = xj;
    ind[pos] = static_cast<token_t>(j);
  }
}

}  // namespace mom::backend_common

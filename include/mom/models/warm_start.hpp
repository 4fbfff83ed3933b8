#pragma once
// warm_start: the second phase of the paper's two-phase training (§3.4). A dense model's
// parameters initialise a MoM model of the same depth: the dense layers of a chunk become its
// module set (a chunk of 4 owns the names h.i .. h.i+3, so layer i's attention becomes attention
// module 0, ...), plain layers map one to one, embeddings and the final LayerNorm are copied,
// and the routers keep the fresh initialisation of MoMModel::make.
//
//   auto dense = Dense8::make<cpu::Backend<float>>(1);     // ... phase 1 training ...
//   auto mom = MoMModel::make<cpu::Backend<float>>(2);
//   warm_start(mom, dense);                                  // phase 2 starts here
//
// Checked at compile time: same Dims, the same depth (a chunking that does not add up to the
// dense model is rejected), and every dense tensor has a same-named, same-shaped MoM tensor.
#include <algorithm>
#include <span>

#include <vector>

#include "mom/models/lm.hpp"
#include "mom/models/runtime.hpp"

namespace mom {

namespace detail {
template <class MoMModel, class DenseModel>
constexpr bool dense_tensors_covered() {
  for (const auto& p : DenseModel::layout) {
    bool found = false;
    for (const auto& q : MoMModel::layout)
      if (q.name == p.name && q.rows == p.rows && q.cols == p.cols) found = true;
    if (!found) return false;
  }
  return true;
}
}  // namespace detail

template <class MoMInstance, class DenseInstance>
void warm_start(MoMInstance& mom, const DenseInstance& dense) {
  using MoMModel = typename MoMInstance::model_type;
  using DenseModel = typename DenseInstance::model_type;
  static_assert(MoMModel::dims == DenseModel::dims, "mom::warm_start: the MoM and the dense model must have the same Dims");
  static_assert(MoMModel::depth == DenseModel::depth,
                "mom::warm_start: the chunking does not add up to the dense model: the MoM model's depth (layers of "
                "all its parts) must equal the dense model's number of layers");
  static_assert(detail::dense_tensors_covered<MoMModel, DenseModel>(),
                "mom::warm_start: a dense tensor has no same-named, same-shaped tensor in the MoM model");
  // Host round trip: the two models may live on different backends.
  std::vector<typename DenseInstance::scalar> host(std::size_t(DenseModel::params));
  const_cast<DenseInstance&>(dense).backend().to_host(std::span(host), dense.params());
  std::vector<typename MoMInstance::scalar> out(std::size_t(MoMModel::params));
  mom.backend().to_host(std::span(out), std::span<const typename MoMInstance::scalar>(mom.params()));
  for (const auto& p : DenseModel::layout) {
    const ParamInfo& q = MoMModel::find(p.name);
    std::copy_n(host.begin() + p.offset, p.size(), out.begin() + q.offset);
  }
  mom.backend().from_host(mom.params(), std::span<const typename MoMInstance::scalar>(out));
}

}  // namespace mom

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

// A model's parameters on the host and back (the instance may live on any backend).
template <class Instance>
std::vector<typename Instance::scalar> host_params(const Instance& m) {
  std::vector<typename Instance::scalar> h(std::size_t(Instance::model_type::params));
  const_cast<Instance&>(m).backend().to_host(std::span(h), m.params());
  return h;
}
template <class Instance>
void set_params(Instance& m, const std::vector<typename Instance::scalar>& h) {
  m.backend().from_host(m.params(), std::span<const typename Instance::scalar>(h));
}

// Every tensor of `from` (model Src) into the same-named tensor of `to` (model Dst), as its leading block:
// row r of the source into row r of the destination (the same shape, or one that grew in rows or columns).
// A host round trip: the two models may live on different backends.
template <class DstInstance, class SrcInstance>
void copy_named_tensors(DstInstance& to, const SrcInstance& from) {
  using Dst = typename DstInstance::model_type;
  using Src = typename SrcInstance::model_type;
  const auto src = host_params(from);
  auto dst = host_params(to);
  for (const auto& p : Src::layout) {
    const ParamInfo& q = Dst::find(p.name);
    for (index_t r = 0; r < p.rows; ++r)
      std::copy_n(src.begin() + p.offset + r * p.cols, p.cols, dst.begin() + q.offset + r * q.cols);
  }
  set_params(to, dst);
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
  detail::copy_named_tensors(mom, dense);
}

}  // namespace mom

#pragma once
// The FLOPs a model instance actually ran, for routed models whose cost depends on the routing (a MoM module
// pick of Skip, a layer-skip gate, a router's variable number of experts): read back from the last forward's
// routing, on the host. Used by the Trainer's per-step FLOP count (train/trainer.hpp: "flops" in metrics.jsonl),
// bench/train_step.cpp and the tests that compare the cost model with a FLOP-counting backend.
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "mom/assembly/assembly.hpp"
#include "mom/core/meta.hpp"
#include "mom/core/tensor.hpp"

namespace mom {

namespace detail {
// The parts' FLOPs (forward, or backward) for the last forward's realised routing: routed_flops of every executor
// that ReportsRouting (MoM, MoE), realised_flops of the depth-routed ones (MoD, layer-skip, MoR), every other part
// at the cost model's figure.
template <bool backward, class Instance>
index_t realised_part_flops(Instance& m) {
  using Model = typename Instance::model_type;
  const index_t batch = m.batch(), seq = m.seq(), n = batch * seq;
  index_t total = 0;
  std::vector<token_t> picks;
  [&]<class... Es, std::size_t... is>(TypeList<Es...>, std::index_sequence<is...>) {
    (
        [&] {
          using E = Es;
          if constexpr (ReportsRouting<E>) {
            const auto& plan = std::get<is>(m.plan().parts);
            total += E::template routed_flops<backward>(batch, seq, [&](int h, int router) {
              picks.resize(std::size_t(n * E::routing_info(router).k));
              E::read_picks(m.backend(), m.workspace_data(), plan, h, router, n, std::span<token_t>(picks));
              return std::span<const token_t>(picks);
            });
          } else if constexpr (requires {
                                 E::template realised_flops<backward>(m.backend(), m.workspace_data(),
                                                                      std::get<is>(m.plan().parts), batch, seq);
                               }) {
            total += E::template realised_flops<backward>(m.backend(), m.workspace_data(), std::get<is>(m.plan().parts),
                                                          batch, seq);  // depth routing
          } else {
            total += n * (backward ? E::backward_flops_per_token(seq) : E::flops_per_token(seq));
          }
        }(),
        ...);
  }(typename Model::core::executors{}, std::make_index_sequence<Model::core::executors::size>{});
  return total;
}
}  // namespace detail

// Forward FLOPs the last forward of `m` executed (the LM head and every part, routed ones for their routing).
template <class Instance>
index_t realised_forward_flops(Instance& m) {
  constexpr Dims D = Instance::model_type::dims;
  return m.batch() * m.seq() * 2 * D.d_model * D.vocab + detail::realised_part_flops<false>(m);
}

// Backward FLOPs of the same forward's routing, counted as the cost model counts backward (two products per
// linear, five causal products for attention; the tied head's dX and dW).
template <class Instance>
index_t realised_backward_flops(Instance& m) {
  constexpr Dims D = Instance::model_type::dims;
  return m.batch() * m.seq() * 4 * D.d_model * D.vocab + detail::realised_part_flops<true>(m);
}

// Training FLOPs (forward + backward) of the last forward's micro-batch as run.
template <class Instance>
double realised_training_flops(Instance& m) {
  return double(realised_forward_flops(m)) + double(realised_backward_flops(m));
}

}  // namespace mom

#pragma once
// Module manipulation (ModuleFormer, arXiv 2306.04640 §4.3 and §5.3) between model types of
// models/moduleformer_models.hpp — the weights move, the types say what the model is:
//
//   insert_modules(bigger, trained)    §4.3: every tensor of `trained` into the same-named tensor of `bigger`
//       (ModuleFormerSpec<...>::inserted<N_att_new, N_ffd_new>): same shape, or a leading block when it grew
//       (the pruning mask [1 × N] → [1 × N + N_new]); the inserted heads, experts and A' rows keep their
//       fresh initialisation. Train only them with a freeze list (train/trainer.hpp, --freeze).
//   ModuleUsage usage = module_usage(stats)     §5.3: per layer and family (attention, FFN), how often each
//       module was picked over an evaluation (RoutingStats accumulated after forwards), normalised by the
//       layer's maximum ("Max" normalisation, the paper's choice)
//   PruneMask mask = prune_mask(usage, τ)       keep the modules whose normalised usage is >= τ (at least the
//       router's k most used, so that top-k still has k live modules)
//   apply_prune_mask(model, mask)               the runtime mask: same type, pruned modules' router logits
//       get −10⁴ (modules/mlp_gate.hpp), so they are never picked and never computed for a token
//   compact(small, big, mask)                   the kept modules into `small` (...::compacted<M_att, M_ffd>),
//       in their order; a layer that keeps fewer than M fills the rest with masked empty modules (so
//       `small` computes exactly what the masked `big` does); more than M is an error naming the layer
//
// These work on single-part models whose modules route inside themselves (ModuleWithRouting with
// module_slices and o_prune: MoA, SMoE): round h of the part is layer h.
#include <algorithm>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "mom/core/check.hpp"
#include "mom/models/lm.hpp"
#include "mom/models/routing_stats.hpp"
#include "mom/models/runtime.hpp"
#include "mom/models/warm_start.hpp"  // copy_named_tensors, host_params, set_params
#include "mom/modules/mlp_gate.hpp"  // pruned_logit

namespace mom {

namespace detail {
// dst's tensor for src tensor p: the same name and shape, or a leading block of it (rows or columns grew).
constexpr bool holds(const ParamInfo& q, const ParamInfo& p) {
  return q.name == p.name && ((q.cols == p.cols && q.rows >= p.rows) || (q.rows == p.rows && q.cols >= p.cols));
}
template <class Dst, class Src>
constexpr bool tensors_held() {
  for (const auto& p : Src::layout) {
    bool found = false;
    for (const auto& q : Dst::layout) found = found || holds(q, p);
    if (!found) return false;
  }
  return true;
}

// The single routing part of a model and its module types (the sub-module surgery needs them).
template <class Model>
struct SurgeryPart {
  template <class List>
  struct first;
  template <class E0, class... Es>
  struct first<TypeList<E0, Es...>> {
    using type = E0;
  };
  using executors = typename Model::core::executors;
  static_assert(executors::size == 1, "mom module surgery: the model must be one part (ModuleFormer<L, Attn, Ffn>)");
  using E = typename first<executors>::type;
  using Attn = typename E::Attn;
  using Ffn = typename E::Ffn;
  static constexpr int L = E::L;
  static constexpr index_t base = Model::core::part_offset[0];
};
}  // namespace detail

template <class DstInstance, class SrcInstance>
void insert_modules(DstInstance& dst, const SrcInstance& src) {
  using Dst = typename DstInstance::model_type;
  using Src = typename SrcInstance::model_type;
  static_assert(Dst::dims == Src::dims, "mom::insert_modules: the two models must have the same Dims");
  static_assert(detail::tensors_held<Dst, Src>(),
                "mom::insert_modules: a tensor of the trained model has no same-named tensor of at least its shape "
                "in the new one (insert modules with ModuleFormerSpec<...>::inserted<N_att, N_ffd>)");
  detail::copy_named_tensors(dst, src);
}

// usage[family][layer][module] normalised by the layer's maximum; family 0 attention, 1 FFN (those that route).
struct ModuleUsage {
  std::vector<std::string> family;  // "attn", "ffn"
  std::vector<std::vector<std::vector<double>>> normalised;
  std::vector<std::vector<std::vector<long long>>> counts;
  std::vector<int> k;  // picks per token of each family's router
};
inline ModuleUsage module_usage(const RoutingStats& stats) {
  ModuleUsage u;
  for (const auto& r : stats.routers) {
    MOM_CHECK(!r.skip, "mom::module_usage: router ", r.name, " has a SKIP class: prune modules of ModuleFormer models");
    const std::size_t dot = r.name.find('.');
    u.family.push_back(dot == std::string::npos ? r.name : r.name.substr(dot + 1));
    u.k.push_back(r.k);
    auto& c = u.counts.emplace_back();
    auto& nu = u.normalised.emplace_back();
    for (int h = 0; h < r.rounds; ++h) {
      const auto first = r.usage.begin() + std::ptrdiff_t(h) * r.classes;
      c.emplace_back(first, first + r.classes);
      const long long mx = std::max<long long>(1, *std::max_element(first, first + r.classes));
      auto& row = nu.emplace_back();
      for (int e = 0; e < r.classes; ++e) row.push_back(double(first[e]) / double(mx));
    }
  }
  MOM_CHECK(!u.family.empty(), "mom::module_usage: no routing statistics: accumulate RoutingStats over evaluation forwards first");
  return u;
}

// keep[family][layer][module].
struct PruneMask {
  std::vector<std::string> family;
  std::vector<std::vector<std::vector<bool>>> keep;
  // Kept modules of one family over all layers, and in total.
  long long kept(std::size_t f) const {
    long long n = 0;
    for (const auto& layer : keep[f]) n += std::count(layer.begin(), layer.end(), true);
    return n;
  }
};
inline PruneMask prune_mask(const ModuleUsage& u, double tau) {
  MOM_CHECK(tau >= 0 && tau <= 1, "mom::prune_mask: the threshold tau = ", tau, " must be in [0, 1]");
  PruneMask m;
  m.family = u.family;
  for (std::size_t f = 0; f < u.family.size(); ++f) {
    auto& fam = m.keep.emplace_back();
    for (const auto& layer : u.normalised[f]) {
      std::vector<bool> keep(layer.size());
      for (std::size_t e = 0; e < layer.size(); ++e) keep[e] = layer[e] >= tau;
      // At least k live modules: top-k must find k to pick (the k most used, ties to the lower id).
      std::vector<std::size_t> order(layer.size());
      for (std::size_t e = 0; e < order.size(); ++e) order[e] = e;
      std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return layer[a] > layer[b]; });
      for (int j = 0; j < u.k[f] && j < int(order.size()); ++j) keep[order[std::size_t(j)]] = true;
      fam.push_back(std::move(keep));
    }
  }
  return m;
}

namespace detail {
// The family index of the mask for the attention (0) or FFN (1) modules; -1 when that family has no mask.
inline int mask_family(const PruneMask& m, const char* name) {
  for (std::size_t f = 0; f < m.family.size(); ++f)
    if (m.family[f] == name) return int(f);
  return -1;
}
template <class Module, class T>
void write_mask(std::vector<T>& h, index_t module_base, const std::vector<bool>& keep) {
  MOM_CHECK(keep.size() == std::size_t(Module::C), "mom::apply_prune_mask: a mask of ", keep.size(), " modules for a layer of ",
            Module::C);
  for (int e = 0; e < Module::C; ++e) h[std::size_t(module_base + Module::o_prune + e)] = keep[std::size_t(e)] ? T(0) : T(pruned_logit);
}
}  // namespace detail

template <class Instance>
void apply_prune_mask(Instance& m, const PruneMask& mask) {
  using P = detail::SurgeryPart<typename Instance::model_type>;
  using E = typename P::E;
  auto h = detail::host_params(m);
  for (int layer = 0; layer < P::L; ++layer) {
    if (const int f = detail::mask_family(mask, "attn"); f >= 0)
      detail::write_mask<typename P::Attn>(h, P::base + E::attention_offset(layer), mask.keep[std::size_t(f)][std::size_t(layer)]);
    if (const int f = detail::mask_family(mask, "ffn"); f >= 0)
      detail::write_mask<typename P::Ffn>(h, P::base + E::ffn_offset(layer), mask.keep[std::size_t(f)][std::size_t(layer)]);
  }
  detail::set_params(m, h);
}

namespace detail {
// Module `to` of layer `layer` of the small model gets the kept modules of `from` (big model) in order;
// slots past them are empty (zero weights) and masked.
template <class Small, class Big, class T>
void compact_layer(std::vector<T>& to, index_t to_base, const std::vector<T>& from, index_t from_base,
                   const std::vector<bool>& keep, int layer, const char* family) {
  std::vector<int> kept;
  for (int e = 0; e < Big::C; ++e)
    if (keep.at(std::size_t(e))) kept.push_back(e);
  MOM_CHECK(int(kept.size()) <= Small::C, "mom::compact: layer ", layer, " keeps ", kept.size(), " ", family,
            " modules; the compact type holds ", Small::C, ": raise its count or the threshold");
  // Everything that is not per-module (LayerNorm, the router's B, MoA's shared K/V) is copied whole: the
  // blocks before the first slice and between slices are the same tensors in both types.
  static_assert(Small::module_slices.size() == Big::module_slices.size());
  for (int slot = 0; slot < Small::C; ++slot) {
    for (std::size_t s = 0; s < Small::module_slices.size(); ++s) {
      const auto ds = Small::module_slices[s], ss = Big::module_slices[s];
      T* out = to.data() + to_base + ds.offset + slot * ds.size;
      if (slot < int(kept.size())) std::copy_n(from.data() + from_base + ss.offset + kept[std::size_t(slot)] * ss.size, ds.size, out);
      else std::fill_n(out, ds.size, T(0));
    }
    to[std::size_t(to_base + Small::o_prune + slot)] = slot < int(kept.size()) ? T(0) : T(pruned_logit);
  }
}
}  // namespace detail

template <class SmallInstance, class BigInstance>
void compact(SmallInstance& small, const BigInstance& big, const PruneMask& mask) {
  using S = detail::SurgeryPart<typename SmallInstance::model_type>;
  using B = detail::SurgeryPart<typename BigInstance::model_type>;
  using SmallModel = typename SmallInstance::model_type;
  using BigModel = typename BigInstance::model_type;
  static_assert(SmallModel::dims == BigModel::dims && S::L == B::L, "mom::compact: the two models must have the same Dims and depth");
  const auto from = detail::host_params(big);
  auto to = detail::host_params(small);
  // The tensors of the same name and shape (embeddings, LayerNorms, routers' B, K/V) first ...
  for (const auto& q : SmallModel::layout)
    for (const auto& p : BigModel::layout)
      if (p.name == q.name && p.rows == q.rows && p.cols == q.cols) std::copy_n(from.begin() + p.offset, p.size(), to.begin() + q.offset);
  // ... then the kept modules, slice by slice.
  const int fa = detail::mask_family(mask, "attn"), ff = detail::mask_family(mask, "ffn");
  for (int layer = 0; layer < S::L; ++layer) {
    if (fa >= 0)
      detail::compact_layer<typename S::Attn, typename B::Attn>(to, S::base + S::E::attention_offset(layer), from,
                                                                B::base + B::E::attention_offset(layer),
                                                                mask.keep[std::size_t(fa)][std::size_t(layer)], layer, "attention");
    if (ff >= 0)
      detail::compact_layer<typename S::Ffn, typename B::Ffn>(to, S::base + S::E::ffn_offset(layer), from,
                                                              B::base + B::E::ffn_offset(layer),
                                                              mask.keep[std::size_t(ff)][std::size_t(layer)], layer, "FFN");
  }
  detail::set_params(small, to);
}

}  // namespace mom

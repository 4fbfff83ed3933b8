#pragma once
// Statistics of the depth-routed parts (Mixture-of-Depths, layer-skip, early-exit) over evaluation
// forwards: per routed layer the fraction of tokens that ran it, and for Mixture-of-Depths the
// accuracy with which the causal decision (the predictor's sign with CausalPredictor, else the
// router's sign r_i > 0) predicts top-C membership (MoD paper §3.5, Fig. 6), with its mean BCE.
//
//   DepthStats stats;
//   for (...) { m.forward(tokens, targets, B, S); stats.accumulate(m); }
//   std::string line = stats.json(step);   // one JSON object; mom-train appends it to <out>/depth.jsonl
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "mom/models/lm.hpp"
#include "mom/models/runtime.hpp"

namespace mom {

// The model autoregressive sampling runs for Model: with a causal-sampling method (MoD §3.5) the same
// parameters routed by the causal decision (CausalRouting) instead of the non-causal top-C; else Model.
template <class Model>
using causal_sampling_model_t = LM<Model::dims, typename causal_sampling_arch<typename Model::arch>::type>;

template <class E>
concept DepthRoutedExecutor = requires { requires E::is_depth_routed; };

template <class Model>
inline constexpr bool has_depth_routing = []<class... Es>(TypeList<Es...>) {
  return (DepthRoutedExecutor<Es> || ...);
}(typename Model::core::executors{});

struct DepthStats {
  struct Layer {
    std::string name;  // "part<i>.h<layer>"
    double run = 0, tokens = 0;                // tokens that ran the layer / all tokens
    double correct = 0, bce = 0, forwards = 0; // causal decision (MoD only; forwards = 0 otherwise)
  };
  std::vector<Layer> layers;
  // The depth parts' auxiliary losses (causal BCE, run target, skip cost) summed over the accumulated
  // forwards: the model loss minus aux_loss() is the LM's cross-entropy alone.
  double aux_sum = 0, forwards = 0;
  double aux_loss() const { return forwards > 0 ? aux_sum / forwards : 0.0; }

  template <class Instance>
  void accumulate(Instance& m) {
    using Model = typename Instance::model_type;
    const index_t batch = m.batch(), seq = m.seq();
    std::size_t at = 0;
    forwards += 1;
    [&]<class... Es, std::size_t... is>(TypeList<Es...>, std::index_sequence<is...>) {
      ([&] {
        using E = Es;
        if constexpr (DepthRoutedExecutor<E>) {
          const auto& plan = std::get<is>(m.plan().parts);
          aux_sum += double(m.backend().read(m.workspace_data() + plan.aux));
          const auto causal = E::read_causal(m.backend(), m.workspace_data(), plan, batch, seq);
          std::size_t c = 0;
          for (int h = 0; h < E::L; ++h) {
            if (!E::routed(h)) continue;
            if (layers.size() <= at) layers.push_back({"part" + std::to_string(is) + ".h" + std::to_string(h)});
            Layer& l = layers[at++];
            l.run += double(E::read_selected(m.backend(), m.workspace_data(), plan, h, batch, seq).size());
            l.tokens += double(batch * seq);
            if (c < causal.size() && causal[c].layer == h) {
              l.correct += causal[c].correct;
              l.bce += causal[c].bce;
              l.forwards += 1;
              ++c;
            }
          }
        }
      }(), ...);
    }(typename Model::core::executors{}, std::make_index_sequence<Model::core::executors::size>{});
  }

  // {"step":s, "run_fraction":f, "aux_loss":x, "causal_accuracy":a, "layers":[{"name", "run_fraction", "causal_accuracy",
  //  "causal_bce"}...]} (the causal fields only for Mixture-of-Depths layers).
  std::string json(index_t step) const {
    auto num = [](double v) {
      char b[32];
      std::snprintf(b, sizeof b, "%.6g", v);
      return std::string(b);
    };
    double run = 0, tokens = 0, correct = 0, causal_tokens = 0;
    std::string per;
    for (const Layer& l : layers) {
      run += l.run;
      tokens += l.tokens;
      per += std::string(per.empty() ? "" : ", ") + "{\"name\": \"" + l.name + "\", \"run_fraction\": " +
             num(l.run / l.tokens);
      if (l.forwards > 0) {
        correct += l.correct;
        causal_tokens += l.tokens;
        per += ", \"causal_accuracy\": " + num(l.correct / l.tokens) + ", \"causal_bce\": " + num(l.bce / l.forwards);
      }
      per += "}";
    }
    std::string s = "{\"type\": \"depth\", \"step\": " + std::to_string(step) +
                    ", \"run_fraction\": " + num(tokens > 0 ? run / tokens : 0.0) + ", \"aux_loss\": " + num(aux_loss());
    if (causal_tokens > 0) s += ", \"causal_accuracy\": " + num(correct / causal_tokens);
    return s + ", \"layers\": [" + per + "]}";
  }
  // The overall accuracy of the causal decision (MoD layers), or -1 without any.
  double causal_accuracy() const {
    double correct = 0, tokens = 0;
    for (const Layer& l : layers)
      if (l.forwards > 0) correct += l.correct, tokens += l.tokens;
    return tokens > 0 ? correct / tokens : -1.0;
  }
  void clear() {
    layers.clear();
    aux_sum = forwards = 0;
  }
};

}  // namespace mom

#pragma once
// Routing statistics of the routed parts (paper Appendix D.2, Fig. 6), for every executor that
// ReportsRouting (assembly/assembly.hpp): per router family (a MoM chunk has one for attention and
// one for FFN; a MoE part one for its FFN experts, a step per layer), how often each of the
// N + 1 classes (SKIP last)
// was picked in each round, and the (N+1)×(N+1) transition counts between consecutive rounds:
// for every token and every pair (a picked in round h, b picked in round h+1), count[a][b] += 1
// (K² pairs per token and step when K > 1). Accumulate after forwards (evaluation), then write
// JSON or CSV next to the metrics.
//
//   RoutingStats stats;
//   for (...) { m.forward(tokens, {}, B, S); stats.accumulate(m); }
//   stats.write_json("routing.json"); stats.write_csv("routing");   // routing.<router>.csv
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include "mom/core/check.hpp"
#include "mom/models/lm.hpp"
#include "mom/models/runtime.hpp"

namespace mom {

struct RoutingStats {
  struct Router {
    std::string name;  // "part<i>.attn" / "part<i>.ffn" (i: index of the part in the Chunked)
    int classes = 0, rounds = 0, k = 0;
    bool skip = false;  // the last class is SKIP
    std::vector<long long> usage;        // [rounds × classes]
    std::vector<long long> transitions;  // [classes × classes], row: from (round h), column: to (h+1)
    std::vector<long long> idle;         // [rounds]: tokens no module ran in that round (every pick SKIP or a
                                         // no-op slot: expert choice's dropped tokens)
    long long tokens = 0;
  };
  std::vector<Router> routers;

  template <class Instance>
  void accumulate(Instance& m) {
    using Model = typename Instance::model_type;
    const index_t n = m.batch() * m.seq();
    std::vector<token_t> prev, cur;
    std::size_t at = 0;
    [&]<class... Es, std::size_t... is>(TypeList<Es...>, std::index_sequence<is...>) {
      ([&] {
        using E = Es;
        if constexpr (ReportsRouting<E>) {
          for (int which = 0; which < E::routing_routers; ++which) {
            const RoutingInfo info = E::routing_info(which);
            const int classes = info.classes;
            if (routers.size() <= at) {
              Router r;
              r.name = "part" + std::to_string(is) + "." + info.name;
              r.classes = classes;
              r.rounds = info.steps;
              r.k = info.k;
              r.skip = info.skip;
              r.usage.assign(std::size_t(info.steps * classes), 0);
              r.transitions.assign(std::size_t(classes * classes), 0);
              r.idle.assign(std::size_t(info.steps), 0);
              routers.push_back(std::move(r));
            }
            Router& r = routers[at++];
            r.tokens += n;
            prev.resize(std::size_t(n * info.k));
            cur.resize(std::size_t(n * info.k));
            for (int h = 0; h < info.steps; ++h) {
              E::read_picks(m.backend(), m.workspace_data(), std::get<is>(m.plan().parts), h, which, n, std::span(cur));
              for (token_t c : cur) ++r.usage[std::size_t(h * classes + c)];
              const int modules = info.skip ? classes - 1 : classes;
              for (index_t t = 0; t < n; ++t)
                r.idle[std::size_t(h)] += std::all_of(cur.begin() + t * info.k, cur.begin() + (t + 1) * info.k,
                                                      [&](token_t c) { return c >= modules; });
              if (h > 0)
                for (index_t t = 0; t < n; ++t)
                  for (int a = 0; a < info.k; ++a)
                    for (int b = 0; b < info.k; ++b)
                      ++r.transitions[std::size_t(prev[std::size_t(t * info.k + a)] * classes +
                                                  cur[std::size_t(t * info.k + b)])];
              std::swap(prev, cur);
            }
          }
        }
      }(), ...);
    }(typename Model::core::executors{}, std::make_index_sequence<Model::core::executors::size>{});
  }

  // Modules are named 1..N as in the paper's Fig. 6, SKIP "S".
  static std::string class_name(const Router& r, int c) { return r.skip && c == r.classes - 1 ? "S" : std::to_string(c + 1); }

  std::string json() const {
    auto list = [](const std::vector<long long>& v, std::size_t from, std::size_t count) {
      std::string s = "[";
      for (std::size_t i = 0; i < count; ++i) {
        if (i) s += ',';
        s += std::to_string(v[from + i]);
      }
      return s + "]";
    };
    std::string s = "{\"routers\": [";
    for (std::size_t i = 0; i < routers.size(); ++i) {
      const Router& r = routers[i];
      const auto E = std::size_t(r.classes);
      s += std::string(i ? "," : "") + "\n  {\"name\": \"" + r.name + "\", \"classes\": " + std::to_string(r.classes) +
           ", \"skip_is_last\": " + std::string(r.skip ? "true" : "false") + ", \"rounds\": " + std::to_string(r.rounds) + ", \"k\": " + std::to_string(r.k) +
           ", \"tokens\": " + std::to_string(r.tokens) + ",\n   \"usage\": [";
      for (int h = 0; h < r.rounds; ++h) {
        if (h) s += ',';
        s += list(r.usage, std::size_t(h) * E, E);
      }
      s += "],\n   \"transitions\": [";
      for (std::size_t a = 0; a < E; ++a) {
        if (a) s += ',';
        s += list(r.transitions, a * E, E);
      }
      s += "]}";
    }
    return s + "\n]}\n";
  }

  // One CSV per router: the transition matrix with a header row / column of class names
  // (1..N, S), then a blank line and the usage per round.
  std::string csv(std::size_t i) const {
    const Router& r = routers.at(i);
    std::string s = "from\\to";
    for (int b = 0; b < r.classes; ++b) { s += ','; s += class_name(r, b); }
    s += "\n";
    for (int a = 0; a < r.classes; ++a) {
      s += class_name(r, a);
      for (int b = 0; b < r.classes; ++b) { s += ','; s += std::to_string(r.transitions[std::size_t(a * r.classes + b)]); }
      s += "\n";
    }
    s += "\nround";
    for (int b = 0; b < r.classes; ++b) { s += ','; s += class_name(r, b); }
    s += "\n";
    for (int h = 0; h < r.rounds; ++h) {
      s += std::to_string(h);
      for (int b = 0; b < r.classes; ++b) { s += ','; s += std::to_string(r.usage[std::size_t(h * r.classes + b)]); }
      s += "\n";
    }
    return s;
  }

  void write_json(const std::string& path) const {
    std::ofstream f(path);
    MOM_CHECK(bool(f), "RoutingStats::write_json: cannot open ", path);
    f << json();
  }
  // Writes <prefix>.<router name>.csv for every router.
  void write_csv(const std::string& prefix) const {
    for (std::size_t i = 0; i < routers.size(); ++i) {
      const std::string path = prefix + "." + routers[i].name + ".csv";
      std::ofstream f(path);
      MOM_CHECK(bool(f), "RoutingStats::write_csv: cannot open ", path);
      f << csv(i);
    }
  }
  void clear() { routers.clear(); }

  // Expert (module) usage of one round of one router, so that routing collapse is visible during training
  // (issue 18: ST-MoE / Switch practice): each module class's share of the round's picks (SKIP left out of
  // the shares and reported on its own), their coefficient of variation std/mean (0: perfectly balanced;
  // √(N−1): one module takes everything) and the largest share. No router here has a capacity, so no token
  // is ever dropped.
  struct Load {
    std::vector<double> share;
    double cv = 0, max_share = 0, skip_share = 0;
    double idle_share = 0;  // tokens that ran no module this round (expert choice: dropped), of all tokens
  };
  static Load load(const Router& r, int round) {
    Load l;
    const int modules = r.skip ? r.classes - 1 : r.classes;
    const long long* u = r.usage.data() + std::size_t(round) * std::size_t(r.classes);
    long long picked = 0, all = 0;
    for (int c = 0; c < r.classes; ++c) {
      all += u[c];
      if (c < modules) picked += u[c];
    }
    if (r.skip && all > 0) l.skip_share = double(u[modules]) / double(all);
    if (r.tokens > 0 && std::size_t(round) < r.idle.size()) l.idle_share = double(r.idle[std::size_t(round)]) / double(r.tokens);
    double mean = 0, var = 0;
    for (int c = 0; c < modules; ++c) {
      l.share.push_back(picked > 0 ? double(u[c]) / double(picked) : 0.0);
      mean += l.share.back() / modules;
      l.max_share = std::max(l.max_share, l.share.back());
    }
    for (double s : l.share) var += (s - mean) * (s - mean) / modules;
    l.cv = mean > 0 ? std::sqrt(var) / mean : 0.0;
    return l;
  }
};

}  // namespace mom

#pragma once
// describe<Model>(): a one-line summary of a model type from its cost model, e.g.
//   LM<d_model=768 heads=12 d_ff=3072 vocab=50257 context=1024> Dense<12>: depth 12, 12 steps,
//   124,439,808 params, 0.285 GFLOP/token forward at seq 1024
#include <cstdio>
#include <string>

#include "mom/models/lm.hpp"

namespace mom {

namespace detail {
inline std::string with_commas(index_t v) {
  const std::string digits = std::to_string(v < 0 ? -v : v);
  std::string out = v < 0 ? "-" : "";
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

template <class Set>
std::string module_set_name() {
  std::string s = "ModuleSet<";
  const char* sep = "";
  if constexpr (Set::has_block) {
    s += "Block<" + std::to_string(Set::n_attention) + ">";
    return s + (Set::has_skip ? ", Skip>" : ">");
  }
  if (Set::n_attention > 0) s += sep + ("MHA<" + std::to_string(Set::n_attention) + ">"), sep = ", ";
  if (Set::n_ffn > 0) s += sep + ("FFN<" + std::to_string(Set::n_ffn) + ">"), sep = ", ";
  if (Set::has_skip) s += sep + std::string("Skip");
  return s + ">";
}

template <class A>
std::string assembly_name() {
  using Set = typename A::module_set;
  if constexpr (std::is_same_v<typename A::router::policy, Sequential>) {
    if (A::h == 1) return "Layer";
    return "Dense<" + std::to_string(A::h) + ">";
  } else {
    std::string policy(A::router::policy::name);
    if constexpr (requires { A::router::policy::options_name(); })
      policy += "<" + A::router::policy::options_name() + ">";  // e.g. ExpertChoice<Capacity<1,8>, Every<2>>
    return "Assembly<Router<" + policy + ">, " + module_set_name<Set>() + ", K<" + std::to_string(A::k) + ">, H<" +
           std::to_string(A::h) + ">>";
  }
}

template <class... Ps>
std::string arch_name(TypeList<Ps...>) {
  if constexpr (sizeof...(Ps) == 1) {
    return (assembly_name<Ps>() + ...);
  } else {
    // The paper's notation for a chunking strategy: layers per part, e.g. [1-1-4-1-1].
    std::string s = "Chunked[";
    ((s += std::to_string(Ps::depth) + "-"), ...);
    s.back() = ']';
    std::string parts;
    ((parts += (parts.empty() ? "" : ", ") + assembly_name<Ps>()), ...);
    return s + "(" + parts + ")";
  }
}
}  // namespace detail

template <class Model>
  requires is_lm<Model>
std::string describe(index_t seq = Model::dims.context) {
  constexpr Dims D = Model::dims;
  char flops[64];
  std::snprintf(flops, sizeof flops, "%.4g MFLOP/token", double(Model::flops_per_token(seq)) * 1e-6);
  return "LM<d_model=" + std::to_string(D.d_model) + " heads=" + std::to_string(D.heads) +
         " d_ff=" + std::to_string(D.ff()) + " vocab=" + std::to_string(D.vocab) +
         " context=" + std::to_string(D.context) + "> " + detail::arch_name(typename Model::parts{}) +
         ": depth " + std::to_string(Model::depth) + ", " + std::to_string(Model::steps) + " steps, " +
         detail::with_commas(Model::params) + " params, " + flops + " forward at seq " + std::to_string(seq);
}

}  // namespace mom

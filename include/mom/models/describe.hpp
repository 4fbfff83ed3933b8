#pragma once
// describe<Model>(): a one-line summary of a model type from its cost model, e.g.
//   LM<d_model=768 heads=12 d_ff=3072 vocab=50257 context=1024> Dense<12>: depth 12, 12 steps,
//   124,439,808 params, 266 MFLOP/token forward at seq 1024
// (a RoPE model adds " positions=rope(base 10000)" inside the LM<...>).
#include <cstdio>
#include <string>
#include <type_traits>

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

// ", Name" for a module type that names itself (a user's module: FFN<4, SwiGLU>), "" for GPT-2's.
template <class M>
std::string impl_name() {
  if constexpr (requires { M::name; }) return std::string(", ") + std::string(M::name);
  else return {};
}
template <class M>
inline constexpr bool names_itself = requires { M::name; };

template <class Set, Dims D>
std::string module_set_name() {
  std::string s = "ModuleSet<";
  const std::string attn = impl_name<typename Set::template attention<D>>();
  const std::string ffn = impl_name<typename Set::template ffn<D>>();
  const char* sep = "";
  if constexpr (Set::has_block) {
    s += "Block<" + std::to_string(Set::n_attention) + ">";
    return s + (Set::has_skip ? ", Skip>" : ">");
  }
  if (Set::n_attention > 0) s += sep + ("MHA<" + std::to_string(Set::n_attention) + attn + ">"), sep = ", ";
  if (Set::experts_per_step)
    s += sep + ("Experts<FFN" + (ffn.empty() ? "" : "<1" + ffn + ">") + ", " + std::to_string(Set::ffn_choices) +
                ", PerStep>"),
        sep = ", ";
  else if (Set::n_ffn > 0) s += sep + ("FFN<" + std::to_string(Set::n_ffn) + ffn + ">"), sep = ", ";
  if (Set::has_skip) s += sep + std::string("Skip");
  return s + ">";
}

inline std::string ratio_name(const char* name, long long num, long long den) {
  return std::string(name) + "<" + std::to_string(num) + (den == 1 ? "" : ", " + std::to_string(den)) + ">";
}

// The options of Router<GRU, Options...> that differ from the defaults (routers/gru.hpp), in the
// type's spelling: ", Width<64>, Temperature<1, 2>"; empty for the defaults and other policies. The default
// width depends on the model's d_model (min(256, d_model)), so Width<w> is spelled when w differs from it.
template <class R>
std::string router_options_name(index_t d_model) {
  if constexpr (std::is_same_v<typename R::policy, GRU>) {
    using Cfg = GRUConfig<typename R::options>;
    using Default = GRUConfig<TypeList<>>;
    using Tau = typename Cfg::temperature_t;
    using Tau0 = typename Default::temperature_t;
    using Bal = typename Cfg::balance_t;
    using Bal0 = typename Default::balance_t;
    std::string s;
    if (Cfg::width_for(d_model) != Default::width_for(d_model)) s += ", Width<" + std::to_string(Cfg::width_for(d_model)) + ">";
    // Compared as fractions, so Temperature<2, 10> is the default 1/5.
    if (Tau::numerator * Tau0::denominator != Tau0::numerator * Tau::denominator)
      s += ", " + ratio_name("Temperature", Tau::numerator, Tau::denominator);
    if (Bal::numerator * Bal0::denominator != Bal0::numerator * Bal::denominator)
      s += ", " + ratio_name("BalanceCoef", Bal::numerator, Bal::denominator);
    if (Cfg::renormalise != Default::renormalise) s += Cfg::renormalise ? ", Renormalise<true>" : ", Renormalise<false>";
    return s;
  } else if constexpr (requires { R::policy::template describe_options<typename R::options>(); }) {
    return R::policy::template describe_options<typename R::options>();  // e.g. TopK<Sigmoid>, SharedExperts<2>
  } else {
    return {};
  }
}

template <class A, Dims D>
std::string assembly_name() {
  using Set = typename A::module_set;
  constexpr bool gpt2_modules =
      !names_itself<typename Set::template attention<D>> && !names_itself<typename Set::template ffn<D>>;
  if constexpr (std::is_same_v<typename A::router::policy, Sequential>) {
    if (A::h == 1 && gpt2_modules) return "Layer";
    if (gpt2_modules) return "Dense<" + std::to_string(A::h) + ">";
    return "Assembly<Router<Sequential>, " + module_set_name<Set, D>() + ", K<1>, H<" + std::to_string(A::h) + ">>";
  } else {
    using Policy = typename A::router::policy;
    // A policy renamed since checkpoints recorded its name keeps the old spelling here (describe_name:
    // BlockChoice is described as ExpertChoice), so that those checkpoints still load.
    std::string router;
    if constexpr (requires { Policy::describe_name; }) router = std::string(Policy::describe_name);
    else router = std::string(Policy::name);
    if constexpr (requires { Policy::label(); }) router = Policy::label();  // e.g. Share<Cycle<2>>
    if constexpr (requires { Policy::options_name(); })
      router += "<" + Policy::options_name() + ">";  // e.g. ExpertChoice<Capacity<1,8>, Every<2>>
    router += router_options_name<typename A::router>(D.d_model);  // e.g. GRU, Width<64>
    // phi::MoM is the default argument, left out as in the type's spelling.
    using Phi = typename A::phi_type;
    const std::string phi = std::is_same_v<Phi, phi::MoM> ? "" : std::string(", ") + Phi::name;
    std::string s = "Assembly<Router<" + router + ">, " + module_set_name<Set, D>() + ", K<" + std::to_string(A::k) +
                    ">, H<" + std::to_string(A::h) + ">" + phi + ">";
    // A fixed step -> module map (parameter sharing, eq. (10)): c_share(h) for every step.
    if constexpr (requires { Policy::template step_map<A::h>(); }) {
      s += " c_share=";
      for (int j : Policy::template step_map<A::h>()) s += std::to_string(j) + ",";
      s.pop_back();
    }
    return s;
  }
}

template <Dims D, class... Ps>
std::string arch_name(TypeList<Ps...>) {
  if constexpr (sizeof...(Ps) == 1) {
    return (assembly_name<Ps, D>() + ...);
  } else {
    // The paper's notation for a chunking strategy: layers per part, e.g. [1-1-4-1-1].
    std::string s = "Chunked[";
    ((s += std::to_string(Ps::depth) + "-"), ...);
    s.back() = ']';
    std::string parts;
    ((parts += (parts.empty() ? "" : ", ") + assembly_name<Ps, D>()), ...);
    return s + "(" + parts + ")";
  }
}
// Layers a token passes through (Assembly::layers summed over the parts).
template <class... Ps>
constexpr int layers(TypeList<Ps...>) {
  return (0 + ... + Ps::layers);
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
         " context=" + std::to_string(D.context) +
         (D.rope() ? " positions=rope(base " + std::to_string(D.rope_base) + ")"
                  : D.positions == Positions::None ? std::string(" positions=none") : std::string()) + "> " +
         detail::arch_name<D>(typename Model::parts{}) +
         ": depth " + std::to_string(detail::layers(typename Model::parts{})) + ", " + std::to_string(Model::steps) + " steps, " +
         detail::with_commas(Model::params) + " params, " + flops + " forward at seq " + std::to_string(seq);
}

}  // namespace mom

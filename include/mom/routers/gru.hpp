#pragma once
// Router<GRU, Options...>: the Mixture-of-Modules router (paper §3.3, eqs. (7)-(8)).
//
// Two routers per chunk, R^A for attention and R^F for FFN, identical in structure:
//   s^A_h = GRU^A(x_h, s^A_{h-1}),   s^F_h = GRU^F(u_h, s^F_{h-1})          eq. (7)
//   r^X   = softmax(W_X s^X_h / tau),  W_X ∈ R^{(N_X+1) × width}               eq. (8) + temperature
// with s_{-1} = 0 at the start of every chunk, the input the token's residual-stream vector
// before any LayerNorm, SKIP the last of the N_X + 1 classes, top-K of r^X and the K picked
// weights renormalised to sum to 1 (SKIP's share included), as in the authors' released code.
// A Switch-style load-balancing loss (coefficient 0.01) is added to the model loss.
//
// Options (any order, each at most once):
//   Width<w>            GRU hidden size (default min(256, d_model): 256 is the authors' scripts' width, for
//                       models of d_model >= 256; a narrower model gets a router as wide as itself, never
//                       wider. The paper's eq. (8) writes W_X ∈ R^{(N+1)×d}, i.e. Width<d_model>)
//   Temperature<p, q>   tau = p / q (default 1/5 = 0.2, the authors' scripts; the paper has none:
//                       Temperature<1>)
//   BalanceCoef<p, q>   coefficient of the balance loss, p / q (default 1/100; BalanceCoef<0> off)
//   ZLoss<p, q>         coefficient of the router z-loss (ST-MoE, arXiv 2202.08906, eq. (5)): p / q ·
//                       mean over the rows of (log Σ exp(logits / tau))², added to the model loss (default 0: off)
//   Renormalise<b>      renormalise the K picked weights to sum 1 (default true, the code); false:
//                       use the raw softmax probabilities (the paper's eqs. (5)-(6) read literally)
// e.g. Router<GRU, Width<64>, Temperature<1, 2>, BalanceCoef<0>>.
#include <array>
#include <string_view>

#include "mom/core/meta.hpp"
#include "mom/routers/options.hpp"
#include "mom/routers/router.hpp"

namespace mom {

// The router configuration an option list gives (checked by GRU::Drives).
template <class OptionList>
struct GRUConfig;
template <class... Os>
struct GRUConfig<TypeList<Os...>> {
  static constexpr bool options_known =
      mom::options_known<TypeList<Width<1>, Temperature<1>, BalanceCoef<1>, Renormalise<true>, ZLoss<0>>, Os...>;
  static constexpr bool options_unique = mom::options_unique<Os...>;
  using width_t = option_t<Width<256>, Os...>;
  static constexpr bool width_given = option_count<Width<1>, Os...> > 0;
  using temperature_t = option_t<Temperature<1, 5>, Os...>;
  using balance_t = option_t<BalanceCoef<1, 100>, Os...>;
  using renormalise_t = option_t<Renormalise<true>, Os...>;
  using z_loss_t = option_t<ZLoss<0>, Os...>;
  // The GRU's hidden size in a model of width d_model: Width<w> when given, else min(256, d_model).
  static constexpr index_t width_for(index_t d_model) {
    return width_given ? index_t(width_t::value) : (d_model < 256 ? d_model : 256);
  }
  static constexpr double temperature = temperature_t::value;
  static constexpr double balance_coef = balance_t::value;
  static constexpr bool renormalise = renormalise_t::value;
  static constexpr double z_loss = z_loss_t::value;
  static constexpr bool valid = options_known && options_unique && width_t::value >= 1 && temperature_t::denominator > 0 &&
                                temperature_t::numerator > 0 && balance_t::denominator > 0 &&
                                balance_t::numerator >= 0 && z_loss_t::numerator >= 0 && z_loss_t::denominator > 0;
};

struct GRU {
  static constexpr bool is_router_policy = true;
  static constexpr std::string_view name = "GRU";
  // Two routers (attention, FFN), each w_ih, w_hh, b_ih, b_hh, w_out for a GRU of width W over inputs
  // of width d and E classes. Named under the chunk's first layer: h.<base>.router_attn.w_ih, ...
  static constexpr std::size_t router_tensor_count = 10;
  struct Offsets {
    index_t w_ih, w_hh, b_ih, b_hh, w_out, end;
  };
  static constexpr Offsets offsets(index_t at, index_t d, index_t W, index_t E) {
    Offsets r{};
    r.w_ih = at;
    r.w_hh = r.w_ih + 3 * W * d;
    r.b_ih = r.w_hh + 3 * W * W;
    r.b_hh = r.b_ih + 3 * W;
    r.w_out = r.b_hh + 3 * W;
    r.end = r.w_out + E * W;
    return r;
  }
  static constexpr std::array<TensorSpec, router_tensor_count> tensors(index_t layer_base, index_t d, index_t W,
                                                                       index_t EA, index_t EF) {
    return {{{"router_attn.w_ih", layer_base, 3 * W, d, Init::Normal},
             {"router_attn.w_hh", layer_base, 3 * W, W, Init::Normal},
             {"router_attn.b_ih", layer_base, 1, 3 * W, Init::Zero},
             {"router_attn.b_hh", layer_base, 1, 3 * W, Init::Zero},
             {"router_attn.w_out", layer_base, EA, W, Init::Normal},
             {"router_ffn.w_ih", layer_base, 3 * W, d, Init::Normal},
             {"router_ffn.w_hh", layer_base, 3 * W, W, Init::Normal},
             {"router_ffn.b_ih", layer_base, 1, 3 * W, Init::Zero},
             {"router_ffn.b_hh", layer_base, 1, 3 * W, Init::Zero},
             {"router_ffn.w_out", layer_base, EF, W, Init::Normal}}};
  }

  template <class Set, int k, int h>
  struct Drives {
    static_assert(Set::n_attention >= 1 && Set::n_ffn >= 1,
                  "mom::Router<GRU> routes attention and FFN modules: the ModuleSet needs MHA<N> and FFN<N>");
    static_assert(!Set::experts_per_step,
                  "mom::Router<GRU> routes one flat module set: Experts<FFN, E, PerStep> needs Router<TopK<Softmax>> "
                  "with phi::MoE");
    static constexpr bool ok = Set::n_attention >= 1 && Set::n_ffn >= 1 && !Set::experts_per_step;
  };

  // The options are checked where the router is executed (assembly/gru.hpp instantiates this).
  template <class Options>
  struct VerifyOptions {
    using Cfg = GRUConfig<Options>;
    static_assert(Cfg::options_known,
                  "mom::Router<GRU, Options...>: unknown option; known: Width<w>, Temperature<p, q>, BalanceCoef<p, q>, "
                  "Renormalise<b>, ZLoss<p, q>");
    static_assert(Cfg::options_unique, "mom::Router<GRU, Options...>: each option may be given at most once");
    static_assert(!Cfg::options_known || Cfg::width_t::value >= 1, "mom::Router<GRU>: Width<w> needs w >= 1");
    static_assert(!Cfg::options_known ||
                      (Cfg::temperature_t::numerator > 0 && Cfg::temperature_t::denominator > 0),
                  "mom::Router<GRU>: Temperature<p, q> must be > 0");
    static_assert(!Cfg::options_known || (Cfg::balance_t::numerator >= 0 && Cfg::balance_t::denominator > 0),
                  "mom::Router<GRU>: BalanceCoef<p, q> must be >= 0");
    static_assert(!Cfg::options_known || (Cfg::z_loss_t::numerator >= 0 && Cfg::z_loss_t::denominator > 0),
                  "mom::Router<GRU>: ZLoss<p, q> must be >= 0");
    static constexpr bool ok = Cfg::valid;
  };
};

}  // namespace mom

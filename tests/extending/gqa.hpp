#pragma once
// (b) A new sequence mixer, defined outside the library: grouped-query attention (Ainslie et al. 2023,
// arXiv 2305.13245): D.heads query heads share KV < heads key/value heads (query head i reads key/value
// head i / (heads / KV)), so the K/V projection is [2·KV·hd × d] instead of [2d × d]. Causal, pre-norm,
// with biases, like the library's attention. It meets mom::SequenceMixer (modules/module.hpp), the
// dense contract, which is what the dense stack, parameter sharing and MoE's attention need; it does
// not implement the row-group members, so a MoM chunk or a layer-skip stack over it is a compile error
// naming the missing member (docs/extending.md, step 2).
//
// Attention itself is the library's fused causal op over a [Q | K | V] matrix with every query head's
// key/value head copied into place (a loop over host memory: CPU backends); its backward sums the copies'
// gradients back onto the shared heads.
#include <mom/mom.hpp>

#include <array>
#include <span>
#include <type_traits>

namespace ext {

template <int KV>
struct GroupedQuery {
  template <mom::Dims D>
  struct type {
    static_assert(KV >= 1 && D.heads % KV == 0, "ext::GroupedQuery<KV>: KV must divide the number of heads");
    using index_t = mom::index_t;
    template <class T>
    using MV = mom::MatrixView<T>;
    static constexpr const char* name = KV == 1 ? "MultiQuery" : "GroupedQuery";
    static constexpr mom::ModuleRole single_role = mom::ModuleRole::SequenceMixer;  // MHA<N, ...> only
    static constexpr index_t d = D.d_model, heads = D.heads, hd = d / heads, kvd = KV * hd, group = heads / KV;

    static constexpr index_t o_ln_w = 0, o_ln_b = d, o_w_q = 2 * d, o_b_q = o_w_q + d * d, o_w_kv = o_b_q + d,
                             o_b_kv = o_w_kv + 2 * kvd * d, o_w_o = o_b_kv + 2 * kvd, o_b_o = o_w_o + d * d;
    static constexpr index_t params = o_b_o + d;
    static constexpr std::array<mom::TensorSpec, 8> tensors(index_t layer) {
      return {{{"ln_1.w", layer, 1, d, mom::Init::One},
               {"ln_1.b", layer, 1, d, mom::Init::Zero},
               {"attn.w_q", layer, d, d, mom::Init::Normal},
               {"attn.b_q", layer, 1, d, mom::Init::Zero},
               {"attn.w_kv", layer, 2 * kvd, d, mom::Init::Normal},
               {"attn.b_kv", layer, 1, 2 * kvd, mom::Init::Zero},
               {"attn.w_proj", layer, d, d, mom::Init::ResidualNormal},
               {"attn.b_proj", layer, 1, d, mom::Init::Zero}}};
    }
    // Q 2d², K/V 2·d·2kvd, output 2d², causal attention 2d(seq+1) per token (as modules::Attention);
    // backward: two products per linear, five causal products.
    static constexpr index_t linear_flops = 2 * d * d + 2 * d * 2 * kvd + 2 * d * d;
    static constexpr index_t flops_per_token(index_t seq) { return linear_flops + 2 * d * (seq + 1); }
    static constexpr index_t backward_flops_per_token(index_t seq) { return 2 * linear_flops + 5 * d * (seq + 1); }

    struct Saved {
      index_t ln, mean, rstd, q, kv, qkv, att, lse;
    };
    static constexpr Saved plan(mom::Arena& a, index_t batch, index_t seq) {
      const index_t n = batch * seq;
      Saved s{};
      s.ln = a.take(n * d);
      s.mean = a.take(n);
      s.rstd = a.take(n);
      s.q = a.take(n * d);
      s.kv = a.take(n * 2 * kvd);
      s.qkv = a.take(n * 3 * d);
      s.att = a.take(n * d);
      s.lse = a.take(batch * heads * seq);
      return s;
    }
    // d(att) [n×d], d[Q|K|V] [n×3d], dQ [n×d], d[K|V] [n×2kvd], d(LN) [n×d].
    static constexpr index_t scratch(index_t batch, index_t seq) { return batch * seq * (6 * d + 2 * kvd); }

    template <class Be, class T>
    static void forward(Be& be, const T* p, T* ws, const Saved& s, MV<const T> x, MV<T> out, index_t batch,
                        index_t seq) {
      const index_t n = batch * seq;
      be.layernorm_forward(MV<T>{ws + s.ln, n, d}, sp(ws + s.mean, n), sp(ws + s.rstd, n), x, sp(p + o_ln_w, d),
                           sp(p + o_ln_b, d));
      const MV<const T> ln{ws + s.ln, n, d};
      be.linear_forward(MV<T>{ws + s.q, n, d}, ln, MV<const T>{p + o_w_q, d, d}, sp(p + o_b_q, d));
      be.linear_forward(MV<T>{ws + s.kv, n, 2 * kvd}, ln, MV<const T>{p + o_w_kv, 2 * kvd, d}, sp(p + o_b_kv, 2 * kvd));
      expand<Be>(ws + s.qkv, ws + s.q, ws + s.kv, n);
      be.attention_forward(MV<T>{ws + s.att, n, d}, sp(ws + s.lse, batch * heads * seq), MV<const T>{ws + s.qkv, n, 3 * d},
                           batch, seq, heads);
      be.linear_forward(out, MV<const T>{ws + s.att, n, d}, MV<const T>{p + o_w_o, d, d}, sp(p + o_b_o, d));
    }

    template <class Be, class T>
    static void backward(Be& be, const T* p, T* g, const T* ws, const Saved& s, MV<const T> x, MV<T> dx,
                         MV<const T> dout, T* sc, index_t batch, index_t seq) {
      const index_t n = batch * seq;
      T *datt = sc, *dqkv = datt + n * d, *dq = dqkv + 3 * n * d, *dkv = dq + n * d, *dln = dkv + 2 * n * kvd;
      be.zero(sp(sc, n * (6 * d + 2 * kvd)));
      be.linear_backward(MV<T>{datt, n, d}, MV<T>{g + o_w_o, d, d}, sp(g + o_b_o, d), dout, MV<const T>{ws + s.att, n, d},
                         MV<const T>{p + o_w_o, d, d});
      be.attention_backward(MV<T>{dqkv, n, 3 * d}, MV<const T>{datt, n, d}, MV<const T>{ws + s.att, n, d},
                            sp(ws + s.lse, batch * heads * seq), MV<const T>{ws + s.qkv, n, 3 * d}, batch, seq, heads);
      reduce<Be>(dq, dkv, dqkv, n);
      const MV<const T> ln{ws + s.ln, n, d};
      be.linear_backward(MV<T>{dln, n, d}, MV<T>{g + o_w_q, d, d}, sp(g + o_b_q, d), MV<const T>{dq, n, d}, ln,
                         MV<const T>{p + o_w_q, d, d});
      be.linear_backward(MV<T>{dln, n, d}, MV<T>{g + o_w_kv, 2 * kvd, d}, sp(g + o_b_kv, 2 * kvd),
                         MV<const T>{dkv, n, 2 * kvd}, ln, MV<const T>{p + o_w_kv, 2 * kvd, d});
      be.layernorm_backward(dx, sp(g + o_ln_w, d), sp(g + o_ln_b, d), MV<const T>{dln, n, d}, x, sp(ws + s.mean, n),
                            sp(ws + s.rstd, n), sp(p + o_ln_w, d));
    }

    // Incremental decoding (docs/extending.md, "Make your attention decode"; mom::DecodingSequenceMixerOn): one
    // new token per active sequence. This version caches the expanded heads (the cache the Decoder gives a
    // module is [slots·max_len × d]), so it saves no cache memory over full attention; its keys and values are
    // exactly forward's. The backend ops kv_write and attention_decode do the rest.
    using DecodeSaved = Saved;
    static constexpr DecodeSaved plan_decode(mom::Arena& a, index_t rows) { return plan(a, rows, 1); }
    template <class Be, class T>
    static void decode(Be& be, const T* p, T* ws, const DecodeSaved& s, MV<const T> x, MV<T> out, MV<T> k_cache,
                       MV<T> v_cache, std::span<const index_t> slot, std::span<const index_t> pos, index_t max_len) {
      const index_t n = x.rows;
      be.layernorm_forward(MV<T>{ws + s.ln, n, d}, sp(ws + s.mean, n), sp(ws + s.rstd, n), x, sp(p + o_ln_w, d),
                           sp(p + o_ln_b, d));
      const MV<const T> ln{ws + s.ln, n, d}, qkv{ws + s.qkv, n, 3 * d};
      be.linear_forward(MV<T>{ws + s.q, n, d}, ln, MV<const T>{p + o_w_q, d, d}, sp(p + o_b_q, d));
      be.linear_forward(MV<T>{ws + s.kv, n, 2 * kvd}, ln, MV<const T>{p + o_w_kv, 2 * kvd, d}, sp(p + o_b_kv, 2 * kvd));
      expand<Be>(ws + s.qkv, ws + s.q, ws + s.kv, n);
      be.kv_write(k_cache, v_cache, qkv, slot, pos, max_len);
      be.attention_decode(MV<T>{ws + s.att, n, d}, qkv, MV<const T>(k_cache), MV<const T>(v_cache), slot, pos, max_len,
                          heads);
      be.linear_forward(out, MV<const T>{ws + s.att, n, d}, MV<const T>{p + o_w_o, d, d}, sp(p + o_b_o, d));
    }

   private:
    template <class Be>
    static constexpr void require_host_memory() {
      static_assert(std::is_base_of_v<mom::cpu::Backend<typename Be::scalar>, Be>,
                    "ext::GroupedQuery: the head copies read host memory: use a CPU backend");
    }
    // [Q | K | V] [n × 3d]: Q as is; query head i's K and V from key/value head i / group.
    template <class Be, class T>
    static void expand(T* qkv, const T* q, const T* kv, index_t n) {
      require_host_memory<Be>();
      for (index_t r = 0; r < n; ++r)
        for (index_t c = 0; c < d; ++c) {
          const index_t shared = (c / hd) / group * hd + c % hd;
          qkv[r * 3 * d + c] = q[r * d + c];
          qkv[r * 3 * d + d + c] = kv[r * 2 * kvd + shared];
          qkv[r * 3 * d + 2 * d + c] = kv[r * 2 * kvd + kvd + shared];
        }
    }
    // dQ from d[Q|K|V]; d[K|V] of a shared head = the sum over the query heads that read it.
    template <class Be, class T>
    static void reduce(T* dq, T* dkv, const T* dqkv, index_t n) {
      require_host_memory<Be>();
      for (index_t r = 0; r < n; ++r)
        for (index_t c = 0; c < d; ++c) {
          const index_t shared = (c / hd) / group * hd + c % hd;
          dq[r * d + c] = dqkv[r * 3 * d + c];
          dkv[r * 2 * kvd + shared] += dqkv[r * 3 * d + d + c];
          dkv[r * 2 * kvd + kvd + shared] += dqkv[r * 3 * d + 2 * d + c];
        }
    }
    template <class T>
    static std::span<T> sp(T* p, index_t n) { return {p, std::size_t(n)}; }
  };
};

}  // namespace ext

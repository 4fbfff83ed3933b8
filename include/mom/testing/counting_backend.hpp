#pragma once
// The FLOP-counting backend (mom/testing.hpp): a model made on CountingBackend<T> runs on cpu::Backend<T> and
// tallies the FLOPs it executed, to compare with the cost model (Model::forward_flops, realised_forward_flops,
// Model::backward_flops_per_token):
//
//   auto m = Model::make<mom::testing::CountingBackend<float>>(seed);
//   m.reserve(batch, seq);
//   m.forward(tokens, targets, batch, seq);
//   assert(m.backend().flops == Model::forward_flops(batch, seq));   // realised_forward_flops(m) when routed
//
// A user's module that calls only these ops is counted; one that calls another backend op is not (add it here).
#include <span>
#include <vector>

#include "mom/backend/cpu.hpp"
#include "mom/core/groups.hpp"

namespace mom::testing {

// Forwards every op to cpu::Backend<T> and tallies the FLOPs actually executed: 2·m·n·k per
// matrix product (linear, gemm, the GRU cell's two products), and for packed attention 4·hd per
// (query, visible key) pair per head, counting the visible keys from the position lists; in backward
// 4·m·n·k per linear with an input gradient (2·m·n·k without), 5 causal products for attention and
// 10·hd per packed (query, key) pair, as the cost model's backward_flops count them.
template <class T>
struct CountingBackend : cpu::Backend<T> {
  using Base = cpu::Backend<T>;
  // A linear's backward: 2 FLOPs per multiply-add for each product that runs (dx = dy·w, dw = dyᵀ·x).
  static constexpr index_t backward_products(bool dx, bool dw) { return (dx ? 2 : 0) + (dw ? 2 : 0); }
  using typename Base::CM;
  using typename Base::CS;
  using typename Base::M;
  using typename Base::S;
  using typename Base::Tok;
  index_t flops = 0;
  std::vector<const T*> weights;  // the weight matrix of every linear_forward, in call order

  void linear_forward(M y, CM x, CM w, CS b) {
    flops += 2 * x.rows * x.cols * w.rows;
    weights.push_back(w.data);
    Base::linear_forward(y, x, w, b);
  }
  void gemm(M C, CM A, typename Base::Trans ta, CM B, typename Base::Trans tb, T alpha = T(1), T beta = T(0)) {
    flops += 2 * C.rows * C.cols * (ta == Base::Trans::N ? A.cols : A.rows);
    Base::gemm(C, A, ta, B, tb, alpha, beta);
  }
  void attention_forward(M out, S lse, CM qkv, index_t batch, index_t seq, index_t heads) {
    flops += batch * 2 * (qkv.cols / 3) * seq * (seq + 1);
    Base::attention_forward(out, lse, qkv, batch, seq, heads);
  }
  void gru_cell_forward(M h_out, M gates, CM x, CM h, CM w_ih, CM w_hh, CS b_ih, CS b_hh) {
    flops += 2 * x.rows * w_ih.rows * (x.cols + h.cols);
    Base::gru_cell_forward(h_out, gates, x, h, w_ih, w_hh, b_ih, b_hh);
  }
  void gru_cell_backward(M dx, M dh, M dw_ih, M dw_hh, S db_ih, S db_hh, M scratch, CM dh_out, CM gates, CM x, CM h,
                         CM w_ih, CM w_hh) {
    // dW_ih, dW_hh and dh always, dx when asked: each as large as its forward product
    flops += 2 * x.rows * w_ih.rows * ((dx.empty() ? 1 : 2) * x.cols + 2 * h.cols);
    Base::gru_cell_backward(dx, dh, dw_ih, dw_hh, db_ih, db_hh, scratch, dh_out, gates, x, h, w_ih, w_hh);
  }
  // Stick-breaking attention over [Q (heads·dh) | K (kv_heads·dh) | V]: 2 and 5 causal products of the query
  // width, as softmax attention's (modules/moa.hpp counts it so).
  static index_t query_width(CM qkv, index_t heads, index_t kv_heads) {
    return heads * (qkv.cols / (heads + 2 * kv_heads));
  }
  void stick_breaking_forward(M out, CM qkv, index_t batch, index_t seq, index_t heads, index_t kv_heads) {
    flops += batch * 2 * query_width(qkv, heads, kv_heads) * seq * (seq + 1);
    Base::stick_breaking_forward(out, qkv, batch, seq, heads, kv_heads);
  }
  void stick_breaking_backward(M dqkv, CM dout, CM out, CM qkv, index_t batch, index_t seq, index_t heads,
                               index_t kv_heads) {
    flops += batch * 5 * query_width(qkv, heads, kv_heads) * seq * (seq + 1);
    Base::stick_breaking_backward(dqkv, dout, out, qkv, batch, seq, heads, kv_heads);
  }
  void attention_packed_forward(M out, S lse, CM q, CM k, CM v, Tok q_tok, Tok k_tok, index_t seq, index_t heads) {
    flops += 4 * q.cols * visible_pairs(q_tok, k_tok, seq);
    Base::attention_packed_forward(out, lse, q, k, v, q_tok, k_tok, seq, heads);
  }
  void linear_backward(M dx, M dw, S db, CM dy, CM x, CM w, Store dx_store = Store::add) {
    flops += backward_products(!dx.empty(), !dw.empty()) * x.rows * x.cols * w.rows;
    Base::linear_backward(dx, dw, db, dy, x, w, dx_store);
  }
  void attention_backward(M dqkv, CM dout, CM out, CS lse, CM qkv, index_t batch, index_t seq, index_t heads) {
    flops += batch * 5 * (qkv.cols / 3) * seq * (seq + 1);
    Base::attention_backward(dqkv, dout, out, lse, qkv, batch, seq, heads);
  }
  void attention_packed_backward(M dq, M dk, M dv, CM dout, CM out, CS lse, CM q, CM k, CM v, Tok q_tok, Tok k_tok,
                                 index_t seq, index_t heads) {
    flops += 10 * q.cols * visible_pairs(q_tok, k_tok, seq);
    Base::attention_packed_backward(dq, dk, dv, dout, out, lse, q, k, v, q_tok, k_tok, seq, heads);
  }

  // Grouped ops (core/groups.hpp): the offsets are host memory on the CPU, so the tally follows
  // the groups exactly; a group's weights are recorded once per non-empty group.
  using CPG = PerGroup<const T>;
  using PG = PerGroup<T>;
  template <class F>
  static void each_group(RowGroups g, F&& f) {
    for (int i = 0; i < g.count; ++i)
      if (g.offsets[i + 1] > g.offsets[i]) f(i, index_t(g.offsets[i]), index_t(g.offsets[i + 1] - g.offsets[i]));
  }
  void grouped_linear_forward(M y, CM x, CPG w, CPG b, RowGroups g) {
    each_group(g, [&](int i, index_t, index_t n) {
      flops += 2 * n * x.cols * y.cols;
      weights.push_back(w[i]);
    });
    Base::grouped_linear_forward(y, x, w, b, g);
  }
  void grouped_linear_backward(M dx, PG dw, PG db, CM dy, CM x, CPG w, RowGroups g, Store dx_store = Store::add) {
    each_group(g, [&](int, index_t, index_t n) { flops += backward_products(!dx.empty(), dw.base != nullptr) * n * x.cols * dy.cols;
    });
    Base::grouped_linear_backward(dx, dw, db, dy, x, w, g, dx_store);
  }
  // The gathered forms count as the plain ones (the same products).
  void grouped_linear_forward(M y, CM x, Tok idx, CPG w, CPG b, RowGroups g, Epilogue ep = Epilogue::none) {
    each_group(g, [&](int i, index_t, index_t n) {
      flops += 2 * n * x.cols * y.cols;
      weights.push_back(w[i]);
    });
    Base::grouped_linear_forward(y, x, idx, w, b, g, ep);
  }
  void grouped_linear_backward(M dx, PG dw, PG db, CM dy, CM x, Tok idx, CPG w, RowGroups g, Store dx_store = Store::add) {
    each_group(g, [&](int, index_t, index_t n) { flops += backward_products(!dx.empty(), dw.base != nullptr) * n * x.cols * dy.cols;
    });
    Base::grouped_linear_backward(dx, dw, db, dy, x, idx, w, g, dx_store);
  }
  void grouped_linear_backward(M dx, PG dw, ScaledRows<T> dy, CM x, Tok idx, CPG w, RowGroups g, Store dx_store = Store::add) {
    each_group(g, [&](int, index_t, index_t n) { flops += backward_products(!dx.empty(), dw.base != nullptr) * n * x.cols * dy.table.cols;
    });
    Base::grouped_linear_backward(dx, dw, dy, x, idx, w, g, dx_store);
  }
  void attention_grouped_forward(M out, S lse, CM q, CPG k, CPG v, index_t kv_rows, index_t kv_ld, Tok q_tok, Tok k_tok,
                                 RowGroups g, index_t seq, index_t heads) {
    each_group(g, [&](int, index_t o, index_t n) { flops += 4 * q.cols * group_pairs(q_tok, k_tok, o, n, seq); });
    Base::attention_grouped_forward(out, lse, q, k, v, kv_rows, kv_ld, q_tok, k_tok, g, seq, heads);
  }
  void attention_grouped_backward(M dq, PG dk, PG dv, CM dout, CM out, CS lse, CM q, CPG k, CPG v, index_t kv_rows,
                                  index_t kv_ld, Tok q_tok, Tok k_tok, RowGroups g, index_t seq, index_t heads) {
    each_group(g, [&](int, index_t o, index_t n) { flops += 10 * q.cols * group_pairs(q_tok, k_tok, o, n, seq); });
    Base::attention_grouped_backward(dq, dk, dv, dout, out, lse, q, k, v, kv_rows, kv_ld, q_tok, k_tok, g, seq, heads);
  }
  static index_t group_pairs(Tok q_tok, Tok k_tok, index_t o, index_t n, index_t seq) {
    return visible_pairs(q_tok.subspan(std::size_t(o), std::size_t(n)),
                         k_tok.empty() ? k_tok : k_tok.subspan(std::size_t(o), std::size_t(n)), seq);
  }

  // (query, key) pairs a packed attention sees: each query t sees the keys s <= t of its own sequence
  // (every position up to t when there is no key list).
  static index_t visible_pairs(Tok q_tok, Tok k_tok, index_t seq) {
    index_t pairs = 0;
    for (token_t t : q_tok) {
      if (k_tok.empty()) pairs += t % seq + 1;
      else
        for (token_t s : k_tok) pairs += (s / seq == t / seq && s <= t) ? 1 : 0;
    }
    return pairs;
  }
};

}  // namespace mom::testing

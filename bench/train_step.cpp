// bench_train_step: one training step (forward + backward + grad-norm + AdamW over all parameters)
// of the dense 8-layer model and of MoM_E / MoM_I / MoM_P on its [1-1-4-1-1] chunking (issue 5,
// item 9), float, on cpu::Backend<float> wrapped in a timing backend.
//
//   bench_train_step [--batch B] [--reps R] [--only dense,E,I,P,share,moe,moe-share,moeut,moduleformer,dsmoe,ec,mod,mod-causal,skip,exit,mode-int,mode-staged] [--routed-kv] [--wide] [--paired] [--shapes]
//   bench_train_step --under-load   the dense step at 1 and 2 threads, quiet and with one core kept busy
//   bench_train_step --paired [--only moeut,moduleformer,moe,dsmoe,ec,P]   each routed step against its dense
//                    reference step by step (the ratio robust to a drifting machine; see paired below), and
//                    each pair's step over issue 29's roofline (the reference's step less its optimizer times the
//                    FLOP ratio, plus the model's own grad_norm + AdamW, both timed in the pair)
//   bench_train_step --shapes ...   also each model's products (and attention) by kind and shape: ms per step,
//                    GFLOP/s, share of the step, from the instrumented steps (where a routed model's products lose
//                    rate against the dense ones), and the other timed ops by name (where the rest of the step goes)
//
// Issue 6 adds Mixture-of-Experts at the same dims: MoE (8 layers x 8 experts, top-2) and
// MoE(share) (8 experts shared by the 8 layers, top-2); their "router" share is the top-K
// routers' products (W_r has 8 rows).
// (mod = Mixture-of-Depths, 12.5% capacity, every other block; mod-causal adds its causal predictor)
//
// Dims: d_model 256, 8 heads, d_ff 1024, vocab 256 (byte-level, as the KJV runs), seq 256;
// batch 16 → 4096 tokens per step. Threads: OpenMP's (2 unless OMP_NUM_THREADS says otherwise).
//
// Per model: 2 warm-up steps, then R timed steps (median reported) with the timing wrapper
// switched off (one predictable branch per op), then R steps with it on, which accumulate wall
// time per op category. Shares are taken within those instrumented steps.
//   router   = GRU cells forward + backward (their GEMMs and gate math) and the router heads
//   dispatch = route top-K fwd/bwd, balance loss, group_by_choice, gather/scatter(+backward), the weights
//              applied after a routed product (weight_rows_backward), host reads of the group offsets
//   routing  = router + dispatch (the overhead the target is about)
// FLOP ratio = the cost model's forward FLOPs for the routing actually taken
// (realised_forward_flops, models/mom_models.hpp) over the dense model's Model::forward_flops;
// "exec. train FLOP ratio" = FLOPs of every product actually executed in forward + backward
// (counted by the wrapper, as the counting backend of tests/models/mom_cost_test.cpp does for
// the forward) over the dense model's; for the dense model that count equals
// Model::training_flops (checked and printed).
#include <omp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <source_location>
#include <string>
#include <string_view>
#include <vector>

#include <mom/backend/cpu.hpp>
#include <mom/models/mom_models.hpp>
#include <mom/models/moe_models.hpp>
#include <mom/models/moeut_models.hpp>
#include <mom/models/moduleformer_models.hpp>
#include <mom/mom.hpp>

using namespace mom;

namespace {

constexpr double kSgemmPeak = 427.4;  // GFLOP/s, bench/RESULTS.md (OpenBLAS AVX-512 sgemm 3072³)

enum Cat : int { kLinear, kAttention, kPackedAttention, kLayerNorm, kElementwise, kLoss, kEmbedding, kOptim,
                 kRouter, kDispatch, kSelect, kZeroCopy, kCats };
constexpr std::array<const char*, kCats> kCatName = {"linear/gemm", "attention", "packed attn", "layernorm",
                                                     "gelu/relu/add", "x-entropy", "embedding", "optimizer",
                                                     "router", "dispatch", "selection", "zero/copy"};

using Clock = std::chrono::steady_clock;

// cpu::Backend<T> with wall time per op category and the FLOPs of every executed product.
// The router heads are the only linears with at most 16 output rows (E = N + 1 classes).
template <class T>
struct TimingBackend : cpu::Backend<T> {
  using Base = cpu::Backend<T>;
  // A linear's backward: 2 FLOPs per multiply-add for each product that runs (dx = dy·w, dw = dyᵀ·x), as
  // testing/counting_backend.hpp counts them.
  static constexpr double backward_products(bool dx, bool dw) { return (dx ? 2.0 : 0.0) + (dw ? 2.0 : 0.0); }
  using typename Base::CM;
  using typename Base::CS;
  using typename Base::M;
  using typename Base::S;
  using typename Base::Tok;
  using Trans = typename Base::Trans;

  struct Stats {
    bool on = false;
    std::array<double, kCats> seconds{};
    double flops = 0;  // products executed (forward + backward), counted whether on or not
    std::array<double, kCats> cat_flops{};  // the same per category (router: GRU and head products)
    // --shapes: seconds and FLOPs of the instrumented steps' products by kind and shape
    bool by_shape = false, in_product = false;
    std::map<std::string, std::pair<double, double>> shapes;
    std::map<std::string, double> ops;  // --shapes: seconds of the other ops by name
  };
  Stats* st = nullptr;  // shared by copies (the model keeps its own copy of the backend)

  // An op, timed under its category; with --shapes also summed under its name (the wrapper that calls timed:
  // "scatter_add_rows", "topk_rows", ...), so the time outside the products is listed op by op.
  template <class F>
  void timed(Cat c, F&& f, std::source_location at = std::source_location::current()) const {
    if (!st || !st->on) return f();
    timed_as(c, st->by_shape && !st->in_product ? op_name(at.function_name()) : std::string(), f);
  }
  // The same under a given name (the row ops add their rows' shape: "scatter_add_rows 16384 x 256").
  template <class F>
  void timed_as(Cat c, const std::string& name, F&& f) const {
    if (!st || !st->on) return f();
    const auto t0 = Clock::now();
    f();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    st->seconds[c] += s;
    if (st->by_shape && !st->in_product) st->ops[name] += s;
  }
  std::string rows_shape(const char* op, CM m) const {
    return !st || !st->by_shape ? std::string() : std::string(op) + " " + std::to_string(m.rows) + " x " + std::to_string(m.cols);
  }
  // "void TimingBackend<T>::scatter_add_rows(M, ...) const [with ...]" -> "scatter_add_rows"
  static std::string op_name(std::string_view f) {
    f = f.substr(0, f.find('('));
    const auto colon = f.rfind("::");
    return std::string(colon == std::string_view::npos ? f : f.substr(colon + 2));
  }
  void count(Cat c, double f) const {
    if (st) st->flops += f, st->cat_flops[c] += f;
  }
  // A product: counted, timed, and with --shapes summed under "kind rows x in -> out" (groups: the groups' count).
  template <class F>
  void product(Cat c, const char* kind, double rows, index_t in, index_t out, int groups, double flops, F&& f) const {
    count(c, flops);
    if (!st || !st->on || !st->by_shape) return timed(c, f);
    const auto t0 = Clock::now();
    st->in_product = true;
    timed(c, f);
    st->in_product = false;
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();  // the product's, not the key's
    char key[160];
    std::snprintf(key, sizeof key, "%-22s %6.0f x %4lld -> %4lld%s", kind, rows, (long long)in, (long long)out,
                  groups > 0 ? (" in " + std::to_string(groups) + " groups").c_str() : "");
    auto& e = st->shapes[key];
    e.first += seconds, e.second += flops;
  }
  static Cat linear_cat(CM w) { return w.rows <= 16 ? kRouter : kLinear; }

  void gemm(M C, CM A, Trans ta, CM B, Trans tb, T alpha = T(1), T beta = T(0)) const {
    const index_t k = ta == Trans::N ? A.cols : A.rows;
    product(kLinear, "gemm", double(C.rows), k, C.cols, 0, 2.0 * C.rows * C.cols * k,
            [&] { Base::gemm(C, A, ta, B, tb, alpha, beta); });
  }
  void linear_forward(M y, CM x, CM w, CS b) const {
    product(linear_cat(w), "linear fwd", double(x.rows), x.cols, w.rows, 0, 2.0 * x.rows * x.cols * w.rows,
            [&] { Base::linear_forward(y, x, w, b); });
  }
  void linear_backward(M dx, M dw, S db, CM dy, CM x, CM w, Store dx_store = Store::add) const {
    product(linear_cat(w), "linear bwd", double(x.rows), x.cols, w.rows, 0,
            backward_products(!dx.empty(), !dw.empty()) * x.rows * x.cols * w.rows,
            [&] { Base::linear_backward(dx, dw, db, dy, x, w, dx_store); });
  }
  void embedding_forward(M out, Tok tokens, CM wte, CM wpe, index_t seq) const {
    timed(kEmbedding, [&] { Base::embedding_forward(out, tokens, wte, wpe, seq); });
  }
  void embedding_backward(M dwte, M dwpe, CM dout, Tok tokens, index_t seq) const {
    timed(kEmbedding, [&] { Base::embedding_backward(dwte, dwpe, dout, tokens, seq); });
  }
  void layernorm_forward(M out, S mean, S rstd, CM x, CS gamma, CS beta, T eps = T(1e-5)) const {
    timed(kLayerNorm, [&] { Base::layernorm_forward(out, mean, rstd, x, gamma, beta, eps); });
  }
  void layernorm_backward(M dx, S dgamma, S dbeta, CM dout, CM x, CS mean, CS rstd, CS gamma) const {
    timed(kLayerNorm, [&] { Base::layernorm_backward(dx, dgamma, dbeta, dout, x, mean, rstd, gamma); });
  }
  // Zeroing and copies ("zero/copy"): the accumulate-only ops' fresh buffers, the residual copies.
  template <class U>
  void zero(std::span<U> s) const {
    timed_as(kZeroCopy, st && st->by_shape ? "zero " + std::to_string(s.size()) : std::string(), [&] { Base::zero(s); });
  }
  void zero(M m) const { timed_as(kZeroCopy, rows_shape("zero", m), [&] { Base::zero(m); }); }
  void zero_rows(M m, RowGroups g) const { timed(kZeroCopy, [&] { Base::zero_rows(m, g); }); }
  template <class U>
  void copy(std::span<U> dst, std::span<const U> src) const {
    timed(kZeroCopy, [&] { Base::copy(dst, src); });
  }
  template <class U>
  void copy(std::span<U> dst, std::span<U> src) const {
    timed(kZeroCopy, [&] { Base::copy(dst, std::span<const U>(src)); });
  }
  void copy(M dst, CM src) const { timed_as(kZeroCopy, rows_shape("copy", dst), [&] { Base::copy(dst, src); }); }
  // The sigmoid top-K selections of σ-MoE and SwitchHead ("selection"; their logits' GEMMs are "router" or
  // "linear/gemm" by width): the entropy regulariser, the top-K, the sigmoid.
  void selection_entropy_forward(S loss_out, M dlogits, CM logits, index_t batch, index_t seq, T coef,
                                 T cond_coef = T(0)) const {
    timed(kSelect, [&] { Base::selection_entropy_forward(loss_out, dlogits, logits, batch, seq, coef, cond_coef); });
  }
  void topk_rows(M values, MatrixView<token_t> indices, CM x) const {
    timed(kSelect, [&] { Base::topk_rows(values, indices, x); });
  }
  void topk_rows_backward(M dx, CM dvalues, MatrixView<const token_t> indices) const {
    timed(kSelect, [&] { Base::topk_rows_backward(dx, dvalues, indices); });
  }
  void sigmoid_forward(S out, CS x) const { timed(kSelect, [&] { Base::sigmoid_forward(out, x); }); }
  void sigmoid_backward(S dx, CS out, CS dout) const { timed(kSelect, [&] { Base::sigmoid_backward(dx, out, dout); }); }
  void relu_forward(S out, CS x) const { timed(kElementwise, [&] { Base::relu_forward(out, x); }); }
  void relu_backward(S dx, CS x, CS dout, Store st = Store::add) const {
    timed(kElementwise, [&] { Base::relu_backward(dx, x, dout, st); });
  }
  void gelu_forward(S out, CS x) const { timed(kElementwise, [&] { Base::gelu_forward(out, x); }); }
  void gelu_backward(S dx, CS x, CS dout, Store st = Store::add) const {
    timed(kElementwise, [&] { Base::gelu_backward(dx, x, dout, st); });
  }
  void add_forward(S out, CS a, CS b) const { timed(kElementwise, [&] { Base::add_forward(out, a, b); }); }
  void cross_entropy_forward(S loss_out, S lse, CM logits, Tok targets, token_t ignore_index = -1) const {
    timed(kLoss, [&] { Base::cross_entropy_forward(loss_out, lse, logits, targets, ignore_index); });
  }
  void cross_entropy_backward(M dlogits, CM logits, CS lse, Tok targets, T dloss, token_t ignore_index = -1) const {
    timed(kLoss, [&] { Base::cross_entropy_backward(dlogits, logits, lse, targets, dloss, ignore_index); });
  }
  void attention_forward(M out, S lse, CM qkv, index_t batch, index_t seq, index_t heads) const {
    product(kAttention, "attention fwd, H -> d", double(batch * seq), heads, qkv.cols / 3, 0,
            2.0 * batch * (qkv.cols / 3) * seq * (seq + 1), [&] { Base::attention_forward(out, lse, qkv, batch, seq, heads); });
  }
  void attention_backward(M dqkv, CM dout, CM out, CS lse, CM qkv, index_t batch, index_t seq, index_t heads) const {
    product(kAttention, "attention bwd, H -> d", double(batch * seq), heads, qkv.cols / 3, 0,
            5.0 * batch * (qkv.cols / 3) * seq * (seq + 1), [&] { Base::attention_backward(dqkv, dout, out, lse, qkv, batch, seq, heads); });
  }
  // Stick-breaking attention (ModuleFormer's MoA) counts as attention: the same products per (query, key) pair
  // and query head (docs/ops.md), out.cols = the query heads' width.
  void stick_breaking_forward(M out, CM qkv, index_t batch, index_t seq, index_t heads, index_t kv_heads) const {
    count(kAttention, 2.0 * batch * out.cols * seq * (seq + 1));
    timed(kAttention, [&] { Base::stick_breaking_forward(out, qkv, batch, seq, heads, kv_heads); });
  }
  void stick_breaking_backward(M dqkv, CM dout, CM out, CM qkv, index_t batch, index_t seq, index_t heads,
                               index_t kv_heads) const {
    count(kAttention, 5.0 * batch * out.cols * seq * (seq + 1));
    timed(kAttention, [&] { Base::stick_breaking_backward(dqkv, dout, out, qkv, batch, seq, heads, kv_heads); });
  }
  void gather_rows(M out, CM in, Tok idx) const {
    timed_as(kDispatch, rows_shape("gather_rows", out), [&] { Base::gather_rows(out, in, idx); });
  }
  void scatter_add_rows(M out, CM in, Tok idx, CS weights = {}, Store st = Store::add) const {
    timed_as(kDispatch, rows_shape("scatter_add_rows", in), [&] { Base::scatter_add_rows(out, in, idx, weights, st); });
  }
  void scatter_add_rows_backward(M din, S dweights, CM dout, CM in, Tok idx, CS weights = {}, Store st = Store::add) const {
    timed(kDispatch, [&] { Base::scatter_add_rows_backward(din, dweights, dout, in, idx, weights, st); });
  }
  void gru_cell_forward(M h_out, M gates, CM x, CM h, CM w_ih, CM w_hh, CS b_ih, CS b_hh) const {
    count(kRouter, 2.0 * x.rows * w_ih.rows * (x.cols + h.cols));
    timed(kRouter, [&] { Base::gru_cell_forward(h_out, gates, x, h, w_ih, w_hh, b_ih, b_hh); });
  }
  void gru_cell_backward(M dx, M dh, M dw_ih, M dw_hh, S db_ih, S db_hh, M scratch, CM dh_out, CM gates, CM x, CM h,
                         CM w_ih, CM w_hh) const {
    count(kRouter, 2.0 * x.rows * w_ih.rows * (x.cols + h.cols) + (dx.empty() ? 0.0 : 2.0 * x.rows * w_ih.rows * x.cols) +
          (dh.empty() ? 0.0 : 2.0 * x.rows * w_hh.rows * h.cols));
    timed(kRouter, [&] {
      Base::gru_cell_backward(dx, dh, dw_ih, dw_hh, db_ih, db_hh, scratch, dh_out, gates, x, h, w_ih, w_hh);
    });
  }
  void route_topk_forward(M weights, MatrixView<token_t> picks, M probs, CM logits, T inv_temp, bool renorm) const {
    timed(kDispatch, [&] { Base::route_topk_forward(weights, picks, probs, logits, inv_temp, renorm); });
  }
  void route_topk_backward(M dlogits, CM dweights, CM weights, CM probs, MatrixView<const token_t> picks, T inv_temp,
                           bool renorm, CS dprobs_col) const {
    timed(kDispatch, [&] {
      Base::route_topk_backward(dlogits, dweights, weights, probs, picks, inv_temp, renorm, dprobs_col);
    });
  }
  void group_by_choice(std::span<token_t> row_token, std::span<token_t> row_slot, std::span<token_t> offsets,
                       MatrixView<const token_t> picks, index_t classes) const {
    timed(kDispatch, [&] { Base::group_by_choice(row_token, row_slot, offsets, picks, classes); });
  }
  void balance_loss_forward(S loss_out, S dprobs_col, CM probs, Tok offsets, index_t k, T coef) const {
    timed(kDispatch, [&] { Base::balance_loss_forward(loss_out, dprobs_col, probs, offsets, k, coef); });
  }
  template <class U>
  void to_host(std::span<U> host, std::span<const U> dev) const {
    timed(kDispatch, [&] { Base::to_host(host, dev); });
  }
  // (query, visible key) pairs of packed attention: keys of the query's sequence up to itself.
  static double packed_pairs(Tok q_tok, Tok k_tok, index_t seq) {
    double pairs = 0;
    for (token_t t : q_tok) {
      if (k_tok.empty()) {
        pairs += double(t % seq + 1);
      } else {
        const auto lo = std::lower_bound(k_tok.begin(), k_tok.end(), token_t(t / seq * seq));
        pairs += double(std::upper_bound(k_tok.begin(), k_tok.end(), t) - lo);
      }
    }
    return pairs;
  }
  void attention_packed_forward(M out, S lse, CM q, CM k, CM v, Tok q_tok, Tok k_tok, index_t seq, index_t heads) const {
    if (st) count(kPackedAttention, 4.0 * q.cols * packed_pairs(q_tok, k_tok, seq));
    timed(kPackedAttention, [&] { Base::attention_packed_forward(out, lse, q, k, v, q_tok, k_tok, seq, heads); });
  }
  void attention_packed_backward(M dq, M dk, M dv, CM dout, CM out, CS lse, CM q, CM k, CM v, Tok q_tok, Tok k_tok,
                                 index_t seq, index_t heads) const {
    if (st) count(kPackedAttention, 10.0 * q.cols * packed_pairs(q_tok, k_tok, seq));
    timed(kPackedAttention, [&] {
      Base::attention_packed_backward(dq, dk, dv, dout, out, lse, q, k, v, q_tok, k_tok, seq, heads);
    });
  }
  // ---- issue 6, depth routing (Mixture-of-Depths): its selection and loss ops count as dispatch ----
  void select_topc_per_sequence(std::span<token_t> idx, CS scores, index_t batch, index_t seq) const {
    timed(kDispatch, [&] { Base::select_topc_per_sequence(idx, scores, batch, seq); });
  }
  void selection_mask(S mask, Tok idx) const { timed(kDispatch, [&] { Base::selection_mask(mask, idx); }); }
  void bce_logits_forward(S out, CS logits, CS targets) const {
    timed(kDispatch, [&] { Base::bce_logits_forward(out, logits, targets); });
  }
  void bce_logits_backward(S dlogits, CS logits, CS targets, T scale) const {
    timed(kDispatch, [&] { Base::bce_logits_backward(dlogits, logits, targets, scale); });
  }
  // ---- end of the depth-routing block ----
  // ---- grouped ops (core/groups.hpp): the routed executors' hot path, timed and counted like the
  // plain ops (the CPU's offsets are host memory, so the counts follow the groups exactly) ----
  using PG = PerGroup<T>;
  using CPG = PerGroup<const T>;
  static double grouped_rows(RowGroups g) { return g.count == 0 ? 0.0 : double(g.offsets[g.count] - g.offsets[0]); }
  // A grouped linear is a router head when it has few outputs (as linear_cat).
  static Cat grouped_cat(index_t out_cols) { return out_cols <= 16 ? kRouter : kLinear; }
  void grouped_linear_forward(M y, CM x, CPG w, CPG b, RowGroups g) const {
    product(grouped_cat(y.cols), "grouped fwd", grouped_rows(g), x.cols, y.cols, g.count,
            2.0 * grouped_rows(g) * x.cols * y.cols, [&] { Base::grouped_linear_forward(y, x, w, b, g); });
  }
  void grouped_linear_backward(M dx, PG dw, PG db, CM dy, CM x, CPG w, RowGroups g, Store dx_store = Store::add) const {
    product(grouped_cat(dy.cols), "grouped bwd", grouped_rows(g), x.cols, dy.cols, g.count,
            backward_products(!dx.empty(), dw.base != nullptr) * grouped_rows(g) * x.cols * dy.cols,
            [&] { Base::grouped_linear_backward(dx, dw, db, dy, x, w, g, dx_store); });
  }
  // The gathered forms (x's rows read through idx inside the GEMM): the same products.
  void grouped_linear_forward(M y, CM x, Tok idx, CPG w, CPG b, RowGroups g, Epilogue ep = Epilogue::none) const {
    product(grouped_cat(y.cols), ep == Epilogue::relu ? "grouped fwd gathered relu" : "grouped fwd gathered",
            grouped_rows(g), x.cols, y.cols, g.count, 2.0 * grouped_rows(g) * x.cols * y.cols,
            [&] { Base::grouped_linear_forward(y, x, idx, w, b, g, ep); });
  }
  void grouped_linear_backward(M dx, PG dw, PG db, CM dy, CM x, Tok idx, CPG w, RowGroups g,
                               Store dx_store = Store::add) const {
    product(grouped_cat(dy.cols), "grouped bwd gathered", grouped_rows(g), x.cols, dy.cols, g.count,
            backward_products(!dx.empty(), dw.base != nullptr) * grouped_rows(g) * x.cols * dy.cols,
            [&] { Base::grouped_linear_backward(dx, dw, db, dy, x, idx, w, g, dx_store); });
  }
  // dy read as scaled rows of a table (the routed experts' W₂ / output products): the same products.
  void grouped_linear_backward(M dx, PG dw, ScaledRows<T> dy, CM x, Tok idx, CPG w, RowGroups g,
                               Store dx_store = Store::add) const {
    const index_t out = dy.table.cols;
    product(grouped_cat(out), "grouped bwd scaled dy", grouped_rows(g), x.cols, out, g.count,
            backward_products(!dx.empty(), dw.base != nullptr) * grouped_rows(g) * x.cols * out,
            [&] { Base::grouped_linear_backward(dx, dw, dy, x, idx, w, g, dx_store); });
  }
  void grouped_layernorm_forward(M out, S mean, S rstd, CM x, CPG gamma, CPG beta, RowGroups g, T eps = T(1e-5)) const {
    timed(kLayerNorm, [&] { Base::grouped_layernorm_forward(out, mean, rstd, x, gamma, beta, g, eps); });
  }
  void grouped_layernorm_backward(M dx, PG dgamma, PG dbeta, CM dout, CM x, CS mean, CS rstd, CPG gamma,
                                  RowGroups g, Store dx_store = Store::add) const {
    timed(kLayerNorm,
          [&] { Base::grouped_layernorm_backward(dx, dgamma, dbeta, dout, x, mean, rstd, gamma, g, dx_store); });
  }
  void grouped_layernorm_forward(M out, S mean, S rstd, CM x, Tok idx, CPG gamma, CPG beta, RowGroups g,
                                 T eps = T(1e-5)) const {
    timed(kLayerNorm, [&] { Base::grouped_layernorm_forward(out, mean, rstd, x, idx, gamma, beta, g, eps); });
  }
  void grouped_layernorm_backward(M dx, PG dgamma, PG dbeta, CM dout, CM x, Tok idx, CS mean, CS rstd, CPG gamma,
                                  RowGroups g, Store dx_store = Store::add) const {
    timed(kLayerNorm,
          [&] { Base::grouped_layernorm_backward(dx, dgamma, dbeta, dout, x, idx, mean, rstd, gamma, g, dx_store); });
  }
  void gelu_forward(M out, CM x, RowGroups g) const { timed(kElementwise, [&] { Base::gelu_forward(out, x, g); }); }
  void gelu_backward(M dx, CM x, CM dout, RowGroups g, Store st = Store::add) const {
    timed(kElementwise, [&] { Base::gelu_backward(dx, x, dout, g, st); });
  }
  void add_forward(M out, CM a, CM b, RowGroups g) const {
    timed(kElementwise, [&] { Base::add_forward(out, a, b, g); });
  }
  void gather_rows(M out, CM in, Tok idx, RowGroups g) const {
    timed_as(kDispatch, rows_shape("gather_rows", out), [&] { Base::gather_rows(out, in, idx, g); });
  }
  void gather_rows(M out, CPG in, index_t in_rows, Tok idx, RowGroups g) const {
    timed(kDispatch, [&] { Base::gather_rows(out, in, in_rows, idx, g); });
  }
  void scatter_add_rows(M out, CM in, Tok idx, CS weights, RowGroups g, Store st = Store::add) const {
    timed_as(kDispatch, rows_shape("scatter_add_rows", in), [&] { Base::scatter_add_rows(out, in, idx, weights, g, st); });
  }
  void scatter_add_rows(PG out, index_t out_rows, CM in, Tok idx, RowGroups g) const {
    timed(kDispatch, [&] { Base::scatter_add_rows(out, out_rows, in, idx, g); });
  }
  void scatter_add_rows_backward(M din, S dweights, CM dout, CM in, Tok idx, CS weights, RowGroups g,
                                 Store st = Store::add) const {
    timed(kDispatch, [&] { Base::scatter_add_rows_backward(din, dweights, dout, in, idx, weights, g, st); });
  }
  void weight_rows_backward(M d, S dwp, CM u, CM a, Tok idx, CS w, RowGroups g, bool relu) const {
    timed_as(kDispatch, rows_shape("weight_rows_backward", u), [&] { Base::weight_rows_backward(d, dwp, u, a, idx, w, g, relu); });
  }
  // Visible (query, key) pairs of a grouped attention: each group's queries against its keys.
  static double grouped_pairs(Tok q_tok, Tok k_tok, RowGroups g, index_t seq) {
    double pairs = 0;
    for (int i = 0; i < g.count; ++i) {
      const auto o = std::size_t(g.offsets[i]), n = std::size_t(g.offsets[i + 1] - g.offsets[i]);
      pairs += packed_pairs(q_tok.subspan(o, n), k_tok.empty() ? k_tok : k_tok.subspan(o, n), seq);
    }
    return pairs;
  }
  void attention_grouped_forward(M out, S lse, CM q, CPG k, CPG v, index_t kv_rows, index_t kv_ld, Tok q_tok, Tok k_tok,
                                 RowGroups g, index_t seq, index_t heads) const {
    if (st) count(kPackedAttention, 4.0 * q.cols * grouped_pairs(q_tok, k_tok, g, seq));
    timed(kPackedAttention, [&] {
      Base::attention_grouped_forward(out, lse, q, k, v, kv_rows, kv_ld, q_tok, k_tok, g, seq, heads);
    });
  }
  void attention_grouped_backward(M dq, PG dk, PG dv, CM dout, CM out, CS lse, CM q, CPG k, CPG v, index_t kv_rows,
                                  index_t kv_ld, Tok q_tok, Tok k_tok, RowGroups g, index_t seq, index_t heads) const {
    if (st) count(kPackedAttention, 10.0 * q.cols * grouped_pairs(q_tok, k_tok, g, seq));
    timed(kPackedAttention, [&] {
      Base::attention_grouped_backward(dq, dk, dv, dout, out, lse, q, k, v, kv_rows, kv_ld, q_tok, k_tok, g, seq, heads);
    });
  }

  void grad_norm(CS grads, T* norm_out) const { timed(kOptim, [&] { Base::grad_norm(grads, norm_out); }); }
  void adamw_step(S params, CS grads, S m, S v, const typename Base::AdamWConfig& cfg, std::int64_t step,
                  const T* gn = nullptr, T max_norm = T(0)) const {
    timed(kOptim, [&] { Base::adamw_step(params, grads, m, v, cfg, step, gn, max_norm); });
  }
};

using Be = TimingBackend<float>;

constexpr Dims dims{.d_model = 256, .heads = 8, .d_ff = 1024, .vocab = 256, .context = 256};
using DenseLM = LM<dims, Dense<8>>;

// ---- --wide: the routing overhead at the paper's ratio of router width to d_model (issue 5) -------
// The authors' GRU router width is 256 on GPT-2 small (d_model 768): a third of d_model. At the default
// dims above (d_model 256) the same router width equals d_model, so the routers cost 3x more relative to
// the modules. --wide runs dense / MoM_E / I / P with GPT-2 small's width (8 layers, byte vocabulary,
// router width 256 as in their scripts).
constexpr Dims wide_dims{.d_model = 768, .heads = 12, .d_ff = 3072, .vocab = 256, .context = 256};
using WideDenseLM = LM<wide_dims, Dense<8>>;
using WideE_LM = LM<wide_dims, Strategy_11411<MoM_E<>>>;
using WideI_LM = LM<wide_dims, Strategy_11411<MoM_I<>>>;
using WideP_LM = LM<wide_dims, Strategy_11411<MoM_P<>>>;

struct Result {
  std::string name;
  std::map<std::string, std::pair<double, double>> shapes;  // --shapes: seconds and FLOPs summed over `reps` steps
  std::map<std::string, double> ops;  // --shapes: the other ops' seconds by name, summed over `reps` steps
  index_t params = 0;
  double step_s = 0, step_min_s = 0, step_max_s = 0;
  double fwd_flops = 0;    // cost model: realised routing (dense: Model::forward_flops)
  double model_train_flops = 0;  // Model::training_flops (dense only; 0 where the cost model has none)
  double exec_flops = 0;   // executed products, forward + backward, per step
  double router_flops = 0; // of which GRU cells and router heads
  double instrumented_s = 0;
  int reps = 1;
  std::array<double, kCats> seconds{};
  // Per step: the optimizer's time (grad_norm + AdamW, measured) and the bytes it moves (grad_norm reads the
  // gradients, AdamW reads parameters, gradients and both moments and writes parameters and moments: 8 floats).
  double optim_s() const { return seconds[kOptim] / reps; }
  double optim_bytes() const { return 8.0 * sizeof(float) * double(params); }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The layer-skip gates start open (bias 1: every token runs every layer). For a representative step the
// bench closes them to bias 0, so that about half the tokens run each layer, as in the trained skip8 (47%).
struct OpenGates {
  static constexpr bool zero_gate_bias = false;
};
struct HalfGates {
  static constexpr bool zero_gate_bias = true;
};

// One model's training step on fixed random tokens (embedding to AdamW), with its state; timed steps report their
// seconds. Lives where it was made (the backend points at its own stats).
template <class Model, class Gates = OpenGates>
struct Stepper {
  Be::Stats stats;
  Be be;
  ModelInstance<Model, Be> m;
  index_t batch, seq;
  std::vector<token_t> tokens;
  cpu::Buffer<float> opt_m, opt_v, norm;
  const cpu::AdamWConfig cfg{.lr = 1e-4f, .weight_decay = 0.1f};
  std::int64_t step = 0;

  static Be with_stats(Be::Stats* s) {
    Be b;
    b.st = s;
    return b;
  }
  Stepper(index_t b, index_t s)
      : be(with_stats(&stats)), m(1, be), batch(b), seq(s), opt_m(m.backend().template alloc<float>(Model::params)),
        opt_v(m.backend().template alloc<float>(Model::params)), norm(m.backend().template alloc<float>(1)) {
    m.reserve(batch, seq);
    if constexpr (Gates::zero_gate_bias)
      for (const ParamInfo& p : Model::layout)
        if (p.name.ends_with("router.b")) m.backend().zero(m.param(p).flat());
    std::mt19937_64 rng(7);
    std::uniform_int_distribution<token_t> dist(0, token_t(Model::dims.vocab - 1));
    tokens.resize(std::size_t(batch * seq + 1));
    for (auto& t : tokens) t = dist(rng);
  }
  Stepper(const Stepper&) = delete;
  void operator()() {
    const index_t n = batch * seq;
    const std::span<const token_t> x(tokens.data(), std::size_t(n)), y(tokens.data() + 1, std::size_t(n));
    auto& mb = m.backend();
    m.zero_grad();
    m.forward(x, y, batch, seq);
    m.backward();
    const auto t_opt = Clock::now();
    mb.grad_norm(m.grads(), norm.data());
    mb.adamw_step(m.params(), m.grads(), opt_m.span(), opt_v.span(), cfg, ++step, norm.data(), 1.0f);
    optim_s = std::chrono::duration<double>(Clock::now() - t_opt).count();
  }
  double optim_s = 0;  // the last step's grad_norm + AdamW (--paired's roofline)
  double timed() {
    const auto t0 = Clock::now();
    (*this)();
    return std::chrono::duration<double>(Clock::now() - t0).count();
  }
  // The cost model's forward FLOPs of the last forward's routing (picks survive backward; for the dense model
  // this is Model::forward_flops).
  double realised() { return double(realised_forward_flops(m)); }
};

bool g_shapes = false;  // --shapes

template <class Model, class Gates = OpenGates>
Result run(const char* name, index_t batch, index_t seq, int reps) {
  auto sp = std::make_unique<Stepper<Model, Gates>>(batch, seq);
  auto& train_step = *sp;
  auto& stats = sp->stats;
  auto realised = [&] { return sp->realised(); };
  double fwd_flops_sum = 0;
  int fwd_count = 0;
  for (int i = 0; i < 2; ++i) train_step();
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    stats.flops = 0;
    stats.cat_flops = {};
    times.push_back(train_step.timed());
    fwd_flops_sum += realised();
    ++fwd_count;
  }
  Result r;
  r.name = name;
  r.params = Model::params;
  r.exec_flops = stats.flops;  // of the last timed step
  r.router_flops = stats.cat_flops[kRouter];
  r.step_s = median(times);
  r.step_min_s = *std::min_element(times.begin(), times.end());
  r.step_max_s = *std::max_element(times.begin(), times.end());
  r.fwd_flops = fwd_flops_sum / fwd_count;
  // (the cost model has backward FLOPs for plain layers only)
  if constexpr (std::is_same_v<Model, DenseLM> || std::is_same_v<Model, WideDenseLM>) r.model_train_flops = double(Model::training_flops(batch, seq));

  stats.on = true;
  stats.by_shape = g_shapes;
  double total = 0;
  for (int i = 0; i < reps; ++i) total += train_step.timed();
  stats.on = false;
  r.instrumented_s = total;
  r.reps = reps;
  r.seconds = stats.seconds;
  r.shapes = stats.shapes;
  r.ops = stats.ops;
  return r;
}

// --paired: the model's step and its reference's (dense8, or dense8-rope for MoEUT) taken in turn, `reps` pairs
// after two warm-up pairs, and the ratio of each pair's two steps: on a machine whose speed drifts between and
// within runs (bench/RESULTS.md: dense medians 925-1417 ms in one session) the ratio of neighbouring steps holds
// where the ratio of two runs' medians does not. Prints the median ratio, its quartiles, the FLOP ratio and the
// median over the FLOP ratio.
template <class Ref, class Model, class Gates = OpenGates>
void paired(const char* name, index_t batch, index_t seq, int reps) {
  auto ref = std::make_unique<Stepper<Ref>>(batch, seq);
  auto mod = std::make_unique<Stepper<Model, Gates>>(batch, seq);
  for (int i = 0; i < 2; ++i) (*ref)(), (*mod)();
  std::vector<double> ratio, t_ref, t_mod, opt_ref, opt_mod;
  double fwd = 0;
  for (int i = 0; i < reps; ++i) {
    // alternate which goes first, so that neither always follows the other's cache state
    const double a = i % 2 ? ref->timed() : 0, b = mod->timed(), c = i % 2 ? 0 : ref->timed();
    t_ref.push_back(a + c), t_mod.push_back(b), ratio.push_back(b / (a + c));
    opt_ref.push_back(ref->optim_s), opt_mod.push_back(mod->optim_s);
    fwd += mod->realised();
  }
  const double fr = fwd / reps / ref->realised();
  // Each pair's step over its roofline: the reference's step less its optimizer, times the FLOP ratio, plus the
  // model's own optimizer (grad_norm + AdamW, bandwidth-bound on the parameters: the issue-29 target where they
  // are many), both optimizers timed inside the pair's steps.
  std::vector<double> over_roof(static_cast<std::size_t>(reps));
  for (std::size_t i = 0; i < std::size_t(reps); ++i)
    over_roof[i] = t_mod[i] / ((t_ref[i] - opt_ref[i]) * fr + opt_mod[i]);
  std::sort(ratio.begin(), ratio.end());
  std::sort(over_roof.begin(), over_roof.end());
  const double med = median(ratio);
  const auto q = [&](const std::vector<double>& v, double f) { return v[std::size_t(f * double(v.size() - 1) + 0.5)]; };
  std::printf("| %s | %.1f | %.1f | %.3f (%.3f-%.3f) | %.3f | %+.1f%% (%+.1f..%+.1f%%) | %.1f / %.1f | %+.1f%% (%+.1f..%+.1f%%) |\n",
              name, 1e3 * median(t_ref), 1e3 * median(t_mod), med, q(ratio, 0.25), q(ratio, 0.75), fr,
              100.0 * (med / fr - 1.0), 100.0 * (q(ratio, 0.25) / fr - 1.0), 100.0 * (q(ratio, 0.75) / fr - 1.0),
              1e3 * median(opt_ref), 1e3 * median(opt_mod), 100.0 * (median(over_roof) - 1.0),
              100.0 * (q(over_roof, 0.25) - 1.0), 100.0 * (q(over_roof, 0.75) - 1.0));
  std::fflush(stdout);
}

// Issue 6, Mixture-of-Depths: 12.5% capacity on blocks 1, 3, 5, 7 (every other block), the dense model's dims;
// and the same with the causal predictor (MoD §3.5, method 2).
using MoD_LM = LM<dims, MoD<8>>;
using MoDCausal_LM = LM<dims, MoD<8, 1, 8, 2, CausalPredictor<32>>>;
// The remaining rows of issue 6: layer-skip / early-exit (learned gates, run target 1/2) and MoDE.
using Skip_LM = LM<dims, LayerSkipping<8>>;
using Exit_LM = LM<dims, EarlyExiting<8>>;
using MoDEInt_LM = LM<dims, MoDEIntegrated<8, 8, 2>>;
using MoDEStaged_LM = LM<dims, MoDEStaged<8, 8, 2>>;

template <class Phi>
using E_LM = LM<dims, Strategy_11411<MoM_E<Router<GRU>, Phi>>>;
template <class Phi>
using I_LM = LM<dims, Strategy_11411<MoM_I<Router<GRU>, Phi>>>;
template <class Phi>
using P_LM = LM<dims, Strategy_11411<MoM_P<Router<GRU>, Phi>>>;

// ---- parameter sharing (issue 6, eq. (10)): the dense executor over a step -> module map; the
// same FLOPs as the dense 8 layers with 1 or 2 stored pairs (e.g. --only dense,share).
template <class Policy, int G>
using Share_LM = LM<dims, Assembly<Router<Share<Policy>>, ModuleSet<MHA<G>, FFN<G>>, K<1>, H<8>>>;

// ---- issue 6: Mixture-of-Experts -----------------------------------------------------------------
using MoE_LM = LM<dims, MoEStack<8, 8, 2>>;            // 8 experts per layer, top-2 (Mixtral)
using MoEShare_LM = LM<dims, MoEShareStack<8, 8, 2>>;  // 8 experts shared by the 8 layers, top-2

// ---- issue 14: MoEUT (SwitchHead + σ-MoE, layer grouping, peri-LayerNorm, rotary positions) -------
// The recipe from the dense model's dims (parameter-matched within 1%); dense with RoPE for reference.
constexpr Dims rope_dims = with_rope(dims);
using DenseRope_LM = LM<rope_dims, Dense<8>>;
using MoEUT_LM = LM<rope_dims, MoEUT<dims, 8, 2>>;    // moeut8: G = 2, ABAB
using MoEUTG8_LM = LM<rope_dims, MoEUT<dims, 8, 8>>;  // moeut8-g8: the non-shared σ-MoE baseline

// ---- issue 15: ModuleFormer (MoA: stick-breaking heads over shared K/V; SMoE; MLP routers; no positions) --
// moduleformer8 of mom-train: 8 heads of 128 and 16 experts of 512 per layer, top-2 each.
using ModuleFormer_LM = LM<without_positions(dims), ModuleFormer<8, MoA<8, 2, 128, 64>, SMoE<16, 2, 512, 64>>>;

// ---- issue 18: DeepSeekMoE (shared + fine-grained experts, sigmoid routing with the selection bias) and
// expert-choice MoE, both at moe8's parameters and FLOPs (mom-train's dsmoe8 and ec8).
using DSMoE_LM = LM<dims, DeepSeekMoEStack<8, 1, 31, 7, 4>>;
using EC_LM = LM<dims, ExpertChoiceMoEStack<8, 8, 2>>;
// Mixture-of-Recursions, middle-cycle (mom-train's mor8 and mor8-r3): dense8's parameters, layers 1-6 recursed.
using MoR_LM = LM<dims, MoRMiddleCycle<6, 2>>;
using MoR3_LM = LM<dims, MoRMiddleCycle<6, 3>>;


}  // namespace

// --under-load: the dense step with 1 and with 2 threads while a child process keeps one core busy,
// and again on the quiet machine (the "threads under load" target: 2 threads within 10% of 1).
int under_load(index_t batch, index_t seq, int reps) {
  const char* spin = std::getenv("GOMP_SPINCOUNT");
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  std::printf("bench_train_step --under-load: dense 8 layers, batch %lld x seq %lld, median of %d steps; "
              "GOMP_SPINCOUNT=%s, OMP_WAIT_POLICY=%s\n\n| machine | 1 thread ms | 2 threads ms | 2 / 1 |\n|---|---:|---:|---:|\n",
              (long long)batch, (long long)seq, reps, spin ? spin : "(unset)", policy ? policy : "(unset)");
  for (const bool busy : {false, true}) {
    pid_t child = -1;
    if (busy) {
      child = fork();
      if (child == 0) {  // the other process: one core's worth of work, until killed
        volatile unsigned long spin = 0;
        for (;;) spin = spin + 1;
      }
      usleep(200000);
    }
    double ms[2];
    for (int t = 1; t <= 2; ++t) {
      omp_set_num_threads(t);
      ms[t - 1] = run<DenseLM>("dense 8 layers", batch, seq, reps).step_s * 1e3;
    }
    if (child > 0) {
      kill(child, SIGKILL);
      waitpid(child, nullptr, 0);
    }
    std::printf("| %s | %.1f | %.1f | %.2f |\n", busy ? "one core busy (another process)" : "quiet", ms[0], ms[1],
                ms[1] / ms[0]);
    std::fflush(stdout);
  }
  return 0;
}

int main(int argc, char** argv) {
  cpu::limit_openmp_spinning(argv);  // GOMP_SPINCOUNT=cpu::kOpenmpSpinCount unless the environment says otherwise
  index_t batch = 16, seq = 256;
  int reps = 7;
  std::string only;
  bool routed_kv = false, wide = false, load = false, pairs = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--batch" && i + 1 < argc) batch = std::atoll(argv[++i]);
    else if (a == "--reps" && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
    else if (a == "--only" && i + 1 < argc) only = argv[++i];
    else if (a == "--routed-kv") routed_kv = true;
    else if (a == "--wide") wide = true;
    else if (a == "--under-load") load = true;
    else if (a == "--paired") pairs = true;
    else if (a == "--shapes") g_shapes = true;
    else {
      std::fprintf(stderr, "usage: %s [--batch B] [--reps R] [--only dense,E,I,P,share,moe,moe-share,moeut,moduleformer,dsmoe,ec,mod,mod-causal,skip,exit,mode-int,mode-staged] [--routed-kv] [--wide] [--under-load] [--paired] [--shapes]\n", argv[0]);
      return 2;
    }
  }
  if (!std::getenv("OMP_NUM_THREADS")) omp_set_num_threads(2);
  if (load) return under_load(batch, seq, reps);
  if (pairs) {
    auto want = [&](const char* k) { return only.empty() || ("," + only + ",").find("," + std::string(k) + ",") != std::string::npos; };
    std::printf("bench_train_step --paired: each routed model's step and its reference's in turn, %d pairs after 2 warm-up "
                "pairs, batch %lld x seq %lld, %d OpenMP threads\n\n", reps, (long long)batch, (long long)seq,
                omp_get_max_threads());
    std::printf("| model | reference step ms (median) | model step ms (median) | step ratio, median of pairs (quartiles) | "
                "FLOP ratio (cost model, realised fwd) | over the FLOP ratio (quartiles) | optimizer ms, reference / model | "
                "over the roofline (quartiles) |\n|---|---:|---:|---:|---:|---:|---:|---:|\n");
    if (want("moeut")) {
      paired<DenseRope_LM, MoEUT_LM>("MoEUT G=2 (moeut8) / dense8-rope", batch, seq, reps);
      paired<DenseRope_LM, MoEUTG8_LM>("sigma-MoE non-shared G=8 (moeut8-g8) / dense8-rope", batch, seq, reps);
    }
    if (want("moduleformer")) paired<DenseLM, ModuleFormer_LM>("ModuleFormer (moduleformer8) / dense8", batch, seq, reps);
    if (want("moe")) paired<DenseLM, MoE_LM>("MoE 8 x 8 experts, top-2 / dense8", batch, seq, reps);
    if (want("dsmoe")) paired<DenseLM, DSMoE_LM>("DeepSeekMoE (dsmoe8) / dense8", batch, seq, reps);
    if (want("ec")) paired<DenseLM, EC_LM>("expert-choice MoE (ec8) / dense8", batch, seq, reps);
    if (want("P")) paired<DenseLM, P_LM<phi::MoM>>("MoM_P (K2H6S) / dense8", batch, seq, reps);
    return 0;
  }

  std::printf("bench_train_step: d_model %lld, heads %lld, d_ff %lld, vocab %lld, seq %lld, batch %lld (%lld tokens/step), "
              "float, %d OpenMP threads, median of %d steps after 2 warm-up steps\n",
              (long long)(wide ? wide_dims : dims).d_model, (long long)(wide ? wide_dims : dims).heads,
              (long long)(wide ? wide_dims : dims).ff(), (long long)dims.vocab,
              (long long)seq, (long long)batch, (long long)(batch * seq), omp_get_max_threads(), reps);
  std::printf("step = zero_grad + forward + backward + grad_norm + AdamW (clip 1.0) over all parameters; "
              "key/value semantics: %s\n\n",
              routed_kv ? "phi::MoMRoutedKV" : "phi::MoM (default)");

  std::vector<Result> res;
  // --only takes a comma-separated list, e.g. --only dense,share
  auto want = [&](const char* k) {
    return only.empty() || ("," + only + ",").find("," + std::string(k) + ",") != std::string::npos;
  };
  if (wide) {  // only dense and MoM_E / I / P (default key/value semantics)
    if (want("dense")) res.push_back(run<WideDenseLM>("dense 8 layers, d 768", batch, seq, reps));
    if (want("E")) res.push_back(run<WideE_LM>("MoM_E (K3H1S), d 768", batch, seq, reps));
    if (want("I")) res.push_back(run<WideI_LM>("MoM_I (K3H2S), d 768", batch, seq, reps));
    if (want("P")) res.push_back(run<WideP_LM>("MoM_P (K2H6S), d 768", batch, seq, reps));
    only = "-";  // nothing else
  }
  if (want("dense")) res.push_back(run<DenseLM>("dense 8 layers", batch, seq, reps));
  if (routed_kv) {
    if (want("E")) res.push_back(run<E_LM<phi::MoMRoutedKV>>("MoM_E (K3H1S), routed KV", batch, seq, reps));
    if (want("I")) res.push_back(run<I_LM<phi::MoMRoutedKV>>("MoM_I (K3H2S), routed KV", batch, seq, reps));
    if (want("P")) res.push_back(run<P_LM<phi::MoMRoutedKV>>("MoM_P (K2H6S), routed KV", batch, seq, reps));
  } else {
    if (want("E")) res.push_back(run<E_LM<phi::MoM>>("MoM_E (K3H1S)", batch, seq, reps));
    if (want("I")) res.push_back(run<I_LM<phi::MoM>>("MoM_I (K3H2S)", batch, seq, reps));
    if (want("P")) res.push_back(run<P_LM<phi::MoM>>("MoM_P (K2H6S)", batch, seq, reps));
  }
  // issue 6: Mixture-of-Experts
  if (want("moe")) res.push_back(run<MoE_LM>("MoE 8 layers x 8 experts, top-2", batch, seq, reps));
  if (want("moe-share")) res.push_back(run<MoEShare_LM>("MoE(share) 8 shared experts, top-2", batch, seq, reps));
  // issue 14: MoEUT (--only moeut)
  if (want("moeut")) {
    res.push_back(run<DenseRope_LM>("dense 8 layers, RoPE (dense8-rope)", batch, seq, reps));
    res.push_back(run<MoEUT_LM>("MoEUT G=2 (moeut8)", batch, seq, reps));
    res.push_back(run<MoEUTG8_LM>("sigma-MoE non-shared G=8 (moeut8-g8)", batch, seq, reps));
  }

  // issue 15: ModuleFormer (--only moduleformer)
  if (want("moduleformer")) res.push_back(run<ModuleFormer_LM>("ModuleFormer (moduleformer8)", batch, seq, reps));
  if (want("dsmoe")) res.push_back(run<DSMoE_LM>("DeepSeekMoE 1 shared + 31 routed of d_ff/4, top-7 (dsmoe8)", batch, seq, reps));
  if (want("ec")) res.push_back(run<EC_LM>("expert-choice MoE, 8 experts, capacity factor 2 (ec8)", batch, seq, reps));
  if (want("mor")) {
    res.push_back(run<MoR_LM>("MoR middle-cycle, 6 shared layers x 2 recursions (mor8)", batch, seq, reps));
    res.push_back(run<MoR3_LM>("MoR middle-cycle, 6 shared layers x 3 recursions (mor8-r3)", batch, seq, reps));
  }

  // Parameter sharing (issue 6).
  if (want("share")) {
    res.push_back(run<Share_LM<All, 1>>("share All (1 pair x 8)", batch, seq, reps));
    res.push_back(run<Share_LM<Cycle<2>, 2>>("share Cycle<2> (ABAB..)", batch, seq, reps));
  }

  // Issue 6, depth routing (--only mod / mod-causal).
  if (want("mod")) res.push_back(run<MoD_LM>("MoD 12.5%, every other block", batch, seq, reps));
  if (want("mod-causal")) res.push_back(run<MoDCausal_LM>("MoD 12.5% + causal predictor", batch, seq, reps));
  if (want("skip")) res.push_back(run<Skip_LM, HalfGates>("layer-skip (gate bias 0: ~half run)", batch, seq, reps));
  if (want("exit")) res.push_back(run<Exit_LM, HalfGates>("early-exit (gate bias 0)", batch, seq, reps));
  if (want("mode-int")) res.push_back(run<MoDEInt_LM>("MoDE integrated, 8 experts + no-op, top-2", batch, seq, reps));
  if (want("mode-staged")) res.push_back(run<MoDEStaged_LM>("MoDE staged, MoD 12.5% then 8 experts top-2", batch, seq, reps));

  const Result* dense = res.empty() || res[0].name.rfind("dense", 0) != 0 ? nullptr : &res[0];
  const double tokens = double(batch * seq);
  std::printf("| model | params | step ms (median; min-max) | tokens/s | step ratio | FLOP ratio (cost model, realised fwd) "
              "| exec. train FLOP ratio | ratio / FLOP ratio | router | dispatch | routing overhead |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const Result& r : res) {
    const double share_router = r.seconds[kRouter] / r.instrumented_s, share_disp = r.seconds[kDispatch] / r.instrumented_s;
    char ratio[32] = "–", fratio[32] = "–", eratio[32] = "–", rel[32] = "–";
    if (dense) {
      const double sr = r.step_s / dense->step_s, fr = r.fwd_flops / dense->fwd_flops;
      std::snprintf(ratio, sizeof ratio, "%.2f", sr);
      std::snprintf(fratio, sizeof fratio, "%.2f", fr);
      std::snprintf(eratio, sizeof eratio, "%.2f", r.exec_flops / dense->exec_flops);
      std::snprintf(rel, sizeof rel, "%+.0f%%", 100.0 * (sr / fr - 1.0));
    }
    std::printf("| %s | %.2fM | %.1f (%.1f-%.1f) | %.0f | %s | %s | %s | %s | %.1f%% | %.1f%% | %.1f%% |\n",
                r.name.c_str(), double(r.params) * 1e-6, r.step_s * 1e3, r.step_min_s * 1e3, r.step_max_s * 1e3,
                tokens / r.step_s, ratio, fratio, eratio, rel, 100 * share_router, 100 * share_disp,
                100 * (share_router + share_disp));
  }

  std::printf("\nTime per op category, share of the instrumented steps (the rest: host glue and untimed ops):\n\n| model |");
  for (const char* c : kCatName) std::printf(" %s |", c);
  std::printf(" other |\n|---|");
  for (int c = 0; c < kCats + 1; ++c) std::printf("---:|");
  std::printf("\n");
  for (const Result& r : res) {
    std::printf("| %s |", r.name.c_str());
    double sum = 0;
    for (int c = 0; c < kCats; ++c) sum += r.seconds[c], std::printf(" %.1f%% |", 100 * r.seconds[c] / r.instrumented_s);
    std::printf(" %.1f%% |\n", 100 * (1 - sum / r.instrumented_s));
  }

  // Issue 29's roofline for a model whose optimizer traffic is a visible share of its step (ModuleFormer has 6×
  // dense8's parameters): the dense step's time outside the optimizer scaled by the FLOP ratio, plus this model's
  // optimizer at its measured bandwidth. For a model with dense's parameter count it is the FLOP ratio's target.
  if (dense) {
    std::printf("\nRoofline: (dense step - dense optimizer) x FLOP ratio + the model's optimizer (grad_norm + AdamW: "
                "8 floats per parameter, measured):\n\n| model | optimizer ms | optimizer GB/s | roofline ms | step / "
                "roofline |\n|---|---:|---:|---:|---:|\n");
    for (const Result& r : res) {
      const double fr = r.fwd_flops / dense->fwd_flops;
      const double roof = (dense->step_s - dense->optim_s()) * fr + r.optim_s();
      std::printf("| %s | %.1f | %.1f | %.1f | %+.0f%% |\n", r.name.c_str(), r.optim_s() * 1e3,
                  r.optim_bytes() / r.optim_s() * 1e-9, roof * 1e3, 100.0 * (r.step_s / roof - 1.0));
    }
  }

  std::printf("\nExecuted FLOPs per step (forward + backward products):\n");
  for (const Result& r : res)
    std::printf("  %-28s %8.2f GFLOP  -> %6.1f GFLOP/s; routers (GRU + head) %6.2f GFLOP = %4.1f%% of the FLOPs\n",
                r.name.c_str(), r.exec_flops * 1e-9, r.exec_flops / r.step_s * 1e-9, r.router_flops * 1e-9,
                100 * r.router_flops / r.exec_flops);
  // --shapes: where each model's products go (time per step, rate), slowest share first.
  for (const Result& r : g_shapes ? res : std::vector<Result>{}) {
    std::printf("\nProducts of %s by kind and shape (per step; instrumented steps):\n\n| product | ms | GFLOP/s | share of "
                "step |\n|---|---:|---:|---:|\n", r.name.c_str());
    std::vector<std::pair<std::string, std::pair<double, double>>> v(r.shapes.begin(), r.shapes.end());
    std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
    for (const auto& [k, e] : v)
      std::printf("| %s | %.2f | %.0f | %.1f%% |\n", k.c_str(), 1e3 * e.first / r.reps, e.second / e.first * 1e-9,
                  100 * e.first / r.instrumented_s);
    std::printf("\nOther ops of %s by name (per step; instrumented steps):\n\n| op | ms | share of step |\n|---|---:|---:|\n",
                r.name.c_str());
    std::vector<std::pair<std::string, double>> o(r.ops.begin(), r.ops.end());
    std::sort(o.begin(), o.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
    for (const auto& [k, sec] : o)
      std::printf("| %s | %.2f | %.1f%% |\n", k.c_str(), 1e3 * sec / r.reps, 100 * sec / r.instrumented_s);
  }
  if (dense && dense->model_train_flops > 0) {  // dense8 (or --wide's) run: not dense8-rope alone (--only moeut)
    const double gfs = dense->model_train_flops / dense->step_s * 1e-9;
    std::printf("\ndense: Model::training_flops(%lld, %lld) = %.3f GFLOP (executed count %.3f GFLOP) -> %.1f GFLOP/s = "
                "%.0f%% of the %.1f GFLOP/s sgemm peak (bench/RESULTS.md)\n",
                (long long)batch, (long long)seq, dense->model_train_flops * 1e-9, dense->exec_flops * 1e-9, gfs,
                100 * gfs / kSgemmPeak, kSgemmPeak);
  }
  return 0;
}

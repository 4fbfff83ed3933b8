#pragma once
// mom::cpu::Backend<T>: the object module code calls every op through. It owns nothing but the
// buffers it hands out; each member forwards to the op of the same name in mom::cpu with the
// scalar fixed to T (so MatrixView<T> arguments bind to MatrixView<const T> parameters). The ops are
// declared here and defined outside the class (backend_impl.hpp), so that a program can compile them
// once: `template struct mom::cpu::Backend<float>;` in one translation unit, `extern template` in the
// others. A CUDA backend offers the same members over device memory.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <new>
#include <span>
#include <utility>

#include "mom/backend/backend_concept.hpp"
#include "mom/backend/cpu/activation.hpp"
#include "mom/backend/cpu/affinity.hpp"
#include "mom/backend/cpu/expert_choice.hpp"
#include "mom/backend/cpu/attention.hpp"
#include "mom/backend/cpu/cross_entropy.hpp"
#include "mom/backend/cpu/decode.hpp"
#include "mom/backend/cpu/depth.hpp"
#include "mom/backend/cpu/dispatch.hpp"
#include "mom/backend/cpu/embedding.hpp"
#include "mom/backend/cpu/gemm.hpp"
#include "mom/backend/cpu/grouped.hpp"
#include "mom/backend/cpu/gru.hpp"
#include "mom/backend/cpu/layernorm.hpp"
#include "mom/backend/cpu/linear.hpp"
#include "mom/backend/cpu/optim.hpp"
#include "mom/backend/cpu/rope.hpp"
#include "mom/backend/cpu/routing.hpp"
#include "mom/backend/cpu/stick_breaking.hpp"
#include "mom/backend/cpu/topk.hpp"
#include "mom/core/check.hpp"
#include "mom/core/tensor.hpp"

namespace mom::cpu {

// An owning, 64-byte aligned (one cache line / one AVX-512 register), zero-initialised array.
// Move-only; the memory is released on destruction.
template <class U>
class Buffer {
 public:
  static constexpr std::size_t alignment = 64;

  Buffer() = default;
  explicit Buffer(index_t n) : size_(n) {
    MOM_CHECK(n >= 0, "Buffer: negative size ", n);
    if (n == 0) return;
    data_ = static_cast<U*>(::operator new(static_cast<std::size_t>(n) * sizeof(U), std::align_val_t{alignment}));
    std::memset(static_cast<void*>(data_), 0, static_cast<std::size_t>(n) * sizeof(U));
  }
  Buffer(Buffer&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { release(); }

  U* data() { return data_; }
  const U* data() const { return data_; }
  index_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  U& operator[](index_t i) { return data_[i]; }
  const U& operator[](index_t i) const { return data_[i]; }
  U* begin() { return data_; }
  U* end() { return data_ + size_; }
  const U* begin() const { return data_; }
  const U* end() const { return data_ + size_; }

  std::span<U> span() { return {data_, static_cast<std::size_t>(size_)}; }
  std::span<const U> span() const { return {data_, static_cast<std::size_t>(size_)}; }
  operator std::span<U>() { return span(); }
  operator std::span<const U>() const { return span(); }
  // The buffer (or its first rows*cols elements) as a row-major matrix.
  MatrixView<U> view(index_t rows, index_t cols) {
    MOM_CHECK(rows >= 0 && cols >= 0 && rows * cols <= size_, "Buffer::view: [", rows, "x", cols, "] exceeds ", size_,
              " elements");
    return {data_, rows, cols};
  }
  MatrixView<const U> view(index_t rows, index_t cols) const { return const_cast<Buffer*>(this)->view(rows, cols); }

 private:
  void release() {
    if (data_) ::operator delete(static_cast<void*>(data_), std::align_val_t{alignment});
    data_ = nullptr;
    size_ = 0;
  }
  U* data_ = nullptr;
  index_t size_ = 0;
};

template <class T>
struct Backend {
  using scalar = T;
  template <class U>
  using Buffer = cpu::Buffer<U>;
  // Host memory the backend copies from fastest (the CUDA backend's is pinned); here plain host memory.
  template <class U>
  using HostBuffer = cpu::Buffer<U>;
  template <class U>
  using View = MatrixView<U>;
  using Trans = cpu::Trans;
  using AdamWConfig = cpu::AdamWConfig;
  using M = MatrixView<T>;
  using CM = MatrixView<const T>;
  using S = std::span<T>;
  using CS = std::span<const T>;
  using Tok = std::span<const token_t>;
  using PG = PerGroup<T>;
  using CPG = PerGroup<const T>;

  static constexpr const char* name = "cpu";
  // Backend memory is host memory: the host reads a Buffer directly (infer::Decoder's logits).
  static constexpr bool host_memory = true;

  // ---- memory --------------------------------------------------------------
  template <class U = T>
  Buffer<U> alloc(index_t n) const { return Buffer<U>(n); }
  template <class U>
  HostBuffer<U> alloc_host(index_t n) const { return HostBuffer<U>(n); }
  template <class U>
  void zero(std::span<U> s) const {
    if (!s.empty()) std::memset(static_cast<void*>(s.data()), 0, s.size_bytes());
  }
  void zero(M m) const {
    if (m.contiguous()) return zero(m.flat());
    for (index_t r = 0; r < m.rows; ++r) std::fill_n(m.row(r), m.cols, T(0));
  }
  template <class U>
  void fill(std::span<U> s, U value) const { std::fill(s.begin(), s.end(), value); }
  template <class U>
  void copy(std::span<U> dst, std::span<const U> src) const {
    MOM_CHECK(dst.size() == src.size(), "copy: dst has ", dst.size(), " elements, src has ", src.size());
    if (!src.empty()) std::memmove(static_cast<void*>(dst.data()), src.data(), src.size_bytes());
  }
  template <class U>
  void copy(std::span<U> dst, std::span<U> src) const { copy(dst, std::span<const U>(src)); }
  // A matrix into one of the same shape, either of them strided (a column block of a wider matrix).
  void copy(M dst, CM src) const {
    MOM_CHECK(dst.rows == src.rows && dst.cols == src.cols, "copy: dst ", shape(dst), " and src ", shape(src), " differ");
    if (dst.contiguous() && src.contiguous()) return copy(dst.flat(), std::span<const T>(src.data, std::size_t(src.size())));
#pragma omp parallel for schedule(static) if (dst.size() > (1 << 16))
    for (index_t r = 0; r < dst.rows; ++r) {
      const T* s = src.row(r);
      T* d = dst.row(r);
      if (dst.cols <= detail::narrow_row)  // a column block of a selection's logits (4 of 16 columns): no call a row
        for (index_t c = 0; c < dst.cols; ++c) d[c] = s[c];
      else
        std::copy_n(s, dst.cols, d);
    }
  }
  // Host transfers: plain copies on the CPU; a device backend moves memory across the bus.
  template <class U>
  void to_host(std::span<U> host, std::span<const U> dev) const { copy(host, dev); }
  template <class U>
  void from_host(std::span<U> dev, std::span<const U> host) const { copy(dev, host); }
  // Read one scalar back (e.g. the loss or a norm).
  template <class U>
  U read(const U* p) const { return *p; }

  // ---- ops -----------------------------------------------------------------
  void gemm(M C, CM A, Trans ta, CM B, Trans tb, T alpha = T(1), T beta = T(0)) const;
  void linear_forward(M y, CM x, CM w, CS b) const;
  void linear_backward(M dx, M dw, S db, CM dy, CM x, CM w, Store dx_store = Store::add) const;

  void embedding_forward(M out, Tok tokens, CM wte, CM wpe, index_t seq) const;
  void embedding_forward(M out, Tok tokens, CM wte, CM wpe, std::span<const index_t> pos) const;  // row r at pos[r]
  void embedding_backward(M dwte, M dwpe, CM dout, Tok tokens, index_t seq) const;

  // Incremental decoding (cpu/decode.hpp): the key/value cache of one attention use.
  void kv_write(M k_cache, M v_cache, CM qkv, std::span<const index_t> slot, std::span<const index_t> pos,
                index_t max_len) const;
  void attention_decode(M out, CM qkv, CM k_cache, CM v_cache, std::span<const index_t> slot,
                        std::span<const index_t> pos, index_t max_len, index_t heads) const;
  void stick_breaking_decode(M out, CM qkv, CM k_cache, CM v_cache, std::span<const index_t> slot,
                             std::span<const index_t> pos, index_t max_len, index_t heads, index_t kv_heads) const;

  void layernorm_forward(M out, S mean, S rstd, CM x, CS gamma, CS beta, T eps = T(1e-5)) const;
  void layernorm_backward(M dx, S dgamma, S dbeta, CM dout, CM x, CS mean, CS rstd, CS gamma) const;

  void gelu_forward(S out, CS x) const;
  void gelu_backward(S dx, CS x, CS dout, Store st = Store::add) const;
  void relu_forward(S out, CS x) const;
  void relu_backward(S dx, CS x, CS dout, Store st = Store::add) const;
  void add_forward(S out, CS a, CS b) const;
  void axpy(S y, T alpha, CS x) const;
  void scale(S y, T alpha) const;

  void cross_entropy_forward(S loss_out, S lse, CM logits, Tok targets, token_t ignore_index = -1) const;
  void cross_entropy_backward(M dlogits, CM logits, CS lse, Tok targets, T dloss, token_t ignore_index = -1) const;

  void attention_forward(M out, S lse, CM qkv, index_t batch, index_t seq, index_t heads) const;
  void attention_backward(M dqkv, CM dout, CM out, CS lse, CM qkv, index_t batch, index_t seq, index_t heads) const;
  // Stick-breaking attention (ModuleFormer, arXiv 2306.04640; cpu/stick_breaking.hpp): saves nothing.
  // kv_heads key/value heads shared by heads / kv_heads query heads each (= heads: one per query head).
  void stick_breaking_forward(M out, CM qkv, index_t batch, index_t seq, index_t heads, index_t kv_heads) const;
  void stick_breaking_backward(M dqkv, CM dout, CM out, CM qkv, index_t batch, index_t seq, index_t heads,
                               index_t kv_heads) const;

  // Rotary position embedding, in place (cpu/rope.hpp): every row at pos[r] (or r mod seq when pos is
  // empty), or the grouped rows at idx[r] mod seq.
  void rope_forward(M x, std::span<const index_t> pos, index_t seq, index_t head_dim, T base) const;
  void rope_backward(M dx, std::span<const index_t> pos, index_t seq, index_t head_dim, T base) const;
  void rope_forward(M x, Tok idx, index_t seq, index_t head_dim, T base, RowGroups g) const;
  void rope_backward(M dx, Tok idx, index_t seq, index_t head_dim, T base, RowGroups g) const;

  void gather_rows(M out, CM in, Tok idx) const;
  void scatter_add_rows(M out, CM in, Tok idx, CS weights = {}, Store st = Store::add) const;
  void scatter_add_rows_backward(M din, S dweights, CM dout, CM in, Tok idx, CS weights = {},
                                 Store st = Store::add) const;

  void topk_rows(M values, MatrixView<token_t> indices, CM x) const;
  void topk_rows_backward(M dx, CM dvalues, MatrixView<const token_t> indices) const;
  void softmax_rows(M y, CM x, T scale = T(1)) const;
  void softmax_rows_backward(M dx, CM dy, CM y, T scale = T(1)) const;

  void gru_cell_forward(M h_out, M gates, CM x, CM h, CM w_ih, CM w_hh, CS b_ih, CS b_hh) const;
  void gru_cell_backward(M dx, M dh, M dw_ih, M dw_hh, S db_ih, S db_hh, M scratch, CM dh_out, CM gates, CM x, CM h,
                         CM w_ih, CM w_hh) const;

  // Routed assembly (Mixture-of-Modules): router top-K, balance loss, grouping, packed attention.
  void route_topk_forward(M weights, MatrixView<token_t> picks, M probs, CM logits, T inv_temp, bool renormalise) const;
  void route_topk_backward(M dlogits, CM dweights, CM weights, CM probs, MatrixView<const token_t> picks, T inv_temp,
                           bool renormalise, CS dprobs_col) const;
  void group_by_choice(std::span<token_t> row_token, std::span<token_t> row_slot, std::span<token_t> offsets,
                       MatrixView<const token_t> picks, index_t classes) const;
  void affinity_topk_forward(M weights, MatrixView<token_t> picks, M probs, CM scores, CS bias, index_t shared,
                             index_t groups, index_t top_groups, bool renormalise, T scale) const;
  void affinity_topk_backward(M dscores, CM dweights, CM scores, MatrixView<const token_t> picks, index_t shared,
                              bool renormalise, T scale, CS dprobs_col) const;
  void expert_load_add(S load, Tok offsets) const;
  void bias_balance_update(S bias, CS load, T rate) const;
  void sequence_balance_forward(S loss_out, M dscores, M freq, CM scores, MatrixView<const token_t> picks, index_t shared,
                                index_t seq, T coef) const;
  void expert_choice_forward(M weights, MatrixView<token_t> picks, CM probs, index_t capacity) const;
  void expert_choice_backward(M dprobs, CM dweights, MatrixView<const token_t> picks) const;
  void balance_loss_forward(S loss_out, S dprobs_col, CM probs, Tok offsets, index_t k, T coef) const;
  void router_z_loss_forward(S loss_out, M dlogits, CM logits, T inv_temp, T coef) const;
  void selection_entropy_forward(S loss_out, M dlogits, CM logits, index_t batch, index_t seq, T coef,
                                 T cond_coef = T(0)) const;
  void attention_packed_forward(M out, S lse, CM q, CM k, CM v, Tok q_tok, Tok k_tok, index_t seq, index_t heads) const;
  void attention_packed_backward(M dq, M dk, M dv, CM dout, CM out, CS lse, CM q, CM k, CM v, Tok q_tok, Tok k_tok,
                                 index_t seq, index_t heads) const;

  // Grouped ops (core/groups.hpp, backend/cpu/grouped.hpp): rows split into groups by offsets in
  // backend memory, each group with its own parameters; the routed executors' hot path.
  void grouped_linear_forward(M y, CM x, CPG w, CPG b, RowGroups g) const;
  // The gathered forms: packed row r reads x's row idx[r] inside the GEMM (no gathered copy). The forward's
  // Epilogue::relu stores max(y, 0) (optional form: routing/expert_mlp.hpp's FusesRelu).
  void grouped_linear_forward(M y, CM x, Tok idx, CPG w, CPG b, RowGroups g, Epilogue ep = Epilogue::none) const;
  void grouped_linear_backward(M dx, PG dw, PG db, CM dy, CM x, Tok idx, CPG w, RowGroups g,
                               Store dx_store = Store::add) const;
  void grouped_linear_backward(M dx, PG dw, PG db, CM dy, CM x, CPG w, RowGroups g, Store dx_store = Store::add) const;
  // dy not stored (ScaledRows, core/groups.hpp: scale[r] · table[index[r]]), read inside the products; x's rows
  // through idx (empty: x's own). An optional capability (routing/dispatch.hpp, ReadsScaledRows).
  void grouped_linear_backward(M dx, PG dw, ScaledRows<T> dy, CM x, Tok idx, CPG w, RowGroups g,
                               Store dx_store = Store::add) const;
  void grouped_layernorm_forward(M out, S mean, S rstd, CM x, CPG gamma, CPG beta, RowGroups g,
                                 T eps = T(1e-5)) const;
  void grouped_layernorm_backward(M dx, PG dgamma, PG dbeta, CM dout, CM x, CS mean, CS rstd, CPG gamma,
                                  RowGroups g, Store dx_store = Store::add) const;
  // The same over gathered rows: packed row r normalises x[idx[r]] (the gathered copy never written; empty idx: x's
  // own rows).
  void grouped_layernorm_forward(M out, S mean, S rstd, CM x, Tok idx, CPG gamma, CPG beta, RowGroups g,
                                 T eps = T(1e-5)) const;
  void grouped_layernorm_backward(M dx, PG dgamma, PG dbeta, CM dout, CM x, Tok idx, CS mean, CS rstd, CPG gamma,
                                  RowGroups g, Store dx_store = Store::add) const;
  void gelu_forward(M out, CM x, RowGroups g) const;
  void gelu_backward(M dx, CM x, CM dout, RowGroups g, Store st = Store::add) const;
  void add_forward(M out, CM a, CM b, RowGroups g) const;
  void axpy(M y, T alpha, CM x, RowGroups g) const;
  void zero_rows(M m, RowGroups g) const;
  void gather_rows(M out, CM in, Tok idx, RowGroups g) const;
  void gather_rows(M out, CPG in, index_t in_rows, Tok idx, RowGroups g) const;
  void scatter_add_rows(M out, CM in, Tok idx, CS weights, RowGroups g, Store st = Store::add) const;
  void scatter_add_rows(PG out, index_t out_rows, CM in, Tok idx, RowGroups g) const;
  void scatter_add_rows_backward(M din, S dweights, CM dout, CM in, Tok idx, CS weights, RowGroups g,
                                 Store st = Store::add) const;
  // The routed rows' weights applied after their product (backend/cpu/dispatch.hpp): an optional capability
  // (routing/dispatch.hpp, WeighsAfterProducts).
  void weight_rows_backward(M d, S dwp, CM u, CM a, Tok idx, CS w, RowGroups g, bool relu) const;
  void attention_grouped_forward(M out, S lse, CM q, CPG k, CPG v, index_t kv_rows, index_t kv_ld, Tok q_tok, Tok k_tok,
                                 RowGroups g, index_t seq, index_t heads) const;
  void attention_grouped_backward(M dq, PG dk, PG dv, CM dout, CM out, CS lse, CM q, CPG k, CPG v, index_t kv_rows,
                                  index_t kv_ld, Tok q_tok, Tok k_tok, RowGroups g, index_t seq, index_t heads) const;

  // Depth routing (Mixture-of-Depths, layer-skip, early-exit; backend/cpu/depth.hpp).
  void select_topc_per_sequence(std::span<token_t> idx, CS scores, index_t batch, index_t seq) const;
  void selection_mask(S mask, Tok idx) const;
  void skip_select(std::span<token_t> idx, std::span<token_t> count, std::span<token_t> alive, CS logits) const;
  void depth_choice_rows(S decision, S coef, Tok picks, CS weights, index_t r) const;
  void depth_choice_rows_backward(S dweights, CS dcoef, Tok picks, index_t r) const;
  void sigmoid_forward(S out, CS x) const;
  void sigmoid_backward(S dx, CS out, CS dout) const;
  void bce_logits_forward(S out, CS logits, CS targets) const;
  void bce_logits_backward(S dlogits, CS logits, CS targets, T scale) const;

  void grad_norm(CS grads, T* norm_out) const;
  void adamw_step(S params, CS grads, S m, S v, const AdamWConfig& cfg, std::int64_t step,
                  const T* grad_norm = nullptr, T max_norm = T(0)) const;
};

}  // namespace mom::cpu

#include "mom/backend/cpu/backend_impl.hpp"

static_assert(mom::Backend<mom::cpu::Backend<float>> && mom::Backend<mom::cpu::Backend<double>>,
              "cpu::Backend must satisfy mom::Backend (backend/backend_concept.hpp)");

#pragma once
// ModelInstance<LM<dims, Arch>, Backend>: a model with its parameters, gradients and step
// workspace on a backend. Created by Model::make<Backend>(seed).
//
//   auto m = Model::make<cpu::Backend<float>>(seed);   // GPT-2 init, grads zero
//   m.reserve(batch, seq);                             // the only allocation of a training run
//   T loss = m.forward(tokens, targets, batch, seq);   // mean cross-entropy (0 without targets)
//   m.backward();                                      // grads += d loss / d params
//   m.zero_grad();
//
// Parameters and gradients are single flat buffers in Model::layout order.
#include <array>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "mom/core/check.hpp"
#include "mom/models/lm.hpp"

namespace mom {

template <class Model, class Be>
class ModelInstance {
 public:
  using model_type = Model;
  using backend_type = Be;
  using scalar = typename Be::scalar;
  using T = scalar;
  static constexpr Dims dims = Model::dims;
  static constexpr index_t d = dims.d_model;
  static constexpr index_t vocab = dims.vocab;
  // The logits' row stride in the workspace: vocab rounded up to the backend's row_align (backend_concept.hpp; the
  // CUDA backend's GEMMs want 16-byte aligned rows: GPT-2's 50257 is laid out 50304 wide there, 50257 on the CPU).
  static constexpr index_t logits_ld = padded_ld<Be>(vocab);

  // An invalid model type has already failed its own check (each rule of LM, Assembly, phi, the router policy,
  // the module set and Executor is a static_assert that fires when the type is used), and the model then stands on
  // placeholder shapes, so making an instance of it adds no second error.

  // Parameters initialised as GPT-2: weights N(0, 0.02), residual projections (attn.w_proj,
  // mlp.w_proj) N(0, 0.02 / sqrt(2 * depth)), biases 0, LayerNorm gains 1. Same seed, same
  // parameters, bit for bit (mt19937_64; values drawn in layout order on the host).
  explicit ModelInstance(std::uint64_t seed, Be be = Be{}) : be_(std::move(be)) {
    static_assert(runs_on_backend(typename Model::core::executors{}),
                  "mom::LM::make<Be>: a part's executor lacks forward/backward for this backend (mom::AssemblyExecutorOn)");
    // Every tensor name once (checkpoints address tensors by name): checked once per model type.
    static const std::string_view duplicate = first_duplicate_name(Model::layout);
    MOM_CHECK(duplicate.empty(), "mom::LM::make: two tensors of this model are named '", std::string(duplicate),
              "': the modules of one layer need distinct tensor names (a feed-forward module used as attention, "
              "MHA<N, Ffn>, names its LayerNorm like the FFN beside it; give your module a single_role, "
              "modules/module.hpp)");
    params_ = be_.template alloc<T>(Model::params);
    grads_ = be_.template alloc<T>(Model::params);
    std::vector<T> host(static_cast<std::size_t>(Model::params));
    std::mt19937_64 rng(seed);
    const double residual_std = 0.02 / std::sqrt(2.0 * Model::depth);
    for (std::size_t i = 0; i < Model::tensor_count; ++i) {
      const ParamInfo& p = Model::layout[i];
      const Init init = Model::core::specs[i].init;
      T* t = host.data() + p.offset;
      if (init == Init::Zero || init == Init::One) {
        for (index_t j = 0; j < p.size(); ++j) t[j] = init == Init::One ? T(1) : T(0);
      } else {
        std::normal_distribution<double> normal(0.0, init == Init::ResidualNormal ? residual_std : 0.02);
        for (index_t j = 0; j < p.size(); ++j) t[j] = static_cast<T>(normal(rng));
      }
    }
    be_.from_host(params_.span(), std::span<const T>(host));
    zero_grad();
  }

  // Sizes the workspace for up to `batch` sequences of up to `seq` tokens from the cost
  // model (Model::activation_elements). forward/backward never allocate.
  void reserve(index_t batch, index_t seq) {
    MOM_CHECK(batch > 0 && seq > 0, "reserve: batch ", batch, " and seq ", seq, " must be > 0");
    MOM_CHECK(seq <= dims.context, "reserve: seq ", seq, " exceeds the model's context ", dims.context);
    guards_.clear();
    plan_ = Model::core::plan(batch, seq, &guards_, logits_ld);
    ws_ = be_.template alloc<T>(plan_.total);
    for (const index_t at : guards_) be_.fill(std::span<T>(ws_.data() + at, std::size_t(workspace_guard)), guard_value<T>);
    tokens_ = be_.template alloc<token_t>(batch * seq);
    targets_ = be_.template alloc<token_t>(batch * seq);
    state_ = State::Reserved;
    has_loss_ = false;
  }

  // Runs the model on tokens [batch * seq] (batch sequences of seq tokens, row-major). With
  // targets (same size; -1 = ignored) returns the mean cross-entropy and enables backward();
  // with empty targets returns 0 and only the logits are computed.
  T forward(std::span<const token_t> tokens, std::span<const token_t> targets, index_t batch, index_t seq) {
    forward_async(tokens, targets, batch, seq);
    return targets.empty() ? T(0) : loss();
  }

  // The loss of the last forward with targets (cross-entropy + the parts' auxiliary losses): one
  // read from the backend, the only point where the host waits for the forward.
  T loss() const {
    MOM_CHECK(has_loss_, "loss: needs a forward with targets (since the last reserve)");
    return be_.read(ws_.data() + plan_.objective);
  }
  // The same value left in backend memory (a trainer sums it over micro-batches on the device).
  std::span<const T> loss_data() const { return {ws_.data() + plan_.objective, 1}; }
  // The cross-entropy alone (the mean over the targets) of the last forward with targets: what
  // validation compares across architectures, whose auxiliary losses differ in size and sign.
  T cross_entropy() const {
    MOM_CHECK(has_loss_, "cross_entropy: needs a forward with targets (since the last reserve)");
    return be_.read(ws_.data() + plan_.loss);
  }

  // forward without reading anything back: it only enqueues work on a device backend, so a
  // training step (forward_async, backward, the optimizer) never waits for the device.
  void forward_async(std::span<const token_t> tokens, std::span<const token_t> targets, index_t batch, index_t seq) {
    MOM_CHECK(state_ != State::Empty, "forward: call reserve(batch, seq) first");
    MOM_CHECK(batch > 0 && seq > 0 && batch * seq <= plan_.batch * plan_.seq && seq <= plan_.seq, "forward: batch ",
              batch, " x seq ", seq, " does not fit the reserved ", plan_.batch, " x ", plan_.seq);
    MOM_CHECK(ssize(tokens) == batch * seq, "forward: ", tokens.size(), " tokens for batch ", batch, " x seq ", seq);
    MOM_CHECK(targets.empty() || targets.size() == tokens.size(), "forward: ", targets.size(), " targets for ",
              tokens.size(), " tokens");
    const index_t n = batch * seq;
    batch_ = batch;
    seq_ = seq;
    const GuardScope guarded(ws_.data(), guards_);
    be_.from_host(std::span<token_t>(tokens_.data(), tokens.size()), tokens);
    T* ws = ws_.data();
    const T* p = params_.data();

    const MatrixView<T> x0{ws + plan_.res0, n, d};
    be_.embedding_forward(x0, std::span<const token_t>(tokens_.data(), tokens.size()), param(Model::layout[0]),
                          wpe(), seq);
    part_input_[0] = x0;
    for_each_part([&]<std::size_t i, class E>() {
      part_input_[i + 1] = E::forward(be_, p + Model::core::part_offset[i], ws, std::get<i>(plan_.parts),
                                      part_input_[i], ws + plan_.scratch, batch, seq,
                                      std::span<const token_t>(tokens_.data(), tokens.size()));
    });
    const MatrixView<const T> x = part_input_[n_parts];
    const MatrixView<T> lnf{ws + plan_.lnf, n, d};
    be_.layernorm_forward(lnf, span(plan_.mean_f, n), span(plan_.rstd_f, n), x, pvec(Model::core::ln_f_offset, d),
                          pvec(Model::core::ln_f_offset + d, d));
    // The head, tied to the token embedding; a backend with its own LM-head ops uses the logits' padding
    // (backend_concept.hpp, row_align; cuda::Backend's lm_head_forward).
    const MatrixView<const T> wte = param(Model::layout[0]);
    if constexpr (requires { be_.lm_head_forward(logits_view(n), MatrixView<const T>(lnf), wte); })
      be_.lm_head_forward(logits_view(n), MatrixView<const T>(lnf), wte);
    else
      be_.linear_forward(logits_view(n), MatrixView<const T>(lnf), wte, std::span<const T>{});

    if (targets.empty()) {
      state_ = State::Logits;
      has_loss_ = false;
      return;
    }
    be_.from_host(std::span<token_t>(targets_.data(), targets.size()), targets);
    be_.cross_entropy_forward(span(plan_.loss, 1), span(plan_.lse, n), MatrixView<const T>(logits_view(n)),
                              std::span<const token_t>(targets_.data(), targets.size()));
    state_ = State::Loss;
    has_loss_ = true;
    // Parts with an auxiliary loss (the routers' load balancing, MoD's causal loss, ...) add it to
    // the model loss, on the device; their backward adds its gradient.
    const std::span<T> objective = span(plan_.objective, 1);
    be_.copy(objective, cspan(plan_.loss, 1));
    for_each_part([&]<std::size_t i, class E>() {
      if constexpr (requires { E::has_aux_loss; }) be_.axpy(objective, T(1), cspan(std::get<i>(plan_.parts).aux, 1));
    });
  }

  // Accumulates d(mean loss)/d(params) of the last forward into grads(). The logits are no longer valid after it
  // (a backend may overwrite them with their gradient).
  void backward() {
    MOM_CHECK(state_ == State::Loss, "backward: needs a forward with targets since the last backward");
    const index_t batch = batch_, seq = seq_, n = batch * seq;
    T* ws = ws_.data();
    T* g = grads_.data();
    const T* p = params_.data();
    const std::span<const token_t> targets(targets_.data(), static_cast<std::size_t>(n));
    const std::span<const token_t> tokens(tokens_.data(), static_cast<std::size_t>(n));
    const GuardScope guarded(ws_.data(), guards_);
    const MatrixView<T> dlogits = logits_view(n);
    const MatrixView<T> dlnf{ws + plan_.dlnf, n, d}, dres{ws + plan_.dres, n, d};
    be_.zero(dlnf.flat());
    const MatrixView<const T> lnf{ws + plan_.lnf, n, d}, wte = param(Model::layout[0]);
    // The head's backward from the loss: in one op where the backend has it (cuda::Backend's lm_head_loss_backward,
    // which under BF16 writes dlogits straight in its products' bf16 layout), else the cross-entropy's gradient in
    // place over the logits, then the head's products.
    if constexpr (requires { be_.lm_head_loss_backward(dlnf, grad(Model::layout[0]), dlogits, cspan(plan_.lse, n),
                                                       targets, T(1), lnf, wte); }) {
      be_.lm_head_loss_backward(dlnf, grad(Model::layout[0]), dlogits, cspan(plan_.lse, n), targets, T(1), lnf, wte);
    } else {
      be_.cross_entropy_backward(dlogits, MatrixView<const T>(dlogits), cspan(plan_.lse, n), targets, T(1));
      if constexpr (requires { be_.lm_head_backward(dlnf, grad(Model::layout[0]), MatrixView<const T>(dlogits), lnf, wte); })
        be_.lm_head_backward(dlnf, grad(Model::layout[0]), MatrixView<const T>(dlogits), lnf, wte);
      else
        be_.linear_backward(dlnf, grad(Model::layout[0]), std::span<T>{}, MatrixView<const T>(dlogits), lnf, wte);
    }
    be_.zero(dres.flat());
    be_.layernorm_backward(dres, gvec(Model::core::ln_f_offset, d), gvec(Model::core::ln_f_offset + d, d),
                           MatrixView<const T>(dlnf), part_input_[n_parts], cspan(plan_.mean_f, n), cspan(plan_.rstd_f, n),
                           pvec(Model::core::ln_f_offset, d));
    for_each_part_reversed([&]<std::size_t i, class E>() {
      E::backward(be_, p + Model::core::part_offset[i], g + Model::core::part_offset[i], ws, std::get<i>(plan_.parts),
                  part_input_[i], dres, ws + plan_.scratch, batch, seq);
    });
    be_.embedding_backward(grad(Model::layout[0]), dwpe(), MatrixView<const T>(dres), tokens, seq);
    state_ = State::Reserved;
  }

  void zero_grad() { be_.zero(grads_.span()); }

  // Buffers that change once per optimizer step outside gradient descent (DeepSeekMoE's selection bias,
  // routers/affinity.hpp), from the statistics their backward left in grads() (summed over the step's
  // micro-batches and ranks): the trainer calls it after reducing the gradients, before AdamW.
  void update_buffers() {
    for_each_part([&]<std::size_t i, class E>() {
      if constexpr (requires { E::update_buffers(be_, params_.data(), grads_.data()); })
        E::update_buffers(be_, params_.data() + Model::core::part_offset[i], grads_.data() + Model::core::part_offset[i]);
    });
  }

  std::span<T> params() { return params_.span(); }
  std::span<const T> params() const { return params_.span(); }
  std::span<T> grads() { return grads_.span(); }
  std::span<const T> grads() const { return grads_.span(); }
  // [batch * seq x vocab] logits of the last forward (valid until backward); rows logits_ld apart.
  MatrixView<const T> logits() const {
    MOM_CHECK(state_ == State::Logits || state_ == State::Loss, "logits: no forward since the last backward");
    return {ws_.data() + plan_.logits, batch_ * seq_, vocab, logits_ld};
  }
  // One tensor of the flat buffers, by layout entry (e.g. Model::find("h.0.attn.w_qkv")).
  MatrixView<T> param(const ParamInfo& p) { return {params_.data() + p.offset, p.rows, p.cols}; }
  MatrixView<T> grad(const ParamInfo& p) { return {grads_.data() + p.offset, p.rows, p.cols}; }
  // The learned position embedding [context × d] and its gradient; empty views for a RoPE model (no wpe).
  MatrixView<T> wpe() { return Model::core::has_wpe ? param(Model::layout[1]) : MatrixView<T>{}; }
  MatrixView<T> dwpe() { return Model::core::has_wpe ? grad(Model::layout[1]) : MatrixView<T>{}; }

  Be& backend() { return be_; }
  // The step workspace and its plan (for read-back of routing decisions, statistics, tests).
  const T* workspace_data() const { return ws_.data(); }
  const typename Model::Plan& plan() const { return plan_; }
  index_t batch() const { return batch_; }
  index_t seq() const { return seq_; }
  // Elements of T in the workspace: Model::activation_elements(reserved batch, reserved seq), plus the logits' row
  // padding on a backend with a row_align (n × (logits_ld − vocab)).
  index_t workspace_size() const { return ws_.size(); }
  index_t reserved_batch() const { return plan_.batch; }
  index_t reserved_seq() const { return plan_.seq; }

 private:
  template <class... Es>
  static constexpr bool runs_on_backend(TypeList<Es...>) {
    return (AssemblyExecutorOn<Es, Be> && ...);
  }
  enum class State { Empty, Reserved, Logits, Loss };
  // The module calls of a forward / backward verify this workspace's guards (modules/checked.hpp).
  struct GuardScope {
    detail::ActiveGuards saved = detail::active_guards;
    GuardScope(const T* ws, const std::vector<index_t>& gaps) { detail::active_guards = {ws, &gaps}; }
    ~GuardScope() { detail::active_guards = saved; }
    GuardScope(const GuardScope&) = delete;
    GuardScope& operator=(const GuardScope&) = delete;
  };
  using Executors = typename Model::core::executors;
  static constexpr std::size_t n_parts = Model::core::n_parts;

  MatrixView<T> logits_view(index_t n) { return {ws_.data() + plan_.logits, n, vocab, logits_ld}; }
  std::span<T> span(index_t offset, index_t n) { return {ws_.data() + offset, static_cast<std::size_t>(n)}; }
  std::span<const T> cspan(index_t offset, index_t n) const { return {ws_.data() + offset, static_cast<std::size_t>(n)}; }
  std::span<const T> pvec(index_t offset, index_t n) const { return {params_.data() + offset, static_cast<std::size_t>(n)}; }
  std::span<T> gvec(index_t offset, index_t n) { return {grads_.data() + offset, static_cast<std::size_t>(n)}; }

  template <class F>
  void for_each_part(F&& f) {
    [&]<class... Es, std::size_t... is>(TypeList<Es...>, std::index_sequence<is...>) {
      (f.template operator()<is, Es>(), ...);
    }(Executors{}, std::make_index_sequence<Executors::size>{});
  }
  template <class F>
  void for_each_part_reversed(F&& f) {
    [&]<class... Es, std::size_t... is>(TypeList<Es...>, std::index_sequence<is...>) {
      constexpr std::size_t last = sizeof...(Es) - 1;
      using List = std::tuple<Es...>;
      (f.template operator()<last - is, std::tuple_element_t<last - is, List>>(), ...);
    }(Executors{}, std::make_index_sequence<Executors::size>{});
  }

  Be be_;
  std::vector<index_t> guards_;  // the workspace's guard gaps (none when workspace_guard is 0)
  typename Be::template Buffer<T> params_, grads_, ws_;
  typename Be::template Buffer<token_t> tokens_, targets_;
  typename Model::Plan plan_{};
  index_t batch_ = 0, seq_ = 0;
  // Residual stream entering each part; the last entry is the architecture's output.
  std::array<MatrixView<const T>, n_parts + 1> part_input_{};
  State state_ = State::Empty;
  bool has_loss_ = false;  // the objective slot holds the last forward's loss (backward keeps it)
};

}  // namespace mom

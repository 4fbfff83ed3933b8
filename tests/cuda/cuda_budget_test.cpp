// Per-training-step budgets of the CUDA backend (issue 28, item 3), and a decode step's, counted by the emulated
// runtime (tests/cuda/emu/emu_runtime.cpp; docs/cuda.md "Per-step budgets"): one Trainer step of each small model,
// after two warm-up steps, launches so many kernels, calls cuBLAS so many times for so many FLOPs, sets and
// copies so many bytes. These are counts, not times: they hold on any machine, and a change that adds
// launches, GEMMs, memsets or copies to a step fails here before anyone profiles it on a GPU.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "cuda/cuda_test_support.hpp"
#include "cuda/small_models.hpp"
#include "cuda/trainer_support.hpp"
#include "mom/backend/cuda.hpp"
#include "mom/infer/decoder.hpp"
#include "mom/testing/counting_backend.hpp"
#include "mom/testing/random.hpp"
#include "mom/train/train.hpp"

using namespace mom;
using namespace mom::test::small_models;

namespace {

constexpr Dims odd_vocab_dims{.d_model = 64, .heads = 4, .d_ff = 256, .vocab = 257, .context = 64};
using DenseOddVocab = LM<odd_vocab_dims, Dense<2>>;

// The products that cuda::Backend hands to cuBLAS, tallied on the CPU over the same model code: gemm,
// linear_forward / linear_backward (one cuBLAS call per product; dx and dW each one), and the GRU cell's
// two linears forward and backward. Every other op of the CUDA backend — dense attention (kernels/attention.cuh,
// attention_tc.cuh: online softmax, not GEMMs), packed / grouped / stick-breaking attention, and the grouped
// expert GEMMs (kernels/grouped_linear.cuh: mom's own tiled kernels, counted as launches) — is a kernel, not a
// cuBLAS call. Built on the testing kit's CountingBackend, whose total `flops` is the cost model's figure
// (tests/models check it; here too, forward and backward, through realised_*_flops). Also tallied: the
// operand elements a bf16 GEMM stages (both operands, whole), and the products whose leading dimensions or
// pointers, as cuBLAS receives them, are off 16 bytes (an fp32 ld that is not a multiple of 4). Like cuda::Backend it
// keeps weight copies (backend_concept.hpp, KeepsWeightCopies): inside a window an operand lying in the parameter block
// is staged once (weight_copies.hpp).
struct GemmTally : mom::testing::CountingBackend<float> {
  using Base = mom::testing::CountingBackend<float>;
  index_t gemm_calls = 0, gemm_flops = 0, staged_elements = 0, unaligned = 0, unaligned_wide = 0;
  index_t staged_once = 0;  // elements a bf16 linear_backward stages once for its two products (dy)
  index_t unstaged_reads = 0;  // operand elements a bf16 product reads from no staging copy (the LM head's dlogits)
  index_t weight_reads = 0;    // operand elements read from the parameter block (counted in staged_elements too)
  index_t weight_copied = 0;   // the elements of the distinct weight views a window converted, once each
  const float* handed_over = nullptr;  // a dqkv the attention pair handed to norm_linear_backward in bf16
  std::span<const float> window;       // the open weight window's block
  std::vector<MatrixView<const float>> copied;
  void begin_weight_copies(std::span<const float> w) {
    window = w;
    copied.clear();
  }
  void end_weight_copies() { window = {}; }
  // An operand staged for a bf16 product: a weight once a window (its copy), anything else every time.
  template <class V>
  void staged(const V& v) {
    staged_elements += v.rows * v.cols;
    const float* p = v.data;
    if (window.empty() || p < window.data() || p >= window.data() + window.size()) return;
    weight_reads += v.rows * v.cols;
    const auto same = [&](const MatrixView<const float>& c) { return c.data == p && c.rows == v.rows && c.cols == v.cols; };
    if (std::none_of(copied.begin(), copied.end(), same)) {
      copied.push_back({p, v.rows, v.cols, v.ld});
      weight_copied += v.rows * v.cols;
    }
  }
  // C [m × n] = A [m × k] · B [k × n] as backend.hpp's gemm issues it (none when m or n is 0); a, b, c: the
  // row-major views cuBLAS reads as its B, A and C.
  template <class VA, class VB, class VC>
  void product(index_t m, index_t n, index_t k, const VA& a, const VB& b, const VC& c) {
    if (m == 0 || n == 0) return;
    ++gemm_calls;
    gemm_flops += 2 * m * n * k;
    staged(a);
    staged(b);
    const auto off = [](const auto& v) {
      return reinterpret_cast<std::uintptr_t>(v.data) % 16 != 0 || (std::max<index_t>(v.ld, 1) * 4) % 16 != 0;
    };
    if (off(a) || off(b) || off(c)) {
      ++unaligned;
      if (std::min({m, n, k}) > 8) ++unaligned_wide;  // not a router's [n × E] logits (E ≤ 8 choices)
    }
  }
  void gemm(M C, CM A, Trans ta, CM B, Trans tb, float alpha = 1, float beta = 0) {
    product(C.rows, C.cols, ta == Trans::N ? A.cols : A.rows, A, B, C);
    Base::gemm(C, A, ta, B, tb, alpha, beta);
  }
  void linear_forward(M y, CM x, CM w, CS b) {
    product(x.rows, w.rows, x.cols, x, w, y);
    Base::linear_forward(y, x, w, b);
  }
  void linear_backward(M dx, M dw, S db, CM dy, CM x, CM w, Store dx_store = Store::add) {
    if (!dx.empty() && !dw.empty()) staged_once += dy.rows * dy.cols;
    if (!dx.empty()) product(dy.rows, w.cols, dy.cols, dy, w, dx);
    if (!dw.empty()) product(dy.cols, x.cols, dy.rows, dy, x, dw);
    Base::linear_backward(dx, dw, db, dy, x, w, dx_store);
  }
  // The LM head's backward from the loss (cuda::Backend's lm_head_loss_backward): the head's two products, whose
  // dlogits the cross-entropy writes straight into the bf16 staging under BF16 (no staging copy reads it).
  void lm_head_loss_backward(M dx, M dw, M logits, CS lse, std::span<const token_t> targets, float dloss, CM x, CM w) {
    Base::cross_entropy_backward(logits, CM(logits), lse, targets, dloss);
    product(logits.rows, w.cols, logits.cols, logits, w, dx);
    product(logits.cols, x.cols, logits.rows, logits, x, dw);
    unstaged_reads += 2 * logits.rows * logits.cols;
    Base::linear_backward(dx, dw, S{}, logits, x, w);
  }
  // A LayerNorm and the linear that reads it as cuda::Backend's op pair (norm_ops.hpp): the separate ops' products, but
  // under BF16 the LayerNorm's output is written in bf16 (no staging copy reads it, forward or dW); dy is staged once.
  // The attention pair's qkv (y_layout.attention_heads) is written in bf16 where its mma kernels read it (head dim
  // 64): the bias is then staged for the product's bf16 epilogue.
  void norm_linear_forward(M y, NormSaved<float> ln, CM x, CS gamma, CS beta, CM w, CS b, OutLayout y_layout = {}) {
    product(x.rows, w.rows, x.cols, CM(ln.out), w, y);
    unstaged_reads += ln.out.rows * ln.out.cols;
    const index_t heads = y_layout.attention_heads;
    if (heads > 0 && !b.empty() && y.cols / 3 / heads == 64)
      staged(CM(b.data(), 1, ssize(b)));
    Base::layernorm_forward(ln.out, ln.mean, ln.rstd, x, gamma, beta);
    Base::linear_forward(y, CM(ln.out), w, b);
  }
  // With dy handed over in bf16 (attention_linear_backward below), neither product stages it.
  void norm_linear_backward(M dx, S dgamma, S dbeta, M dw, S db, M dln, CM dy, CM x, NormSaved<const float> ln,
                            CS gamma, CM w, GradLayout dy_layout = GradLayout::fp32) {
    product(dy.rows, w.cols, dy.cols, dy, w, dln);
    product(dy.cols, ln.out.cols, dy.rows, dy, ln.out, dw);
    const bool in_place = dy_layout == GradLayout::backend && dy.data == handed_over;
    handed_over = nullptr;
    if (in_place)
      unstaged_reads += 2 * dy.rows * dy.cols;
    else
      staged_once += dy.rows * dy.cols;
    unstaged_reads += ln.out.rows * ln.out.cols;
    Base::linear_backward(dln, dw, db, dy, ln.out, w, Store::overwrite);
    Base::layernorm_backward(dx, dgamma, dbeta, CM(dln), x, ln.mean, ln.rstd, gamma);
  }
  // The attention and its output linear as cuda::Backend's op pair (attention_ops.hpp): the separate ops' products,
  // but under BF16 at head dim 64 or 128 (the mma kernels) the attention's output is written in bf16 (no staging copy
  // reads it, forward or dW), and with GradLayout::backend its dqkv goes to norm_linear_backward in bf16: dQ's fp32
  // rows converted (a staging copy of [n × d]), the qkv linear's products reading all of it in place.
  static bool attention_in_bf16(CM att, index_t heads) {
    const index_t hd = att.cols / heads;
    return hd == 64 || hd == 128;
  }
  // With a residual (eq. (4)'s add, which cuda::Backend does in the proj product's epilogue): the same product.
  void attention_linear_forward(M y, M att, S lse, CM qkv, CM w, CS b, index_t batch, index_t seq, index_t heads,
                                CM residual = CM{}) {
    if (attention_in_bf16(CM(att), heads)) unstaged_reads += att.rows * att.cols;
    Base::attention_forward(att, lse, qkv, batch, seq, heads);
    linear_forward(y, CM(att), w, b);
    if (!residual.empty()) Base::add_forward(y.flat(), CM(y).flat(), residual.flat());
  }
  void attention_linear_backward(M dqkv, M dw, S db, M datt, CM dy, CM att, CS lse, CM qkv, CM w, index_t batch,
                                 index_t seq, index_t heads, GradLayout dqkv_layout = GradLayout::fp32) {
    const bool bf16 = attention_in_bf16(att, heads);
    if (bf16) unstaged_reads += att.rows * att.cols;
    linear_backward(datt, dw, db, dy, att, w, Store::overwrite);
    Base::zero(dqkv);  // (the pair writes dqkv; the CPU's attention_backward accumulates)
    Base::attention_backward(dqkv, CM(datt), att, lse, qkv, batch, seq, heads);
    handed_over = bf16 && dqkv_layout == GradLayout::backend ? dqkv.data : nullptr;
    if (handed_over) staged_elements += dqkv.rows * (dqkv.cols / 3);
  }
  // The FFN as cuda::Backend's op pair (mlp_ops.hpp): its four products as the separate ops', but under BF16 ln, act
  // and d(pre) are written in bf16 by their producers (no staging copy reads them) and the fc bias is staged for the
  // epilogue; dy is staged once for its two products.
  void mlp_forward(M y, NormSaved<float> ln, M pre, M act, CM x, CS gamma, CS beta, CM w1, CS b1, CM w2, CS b2,
                   CM residual = CM{}) {
    product(x.rows, w1.rows, x.cols, CM(ln.out), w1, pre);
    product(act.rows, w2.rows, act.cols, act, w2, y);
    unstaged_reads += act.rows * act.cols + ln.out.rows * ln.out.cols;
    staged(CM(b1.data(), 1, ssize(b1)));
    Base::layernorm_forward(ln.out, ln.mean, ln.rstd, x, gamma, beta);
    Base::linear_forward(pre, CM(ln.out), w1, b1);
    Base::gelu_forward(act.flat(), CM(pre).flat());
    Base::linear_forward(y, CM(act), w2, b2);
    if (!residual.empty()) Base::add_forward(y.flat(), CM(y).flat(), residual.flat());
  }
  void mlp_backward(M dx, S dgamma, S dbeta, M dw1, S db1, M dw2, S db2, M dln, M dact, M dpre, CM dy, CM x,
                    NormSaved<const float> ln, CS gamma, CM pre, CM act, CM w1, CM w2) {
    product(dy.cols, act.cols, dy.rows, dy, act, dw2);          // dW2 += dyᵀ·act
    product(dy.rows, w2.cols, dy.cols, dy, w2, dpre);           // d(pre) = (dy·w2) ∘ gelu'(pre)
    product(dpre.rows, w1.cols, dpre.cols, dpre, w1, dln);      // dln = d(pre)·w1
    product(dpre.cols, ln.out.cols, dpre.rows, dpre, ln.out, dw1);  // dW1 += d(pre)ᵀ·ln
    staged_once += dy.rows * dy.cols;
    unstaged_reads += act.rows * act.cols + 2 * dpre.rows * dpre.cols + ln.out.rows * ln.out.cols;
    Base::linear_backward(dact, dw2, db2, dy, act, w2, Store::overwrite);
    Base::gelu_backward(dpre.flat(), CM(pre).flat(), CM(dact).flat(), Store::overwrite);
    Base::linear_backward(dln, dw1, db1, CM(dpre), ln.out, w1, Store::overwrite);
    Base::layernorm_backward(dx, dgamma, dbeta, CM(dln), x, ln.mean, ln.rstd, gamma);
  }
  void gru_cell_forward(M h_out, M gates, CM x, CM h, CM w_ih, CM w_hh, CS b_ih, CS b_hh) {
    const index_t H3 = 3 * h_out.cols;
    product(x.rows, H3, x.cols, x, w_ih, gates.col_block(0, H3));
    product(h.rows, H3, h.cols, h, w_hh, gates.col_block(H3, H3));
    Base::gru_cell_forward(h_out, gates, x, h, w_ih, w_hh, b_ih, b_hh);
  }
  void gru_cell_backward(M dx, M dh, M dw_ih, M dw_hh, S db_ih, S db_hh, M scratch, CM dh_out, CM gates, CM x, CM h,
                         CM w_ih, CM w_hh) {
    const index_t n = dh_out.rows, H3 = 3 * dh_out.cols;
    const CM dgi = CM(scratch).col_block(0, H3), dgh = CM(scratch).col_block(H3, H3);
    if (!dx.empty()) product(n, x.cols, H3, dgi, w_ih, dx);
    if (!dw_ih.empty()) product(H3, x.cols, n, dgi, x, dw_ih);
    if (!dh.empty()) product(n, h.cols, H3, dgh, w_hh, dh);
    if (!dw_hh.empty()) product(H3, h.cols, n, dgh, h, dw_hh);
    Base::gru_cell_backward(dx, dh, dw_ih, dw_hh, db_ih, db_hh, scratch, dh_out, gates, x, h, w_ih, w_hh);
  }
};
// The tally runs the fused pairs cuda::Backend runs (else mha.hpp and ffn.hpp would count the separate ops), and its
// weight copies.
static_assert(FusesNormLinear<GemmTally, float> && FusesAttentionLinear<GemmTally, float> &&
              FusesMlp<GemmTally, float> && KeepsWeightCopies<GemmTally, float>);

// GPT-2's head dimension (64) in a small dense model: the attention pair's bf16 layouts apply (not at DenseSmall's 16).
constexpr Dims hd64_dims{.d_model = 128, .heads = 2, .d_ff = 256, .vocab = 256, .context = 64};
using DenseHd64 = LM<hd64_dims, Dense<2>>;

// What the step's accum micro-batches ask of cuBLAS: one forward and backward on the CPU tally inside a weight window
// (as the Trainer runs them), times accum (the products' shapes are known on the host, so they do not depend on the
// tokens or on the routing).
struct Expected {
  index_t gemm_calls = 0, gemm_flops = 0, unaligned = 0, unaligned_wide = 0;
  // What a bf16 step reads to stage: every operand but the weights each micro-batch, a linear's dy once; each weight
  // once a step.
  index_t staged_bytes_bf16 = 0;
};
template <class Model>
Expected expected_products(const train::TrainConfig& cfg) {
  ModelInstance<Model, GemmTally> m(3);
  m.reserve(cfg.batch, cfg.seq);
  const auto tokens = mom::testing::random_tokens(cfg.batch * cfg.seq, Model::dims.vocab, 7);
  m.zero_grad();
  {
    const WeightCopyWindow<GemmTally, float> copies(m.backend(), std::span<const float>(m.params()));
    m.forward(tokens, tokens, cfg.batch, cfg.seq);
    const index_t forward = m.backend().flops;
    CHECK(forward == realised_forward_flops(m));
    m.backward();
    CHECK(m.backend().flops - forward == realised_backward_flops(m));
  }
  const auto& t = m.backend();
  const index_t per_micro_batch = t.staged_elements - t.staged_once - t.unstaged_reads - t.weight_reads;
  return {cfg.accum * t.gemm_calls, cfg.accum * t.gemm_flops, cfg.accum * t.unaligned, cfg.accum * t.unaligned_wide,
          4 * (cfg.accum * per_micro_batch + t.weight_copied)};
}

struct Row {
  std::string model, precision;
  test::EmuCounters c;
};
std::vector<Row>& table() {
  static std::vector<Row> rows;
  return rows;
}
void print_table() {
  std::printf("\nper-step counts under the emulation (one Trainer step: 2 micro-batches of 2 x 16 tokens)\n");
  std::printf("%-13s %-5s %9s %6s %10s %10s %8s %14s %10s\n", "model", "prec", "launches", "GEMMs", "GEMM GFLOP",
              "memset MB", "D2D MB", "staging (MB)", "unaligned");
  for (const auto& r : table())
    std::printf("%-13s %-5s %9ld %6ld %10.4f %10.3f %8.3f %6ld (%5.2f) %10ld\n", r.model.c_str(), r.precision.c_str(),
                r.c.launches, r.c.gemm_calls, double(r.c.gemm_flops) * 1e-9, double(r.c.memset_bytes) * 1e-6,
                double(r.c.d2d_bytes) * 1e-6, r.c.staging_copies, double(r.c.staging_bytes) * 1e-6, r.c.unaligned_gemms);
}

// One measured Trainer step (after two warm-up steps, as cuda_trainer_test.cpp's [sync] check), with that
// check's conditions: the one read of {gradient norm, loss} is the step's only host wait, and it allocates nothing.
template <class Model>
test::EmuCounters measure(const char* name, cuda::Precision precision) {
  INFO(name << " " << (precision == cuda::Precision::BF16 ? "bf16" : "tf32"));
  const test::Data data;
  train::TokenFile train_file(data.prep.train);
  cuda::Backend<float> be;
  be.set_precision(precision);
  ModelInstance<Model, cuda::Backend<float>> m(3, be);
  train::Trainer trainer(m, train_file, nullptr, test::config({}, 10));
  trainer.train_step();
  trainer.train_step();
  double loss = NAN;
  const auto s = test::measure_step(be, [&] { loss = trainer.train_step(); });
  CHECK(s.step.host_waits == s.one_read_waits);
  CHECK(s.step.allocations == 0);
  CHECK(std::isfinite(loss));
  table().push_back({name, precision == cuda::Precision::BF16 ? "bf16" : "tf32", s.step});
  return s.step;
}

// AdamW passes of a Trainer step: one per run of consecutive layout tensors with the same weight-decay setting
// (Trainer::apply_freeze, nothing frozen).
template <class Model>
index_t optimizer_groups() {
  index_t groups = 0;
  bool last = false;
  for (std::size_t i = 0; i < Model::layout.size(); ++i) {
    const bool decay = Model::layout[i].rows > 1 && Model::layout[i].cols > 1;
    if (i == 0 || decay != last) ++groups;
    last = decay;
  }
  return groups;
}

// A model's budgets per training step, in units of its structure:
//   launches     <= accum · (per_step · Model::steps + 10) + groups + 4
//                   10: the LM's own launches per micro-batch (embedding, final LayerNorm, head bias, cross-entropy,
//                   the loss sum: Dense<4> − Dense<2> gives 21 per layer, so Dense<2>'s 52 leave 10); groups + 4:
//                   one AdamW pass per decay group (optimizer_groups), the gradient norm (2), norm += 0·loss, the
//                   gradients' 1/accum scale. per_step: today's launches per assembly step and micro-batch + ~15%.
//   memset bytes <= parameter bytes + accum · memset_share · Model::activation_bytes(batch, seq) + 256
//                   zero_grad sets the gradients once a step (= the parameter bytes); each micro-batch zeroes
//                   buffers of its workspace (activation gradients, routed accumulators): memset_share is today's
//                   share of the activation bytes + ~15%; 256 bytes for the step's scalars.
//   D2D bytes    <= accum · (copies · n·d·4 + 4)
//                   copies: [n × d] residual-stream matrices copied per micro-batch (today's + ~15%), and the
//                   loss (4 bytes) copied once per micro-batch.
struct Budget {
  double per_step, memset_share, copies;
};

template <class Model>
void check_budgets(const test::EmuCounters& c, const train::TrainConfig& cfg, Budget b) {
  constexpr Dims D = Model::dims;
  const index_t n = cfg.batch * cfg.seq;
  const double launches = double(cfg.accum) * (b.per_step * Model::steps + 10) + double(optimizer_groups<Model>() + 4);
  const double memset = double(Model::params) * 4 +
                        double(cfg.accum) * b.memset_share * double(Model::activation_bytes(cfg.batch, cfg.seq)) + 256;
  const double d2d = double(cfg.accum) * (b.copies * double(n * D.d_model * 4) + 4);
  INFO("launches " << c.launches << " (budget " << launches << "), memset bytes " << c.memset_bytes << " (budget "
                   << memset << "), D2D bytes " << c.d2d_bytes << " (budget " << d2d << ")");
  // Today's values in the budgets' units, printed so that a change that lowers them can lower the budgets too.
  const double per_step = ((double(c.launches) - double(optimizer_groups<Model>() + 4)) / double(cfg.accum) - 10) /
                          double(Model::steps);
  const double share = (double(c.memset_bytes) - double(Model::params) * 4 - 256) /
                       (double(cfg.accum) * double(Model::activation_bytes(cfg.batch, cfg.seq)));
  const double copies = (double(c.d2d_bytes) / double(cfg.accum) - 4) / double(n * D.d_model * 4);
  std::printf("budget units: %-13s launches per step %6.2f (budget %g), memset share %.3f (%g), copies %.2f (%g)\n",
              table().empty() ? "" : table().back().model.c_str(), per_step, b.per_step, share, b.memset_share, copies,
              b.copies);
  CHECK(double(c.launches) <= launches);
  CHECK(double(c.memset_bytes) <= memset);
  CHECK(double(c.d2d_bytes) <= d2d);
}

// A BF16 step: the TF32 step's products, and exactly the staging the tally predicts (bytes; conversions: copies_per_layer
// a layer and 2 for the LM head (x, forward and backward) each micro-batch, and weights_per_layer a layer and 1 for the
// head (its weight) once a step, in the Trainer's weight window).
template <class Model>
test::EmuCounters measure_bf16(const char* name, const train::TrainConfig& cfg, index_t copies_per_layer,
                               index_t weights_per_layer) {
  const auto c = measure<Model>(name, cuda::Precision::BF16);
  const Expected want = expected_products<Model>(cfg);
  INFO(name << " (bf16)");
  CHECK(c.gemm_calls == want.gemm_calls);
  CHECK(c.gemm_flops == want.gemm_flops);
  CHECK(c.unaligned_gemms == 0);
  CHECK(c.staging_copies == cfg.accum * (copies_per_layer * Model::depth + 2) + weights_per_layer * Model::depth + 1);
  CHECK(c.staging_bytes == want.staged_bytes_bf16);
  return c;
}

template <class Model>
void check_model(const char* name, Budget budget) {
  const auto cfg = test::config({}, 10);
  const Expected want = expected_products<Model>(cfg);
  const auto c = measure<Model>(name, cuda::Precision::TF32);
  INFO(name << " (tf32)");
  CHECK(c.gemm_calls == want.gemm_calls);
  CHECK(c.gemm_flops == want.gemm_flops);
  CHECK(c.staging_copies == 0);  // TF32 reads the fp32 operands as they are
  CHECK(c.staging_bytes == 0);
  // Unaligned GEMMs: the target is none. Today the routers' logits products ([n × E], E = 1, 2, 3 or 5 choices: an
  // ld of E floats) are; none of the body's products (d, 3d, d_ff, the vocabulary 256) is, and none may become so.
  CHECK(c.unaligned_gemms == want.unaligned);
  CHECK(want.unaligned_wide == 0);
  check_budgets<Model>(c, cfg, budget);
}

}  // namespace

TEST_CASE("per-step budgets under the emulation: launches, GEMMs and their FLOPs, memsets, copies, staging",
          "[cuda][budget]") {
  MOM_REQUIRE_GPU();
  MOM_REQUIRE_EMU_COUNTERS();
  table().clear();
  const auto cfg = test::config({}, 10);
  // Budgets: {launches per assembly step and micro-batch, memset share of the activation bytes, [n × d] copies}
  // (check_budgets); today's values (2026-11-28, printed as "budget units") in the comments, each budget about 15%
  // above. The memset shares fell on 2026-11-28 (dense 0.61 -> 0.16) when the FFN and attention backward stopped
  // zeroing the scratch gradients they now write (Store::overwrite); the launches fell the same day (dense 21 -> 17)
  // when the linear forward's bias moved into its GEMM (cuBLASLt's bias epilogue: no broadcast kernel), and on
  // 2026-11-30 (dense 17 -> 15) when the FFN's GELU and its backward moved into cuBLASLt's epilogues (FusesGelu), and on
  // 2026-12-02 (dense 15 -> 13) when the residual add moved into the output products' epilogues (AddsResidualOn).
  {
    // Dense: the step's GEMMs are every matrix product of the cost model except attention's (a kernel on CUDA:
    // online softmax over the causal keys, 2·d·seq·(seq+1) FLOPs forward and 5·d·seq·(seq+1) backward per
    // layer and sequence, as Model::training_flops counts them), accum times.
    using Model = DenseSmall;
    constexpr Dims D = Model::dims;
    const index_t attention = Model::depth * cfg.batch * 7 * D.d_model * cfg.seq * (cfg.seq + 1);
    const index_t want = cfg.accum * (Model::training_flops(cfg.batch, cfg.seq) - attention);
    // 13 launches a layer (15 before the attention and FFN pairs added the residual in their output products'
    // epilogues: AddsResidualOn, assembly/sequential.hpp); memset 0.162; no copy but the loss
    check_model<Model>("dense", {15, 0.19, 0});
    CHECK(table().back().c.gemm_flops == want);
    CHECK(table().back().c.unaligned_gemms == 0);
    // 4 linears a layer and the head, each a forward, a dx and a dW product (tests/models/dense_model_test.cpp).
    CHECK(table().back().c.gemm_calls == cfg.accum * 3 * (4 * Model::depth + 1));
  }
  // MoM_P and MoE: one gather launch a routed FFN fewer since the FFN's LayerNorm reads its rows in place.
  check_model<MoMP>("MoM_P", {58, 0.25, 13.8});  // 48.5 a step (10 steps; 49.3 before the dense steps' residual in
                                                 // the epilogues, 49.9 before that); memset 0.217; 12 copies
  check_model<MoESmall>("MoE", {42, 0.13, 2.3});       // 35.5 (36.5 before); 0.116; 2
  check_model<MoDSmall>("MoD", {24, 0.19, 2.3});       // 20.75; 0.158; 2
  // MoEUT copies: each selection reads its logits in place in the one [n × 2·H·N_A] logits matrix and writes its
  // dlogits into its columns of the one gradient (1.06 when both were copied to and from its own buffer).
  check_model<MoEUTSmall>("MoEUT", {81, 0.33, 0.65});  // 76.25 (70.25 when the budget was set); 0.280; 0.56
  check_model<MFSmall>("ModuleFormer", {66, 0.38, 2.3});  // 62.5 (57.5 when the budget was set); 0.330; 2
  check_model<MoRSmall>("MoR", {55, 0.18, 5.7});                 // 47.3; 0.152; 4.94
  {
    // BF16: the same products; a GEMM stages its operands as bf16 (ops.hpp: one to_bf16 launch each, rows padded
    // to 16 bytes), a linear's backward its dy once for both products: 2 conversions a forward product, 3 a
    // linear's backward pair (108 for the 54 products before the pair shared dy: 90). Inside the Trainer's weight
    // window (backend_concept.hpp, KeepsWeightCopies) a weight is converted once a step, into its copy
    // (weight_copies.hpp), which its forward and dx products of both micro-batches read. The target is zero, once
    // AdamW writes the copies and the activations arrive in bf16 from their producers.
    using Model = DenseSmall;
    // The head's dlogits is written staged by the cross-entropy (lm_head_loss_backward): 2 conversions for the head's
    // backward pair. The FFN keeps ln, act and d(pre) in bf16 (mlp_ops.hpp): its forward stages w_fc, b_fc and w_proj,
    // its backward dy, w_proj and w_fc (3, where its two linear backwards staged 6). The attention's LayerNorm writes
    // bf16 for the qkv linear (norm_ops.hpp): its forward stages w_qkv, its backward dy and w_qkv. The attention (head
    // dim 16: no bf16 layout) stages att and w_proj forward, dy, w_proj and att backward. 14 a layer and micro-batch
    // before the weight copies: 64 a step (80 with the LayerNorms' outputs staged, 88 with the MLP's act, 90 with
    // dlogits), 2.10 MB (2.23, 2.62, 2.69 and 3.05 before). With them 5 a layer and micro-batch (att twice, the
    // attention's, the qkv linear's and the FFN's dy) and 5 weights a layer a step (w_qkv, w_proj, w_fc, b_fc, the
    // FFN's w_proj): 35 a step.
    const auto c = measure_bf16<Model>("dense", cfg, 5, 5);
    // 18.75 launches a step with the staging (20.75 before the residual in the epilogues, 28 before the weight
    // copies, 32 before the LayerNorms wrote bf16, 33.5
    // before the MLP kept its activations in bf16 and the head's dlogits was written staged, 35.5 before the GELU moved
    // into the epilogues, 39.5 before the bias gradients were summed in the staging); memset 0.162
    check_budgets<Model>(c, cfg, {24, 0.19, 0});
  }
  {
    // BF16 at head dim 64: the attention writes its output in bf16 for the proj linear (forward and dW) and hands dqkv
    // to the qkv linear in bf16 (attention_ops.hpp). A layer stages 12 without the weight copies: the attention pair
    // w_proj forward, dy, w_proj and dQ's conversion backward (its output never), the LayerNorm pair w_qkv forward and
    // backward (its dy never), the FFN 3 and 3: 56 copies, 4.98 MB (as many copies with dqkv staged whole, but its 3
    // columns for dQ's 1; 64 with att staged). With them 3 a layer and micro-batch (the attention's dy, dQ, the FFN's
    // dy) and the 5 weights once a step: 27. The qkv product writes qkv in bf16 for the attention's kernels
    // (norm_ops.hpp): its bias is a sixth weight converted once a step, 29.
    using Model = DenseHd64;
    const auto c = measure_bf16<Model>("dense hd64", cfg, 3, 6);
    const auto t = measure<Model>("dense hd64", cuda::Precision::TF32);
    // The memsets: dqkv is not zeroed whole, only dQ's fp32 rows (a third of it) a layer.
    const index_t n = cfg.batch * cfg.seq;
    CHECK(t.memset_bytes - c.memset_bytes == cfg.accum * Model::depth * 4 * n * 2 * Model::dims.d_model);
  }
  {
    // A vocabulary whose rows are not 16-byte aligned (257 floats, as GPT-2's 50257): the backend lays the logits
    // out 320 wide (cuda::Backend::row_align, 64), so the LM head's three products, and their bf16 staging, are aligned
    // like every other (without the padding: 3 unaligned products a micro-batch).
    static_assert(ModelInstance<DenseOddVocab, cuda::Backend<float>>::logits_ld == 320);
    static_assert(ModelInstance<DenseOddVocab, cpu::Backend<float>>::logits_ld == 257);
    static_assert(ModelInstance<GPT2Small, cuda::Backend<float>>::logits_ld == 50304);
    // Under BF16 the head's forward and dx products also run over the padded width (ops.hpp, lm_head_forward):
    // 2·n·d FLOPs per padding column each, so that no extent of theirs is the odd vocabulary.
    const Expected want = expected_products<DenseOddVocab>(cfg);
    CHECK(want.unaligned == cfg.accum * 3);  // as the CPU's unpadded layout would hand them to cuBLAS
    const index_t pad_flops = cfg.accum * 2 * (2 * cfg.batch * cfg.seq * odd_vocab_dims.d_model * (320 - 257));
    for (const auto precision : {cuda::Precision::TF32, cuda::Precision::BF16}) {
      const auto c = measure<DenseOddVocab>("dense, V 257", precision);
      CHECK(c.gemm_calls == want.gemm_calls);
      CHECK(c.gemm_flops == want.gemm_flops + (precision == cuda::Precision::BF16 ? pad_flops : 0));
      CHECK(c.unaligned_gemms == 0);
    }
  }
  print_table();
}

TEST_CASE("per-step budgets under the emulation: a decode step, op by op and replayed as a CUDA graph",
          "[cuda][budget][decode]") {
  MOM_REQUIRE_GPU();
  MOM_REQUIRE_EMU_COUNTERS();
  // A step of the dense decoder (infer/decoder.hpp) per layer: 2 LayerNorms, kv_write and attention_decode (4
  // launches; both residual adds ride in the output products' epilogues: AddsResidualOn, DecodesResidualOn) and 4
  // biased linears (4 cuBLAS / cuBLASLt calls: qkv, output projection, the FFN's
  // two, the first with the GELU in its epilogue: backend_concept.hpp, FusesGelu); per step the embedding at the rows' positions and the final LayerNorm (2 launches) and the tied head (1
  // call). The products' FLOPs are 2 · rows · (the layers' weight elements + the head's). A step of every slot in
  // order writes its logits in place: no copy; and it neither waits for the GPU nor allocates. Replayed from the
  // recorded graph: one graph launch, no kernel launch, the same products.
  using Model = DenseSmall;
  constexpr Dims D = Model::dims;
  constexpr index_t L = Model::depth;
  for (const index_t slots : {index_t(1), index_t(4)}) {
    INFO("slots " << slots);
    auto model = Model::make<cuda::Backend<float>>(3);
    infer::Decoder dec(model, slots, D.context);
    std::vector<std::vector<token_t>> prompts;
    for (index_t s = 0; s < slots; ++s) prompts.push_back({token_t(1 + s), token_t(7), token_t(2 * s)});
    dec.prefill(std::span<const std::vector<token_t>>(prompts));
    std::vector<token_t> toks(static_cast<std::size_t>(slots), token_t(5));
    const auto counts = [&](bool graphs) {
      dec.use_graphs(graphs);
      dec.step(std::span<const token_t>(toks));  // op by op (graphs: the first whole step)
      dec.step(std::span<const token_t>(toks));  // graphs: recorded here
      const test::EmuCounters before = test::EmuCounters::now();
      dec.step(std::span<const token_t>(toks));
      return test::EmuCounters::now() - before;
    };
    const test::EmuCounters ops = counts(false), graph = counts(true);
    const index_t weights = L * (3 * D.d_model * D.d_model + D.d_model * D.d_model + 2 * D.d_model * D.d_ff);
    for (const auto& c : {ops, graph}) {
      CHECK(c.gemm_calls == 4 * L + 1);
      CHECK(c.gemm_flops == 2 * slots * (weights + D.vocab * D.d_model));
      CHECK(c.host_waits == 0);
      CHECK(c.allocations == 0);
      CHECK(c.memset_bytes == 0);
      CHECK(c.d2d_bytes == 0);
    }
    CHECK(ops.launches == 4 * L + 2);
    CHECK(ops.graph_launches == 0);
    CHECK(graph.launches == 0);
    CHECK(graph.graph_launches == 1);
  }
}

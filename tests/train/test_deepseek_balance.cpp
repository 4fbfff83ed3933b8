// DeepSeekMoE's auxiliary-loss-free balancing through the Trainer (routers/affinity.hpp, Model::update_buffers):
// the selection bias moves by ±γ (or 0) per optimizer step and never through AdamW; gradient accumulation sums
// the loads of the step's micro-batches (2 × batch 2 gives the update of 1 × batch 4).
#include <catch2/catch.hpp>

#include <mom/mom.hpp>
#include <mom/train/train.hpp>

#include "helpers.hpp"

#include <cmath>
#include <fstream>

using namespace mom;
using namespace mom::train;

namespace {
constexpr Dims tiny{.d_model = 32, .heads = 2, .d_ff = 64, .vocab = 256, .context = 32};
using DS = LM<tiny, DeepSeekMoEStack<2, 1, 6, 2, 2>>;  // γ = 1/1000

TrainConfig config(index_t batch, index_t accum, index_t steps) {
  TrainConfig c;
  c.steps = steps;
  c.batch = batch;
  c.accum = accum;
  c.seq = 16;
  c.lr = 3e-3;
  c.warmup = 0;
  c.eval_interval = 0;
  c.eval_batches = 1;
  c.progress = false;
  c.arch_name = "dsmoe-test";
  c.tokenizer_name = "byte";
  return c;
}

template <class Values>
std::vector<double> slice(const Values& all, std::string_view name) {
  const ParamInfo& p = DS::find(name);
  return {all.begin() + p.offset, all.begin() + p.offset + p.size()};
}
}  // namespace

TEST_CASE("DeepSeekMoE: the selection bias follows the sign rule per optimizer step, summed over micro-batches",
          "[trainer][deepseek]") {
  mom_test::TempDir dir("dsmoe-balance");
  std::string text;
  for (int i = 0; i < 80; ++i) text += "In the beginning God created the heaven and the earth. " + std::to_string(i) + "\n";
  std::ofstream(dir / "text.txt", std::ios::binary) << text;
  const auto prep = prepare_text(dir / "text.txt", dir / "data", ByteTokenizer{}, 0.2);
  TokenFile train(prep.train);

  auto accumulated = DS::make<cpu::Backend<double>>(1);
  auto whole = DS::make<cpu::Backend<double>>(1);
  Trainer two_halves(accumulated, train, nullptr, config(2, 2, 3));
  Trainer one_batch(whole, train, nullptr, config(4, 1, 3));
  two_halves.train_step();
  one_batch.train_step();
  for (const char* b : {"h.0.router.bias", "h.1.router.bias"}) {
    INFO(b);
    const auto bias = slice(accumulated.params(), b);
    CHECK(bias == slice(whole.params(), b));  // the same tokens, the same loads, the same signs
    int moved = 0;
    for (const double v : bias) {
      CHECK((v == 0.0 || std::abs(std::abs(v) - 1e-3) < 1e-15));
      moved += v != 0.0;
    }
    CHECK(moved > 0);
    CHECK(slice(two_halves.adam_m(), b) == std::vector<double>(bias.size(), 0.0));  // AdamW never saw it
  }
  two_halves.train_step();
  two_halves.train_step();
  for (const double v : slice(accumulated.params(), "h.0.router.bias")) {
    const double steps = v / 1e-3;  // a whole number of ±γ moves, at most 3
    CHECK(std::abs(steps - std::round(steps)) < 1e-9);
    CHECK(std::abs(steps) <= 3.0 + 1e-9);
  }
}

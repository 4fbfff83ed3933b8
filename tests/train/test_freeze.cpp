// Per-tensor freezing in the trainer (TrainConfig::freeze, mom-train --freeze; train/trainer.hpp): the glob
// matcher; frozen tensors and buffers stay bit-identical through training while the others move; the
// gradient norm counts the trainable tensors only; the patterns survive a checkpoint and resume; a pattern
// that matches nothing is a one-line error.
#include <catch2/catch.hpp>

#include <mom/mom.hpp>
#include <mom/models/moduleformer_models.hpp>
#include <mom/train/train.hpp>

#include "helpers.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>

using namespace mom;
using namespace mom::train;

namespace {
constexpr Dims tiny{.d_model = 32, .heads = 2, .d_ff = 64, .vocab = 256, .context = 32};
using Tiny = LM<tiny, Dense<2>>;

PreparedData make_data(const mom_test::TempDir& dir) {
  std::string text;
  for (int i = 0; i < 60; ++i) text += "And God said, Let there be light: and there was light.\n";
  std::ofstream(dir / "text.txt", std::ios::binary) << text;
  return prepare_text(dir / "text.txt", dir / "data", ByteTokenizer{}, 0.2);
}

TrainConfig config(const std::filesystem::path& out, index_t steps, std::vector<std::string> freeze) {
  TrainConfig c;
  c.steps = steps;
  c.batch = 4;
  c.seq = 16;
  c.lr = 3e-3;
  c.warmup = 0;
  c.eval_interval = 0;
  c.eval_batches = 1;
  c.out_dir = out;
  c.progress = false;
  c.arch_name = "tiny-test";
  c.tokenizer_name = "byte";
  c.freeze = std::move(freeze);
  return c;
}

template <class Instance>
std::vector<float> tensor(const Instance& m, std::string_view name) {
  const ParamInfo& p = Instance::model_type::find(name);
  return {m.params().begin() + p.offset, m.params().begin() + p.offset + p.size()};
}
}  // namespace

TEST_CASE("freeze: glob patterns over tensor names", "[trainer][freeze]") {
  CHECK(glob_match("h.*.attn.w_qkv", "h.3.attn.w_qkv"));
  CHECK(glob_match("h.*.smoe.w1", "h.12.smoe.w1"));
  CHECK_FALSE(glob_match("h.*.smoe.w1", "h.12.smoe.w1_new"));  // the whole name must match
  CHECK(glob_match("h.*.router.w_a", "h.0.moa.router.w_a"));     // `*` crosses dots
  CHECK(glob_match("ln_?.*", "ln_f.w"));
  CHECK_FALSE(glob_match("ln_?.*", "h.0.ln_1.w"));
  CHECK(glob_match("*", "wte"));
  CHECK(split_patterns("wte,,h.*.ln_*") == std::vector<std::string>{"wte", "h.*.ln_*"});
  const auto mask = freeze_mask<Tiny>({"wte", "h.1.*"});
  for (std::size_t i = 0; i < mask.size(); ++i) {
    const std::string_view n = Tiny::layout[i].name;
    CHECK(mask[i] == (n == "wte" || n.starts_with("h.1.")));
  }
  CHECK_THROWS_WITH(freeze_mask<Tiny>({"h.*.moe.w1"}),
                    Catch::StartsWith("freeze: the pattern 'h.*.moe.w1' matches no tensor of the model"));
}

TEST_CASE("freeze: frozen tensors stay bit-identical, the others train, the norm counts trainable ones only",
          "[trainer][freeze]") {
  mom_test::TempDir dir("freeze");
  const auto prep = make_data(dir);
  TokenFile train(prep.train);
  auto model = Tiny::make<cpu::Backend<float>>(1);
  auto reference = Tiny::make<cpu::Backend<float>>(1);
  const std::vector<std::string> frozen_names{"wte", "h.0.attn.w_qkv", "h.1.ln_2.w"};
  Trainer trainer(model, train, nullptr, config({}, 3, {"wte", "h.0.attn.w_qkv", "h.*.ln_2.w"}));
  CHECK(trainer.frozen_tensors() == 4);  // wte, h.0.attn.w_qkv, h.0.ln_2.w, h.1.ln_2.w
  for (index_t s = 0; s < 3; ++s) trainer.train_step();
  for (const auto& name : frozen_names) CHECK(tensor(model, name) == tensor(reference, name));
  CHECK(tensor(model, "h.1.attn.w_qkv") != tensor(reference, "h.1.attn.w_qkv"));
  CHECK(tensor(model, "h.0.ln_1.w") != tensor(reference, "h.0.ln_1.w"));
  // The norm of the last step is the norm over the trainable tensors of that step's gradient.
  double sq = 0;
  const auto mask = freeze_mask<Tiny>(trainer.config().freeze);
  for (std::size_t i = 0; i < mask.size(); ++i) {
    const ParamInfo& p = Tiny::layout[i];
    for (index_t j = 0; j < p.size(); ++j) {
      const double g = model.grads()[std::size_t(p.offset + j)];
      if (mask[i]) CHECK(g == 0.0);  // zeroed before the norm
      sq += g * g;
    }
  }
  // train_step's norm, read back the way the trainer does (the clip threshold 1 is passed through to AdamW).
  auto& be = model.backend();
  auto norm = be.template alloc<float>(1);
  be.grad_norm(std::span<const float>(model.grads()), norm.data());
  CHECK(double(norm.span()[0]) == Approx(std::sqrt(sq)).epsilon(1e-5));
}

TEST_CASE("freeze: a ModuleFormer's pruning mask is a buffer that never trains", "[trainer][freeze]") {
  using MF = LM<without_positions(tiny), ModuleFormer<1, MoA<3, 2, 8, 4>, SMoE<3, 2, 16, 4>>>;
  mom_test::TempDir dir("freeze-mf");
  const auto prep = make_data(dir);
  TokenFile train(prep.train);
  auto model = MF::make<cpu::Backend<float>>(1);
  Trainer trainer(model, train, nullptr, config({}, 2, {}));
  CHECK(trainer.frozen_tensors() == 2);  // h.0.moa.router.prune, h.0.smoe.router.prune
  CHECK(trainer.frozen_params() == 6);
  for (index_t s = 0; s < 2; ++s) trainer.train_step();
  CHECK(tensor(model, "h.0.smoe.router.prune") == std::vector<float>(3, 0.0f));
}

TEST_CASE("freeze: the patterns are checkpointed; a resumed run keeps them frozen", "[trainer][freeze][resume]") {
  mom_test::TempDir dir("freeze-resume");
  const auto prep = make_data(dir);
  TokenFile train(prep.train);
  auto reference = Tiny::make<cpu::Backend<float>>(1);
  {
    auto model = Tiny::make<cpu::Backend<float>>(1);
    Trainer trainer(model, train, nullptr, config(dir / "run", 2, {"h.1.*"}));
    trainer.run();
  }
  const train::safetensors::File f(train::resolve_checkpoint(dir / "run") / "model.safetensors");
  const auto recorded = nlohmann::json::parse(f.metadata().at("mom.config"));
  CHECK(recorded["freeze"] == nlohmann::json::array({"h.1.*"}));
  auto model = Tiny::make<cpu::Backend<float>>(1);
  Trainer trainer(model, train, nullptr, config(dir / "run", 4, {"h.1.*"}));
  CHECK(trainer.resume(dir / "run") == std::vector<std::string>{"steps 2 -> 4"});
  trainer.run();
  for (const auto& p : Tiny::layout)
    if (std::string_view(p.name).starts_with("h.1.")) CHECK(tensor(model, p.name) == tensor(reference, p.name));
  CHECK(tensor(model, "h.0.attn.w_qkv") != tensor(reference, "h.0.attn.w_qkv"));
  // Resumed with other patterns: they apply from here on and the change is reported.
  auto again = Tiny::make<cpu::Backend<float>>(1);
  Trainer other(again, train, nullptr, config(dir / "run", 5, {}));
  const auto changes = other.resume(dir / "run");
  CHECK(std::find(changes.begin(), changes.end(), "freeze [\"h.1.*\"] -> []") != changes.end());
}

// Per-tensor freezing in the trainer (TrainConfig::freeze, mom-train --freeze; train/trainer.hpp,
// train/checkpoint.hpp): the glob matcher; frozen tensors and buffers stay bit-identical through training
// (no step, no weight decay, moments untouched) while the others move; the gradient norm counts the
// trainable tensors only; the patterns are saved in the checkpoint, restored on resume (or replaced, with one
// line saying so), and older checkpoints without them load as "nothing frozen"; a pattern that matches
// nothing is a one-line error.
#include <catch2/catch.hpp>

#include <mom/mom.hpp>
#include <mom/models/moduleformer_models.hpp>
#include <mom/train/train.hpp>

#include "helpers.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <optional>

using namespace mom;
using namespace mom::train;

namespace {
constexpr Dims tiny{.d_model = 32, .heads = 2, .d_ff = 64, .vocab = 256, .context = 32};
using Tiny = LM<tiny, Dense<2>>;
using Patterns = std::vector<std::string>;

PreparedData make_data(const mom_test::TempDir& dir) {
  std::string text;
  for (int i = 0; i < 60; ++i) text += "And God said, Let there be light: and there was light.\n";
  std::ofstream(dir / "text.txt", std::ios::binary) << text;
  return prepare_text(dir / "text.txt", dir / "data", ByteTokenizer{}, 0.2);
}

// freeze: std::nullopt leaves TrainConfig::freeze unset (a resume restores the checkpoint's patterns).
TrainConfig config(const std::filesystem::path& out, index_t steps, std::optional<Patterns> freeze) {
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
template <class Values>
std::vector<float> slice(const Values& all, std::string_view name) {
  const ParamInfo& p = Tiny::find(name);
  return {all.begin() + p.offset, all.begin() + p.offset + p.size()};
}

bool is_checksum_key(const std::string& k) { return k.rfind("mom.checksum.", 0) == 0 || k == "mom.header_checksum"; }
// Rewrites a (float) checkpoint file with its metadata edited by `edit`, checksums valid again.
template <class Edit>
void rewrite_metadata(const std::filesystem::path& p, Edit edit) {
  std::map<std::string, std::string> meta;
  std::vector<std::pair<safetensors::TensorInfo, std::vector<float>>> tensors;
  {
    const safetensors::File f(p);
    for (const auto& [k, v] : f.metadata())
      if (!is_checksum_key(k)) meta[k] = v;
    for (const auto& info : f.tensors()) {
      std::vector<float> v(std::size_t(info.elements()));
      f.read<float>(info.name, v);
      tensors.emplace_back(info, std::move(v));
    }
  }
  edit(meta);
  safetensors::Writer w;
  for (const auto& [info, values] : tensors) w.add<float>(info.name, values, info.shape);
  for (const auto& [k, v] : meta) w.metadata(k, v);
  w.write(p);
}
}  // namespace

TEST_CASE("freeze: glob patterns over tensor names", "[trainer][freeze]") {
  CHECK(glob_match("h.*.moe.w1", "h.3.moe.w1"));
  CHECK_FALSE(glob_match("h.*.moe.w1", "h.3.moe.w1x"));  // the whole name must match
  CHECK_FALSE(glob_match("h.*.moe.w1", "xh.3.moe.w1"));
  CHECK(glob_match("h.*.attn.w_qkv", "h.3.attn.w_qkv"));
  CHECK(glob_match("h.*.smoe.w1", "h.12.smoe.w1"));
  CHECK_FALSE(glob_match("h.*.smoe.w1", "h.12.smoe.w1_new"));
  CHECK(glob_match("h.*.router.w_a", "h.0.moa.router.w_a"));  // `*` crosses dots
  CHECK(glob_match("h.?.ln_1.w", "h.7.ln_1.w"));
  CHECK_FALSE(glob_match("h.?.ln_1.w", "h.12.ln_1.w"));       // `?` is exactly one character
  CHECK(glob_match("ln_?.*", "ln_f.w"));
  CHECK_FALSE(glob_match("ln_?.*", "h.0.ln_1.w"));
  CHECK(glob_match("*", "wte"));
  CHECK(glob_match("w*e", "wte"));
  CHECK(glob_match("**e", "wte"));
  CHECK_FALSE(glob_match("", "wte"));
  CHECK_FALSE(glob_match("wte", "wt"));
  CHECK(split_patterns("wte,,h.*.ln_*") == Patterns{"wte", "h.*.ln_*"});
  CHECK(split_patterns("").empty());
  CHECK(split_patterns(",").empty());

  const auto mask = freeze_mask<Tiny>({"wte", "h.1.*"});
  REQUIRE(mask.size() == Tiny::layout.size());
  for (std::size_t i = 0; i < mask.size(); ++i) {
    const std::string_view n = Tiny::layout[i].name;
    CHECK(mask[i] == (n == "wte" || n.starts_with("h.1.")));
  }
  CHECK(freeze_mask(std::span<const ParamInfo>(Tiny::layout), {"wte", "h.1.*"}) == mask);  // over any layout
  CHECK(freeze_mask<Tiny>({}) == std::vector<bool>(Tiny::layout.size(), false));
}

TEST_CASE("freeze: a pattern that matches no tensor is a one-line error naming it", "[trainer][freeze]") {
  CHECK_THROWS_WITH(freeze_mask<Tiny>({"wte", "h.*.moe.w1"}),
                    Catch::StartsWith("freeze: the pattern 'h.*.moe.w1' matches no tensor of the model") &&
                        Catch::Contains("tensor names look like 'wte'"));
  try {
    freeze_mask<Tiny>({"h.*.moe.w1"});
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find('\n') == std::string::npos);
  }
  mom_test::TempDir dir("freeze-none");
  const auto prep = make_data(dir);
  TokenFile train(prep.train);
  auto model = Tiny::make<cpu::Backend<float>>(1);
  CHECK_THROWS_WITH(Trainer(model, train, nullptr, config({}, 2, Patterns{"h.9.*"})),
                    Catch::StartsWith("freeze: the pattern 'h.9.*' matches no tensor of the model"));
}

TEST_CASE("freeze: frozen tensors stay bit-identical (no step, no decay, moments untouched), the others train",
          "[trainer][freeze]") {
  mom_test::TempDir dir("freeze");
  const auto prep = make_data(dir);
  TokenFile train(prep.train);
  auto model = Tiny::make<cpu::Backend<float>>(1);
  auto reference = Tiny::make<cpu::Backend<float>>(1);
  const Patterns frozen_names{"wte", "h.0.attn.w_qkv", "h.0.ln_2.w", "h.1.ln_2.w"};
  auto cfg = config({}, 3, Patterns{"wte", "h.0.attn.w_qkv", "h.*.ln_2.w"});
  cfg.weight_decay = 0.5;  // large: a decayed frozen matrix would move even with a zero gradient
  Trainer trainer(model, train, nullptr, cfg);
  CHECK(trainer.frozen_tensors() == 4);  // wte, h.0.attn.w_qkv, h.0.ln_2.w, h.1.ln_2.w
  index_t frozen_params = 0;
  for (const auto& name : frozen_names) frozen_params += Tiny::find(name).size();
  CHECK(trainer.frozen_params() == frozen_params);
  CHECK(trainer.trainable_params() == Tiny::params - frozen_params);
  CHECK(trainer.freeze_summary() == "freeze: 3 patterns, 4 tensors, " + mom::detail::with_commas(frozen_params) +
                                        " of " + mom::detail::with_commas(Tiny::params) + " parameters frozen, " +
                                        mom::detail::with_commas(Tiny::params - frozen_params) + " trainable");
  for (index_t s = 0; s < 3; ++s) trainer.train_step();
  for (const auto& name : frozen_names) {
    CHECK(tensor(model, name) == tensor(reference, name));
    CHECK(slice(trainer.adam_m(), name) == std::vector<float>(std::size_t(Tiny::find(name).size()), 0.f));
    CHECK(slice(trainer.adam_v(), name) == std::vector<float>(std::size_t(Tiny::find(name).size()), 0.f));
  }
  for (const auto& p : Tiny::layout) {
    if (trainer.frozen()[std::size_t(&p - Tiny::layout.data())]) continue;
    INFO(p.name);
    CHECK(tensor(model, p.name) != tensor(reference, p.name));  // every trainable tensor moved
  }
}

TEST_CASE("freeze: the gradient norm (the one clipping uses) counts the trainable tensors only", "[trainer][freeze]") {
  mom_test::TempDir dir("freeze-norm");
  const auto prep = make_data(dir);
  TokenFile train(prep.train);
  // The same initialisation and data: step 1 computes the same full gradient in both runs.
  auto frozen_model = Tiny::make<cpu::Backend<float>>(1);
  auto full_model = Tiny::make<cpu::Backend<float>>(1);
  Trainer frozen(frozen_model, train, nullptr, config({}, 1, Patterns{"wte", "h.0.*"}));
  Trainer full(full_model, train, nullptr, config({}, 1, std::nullopt));
  frozen.train_step();
  full.train_step();
  double trainable_sq = 0, all_sq = 0;
  for (std::size_t i = 0; i < Tiny::layout.size(); ++i) {
    const ParamInfo& p = Tiny::layout[i];
    for (index_t j = 0; j < p.size(); ++j) {
      const double g = full_model.grads()[std::size_t(p.offset + j)];
      all_sq += g * g;
      if (!frozen.frozen()[i]) trainable_sq += g * g;
      // The frozen run zeroed its frozen tensors' gradients before the norm; the others are the full run's.
      CHECK(double(frozen_model.grads()[std::size_t(p.offset + j)]) == (frozen.frozen()[i] ? 0.0 : g));
    }
  }
  REQUIRE(trainable_sq < all_sq * 0.99);  // the frozen tensors carry part of the norm
  CHECK(frozen.last_grad_norm() == Approx(std::sqrt(trainable_sq)).epsilon(1e-5));
  CHECK(full.last_grad_norm() == Approx(std::sqrt(all_sq)).epsilon(1e-5));
}

TEST_CASE("freeze: a ModuleFormer's pruning mask is a buffer that never trains", "[trainer][freeze]") {
  using MF = LM<without_positions(tiny), ModuleFormer<1, MoA<3, 2, 8, 4>, SMoE<3, 2, 16, 4>>>;
  mom_test::TempDir dir("freeze-mf");
  const auto prep = make_data(dir);
  TokenFile train(prep.train);
  auto model = MF::make<cpu::Backend<float>>(1);
  Trainer trainer(model, train, nullptr, config({}, 2, std::nullopt));
  CHECK(trainer.frozen_tensors() == 2);  // h.0.moa.router.prune, h.0.smoe.router.prune
  CHECK(trainer.frozen_params() == 6);
  CHECK(trainer.freeze_summary().starts_with("freeze: 0 patterns, 2 tensors (2 of them buffers), 6 of "));
  for (index_t s = 0; s < 2; ++s) trainer.train_step();
  CHECK(tensor(model, "h.0.smoe.router.prune") == std::vector<float>(3, 0.0f));
}

TEST_CASE("freeze: the patterns are checkpointed and restored on resume, other patterns win and are reported",
          "[trainer][freeze][resume]") {
  mom_test::TempDir dir("freeze-resume");
  const auto prep = make_data(dir);
  TokenFile train(prep.train);
  const auto reference = Tiny::make<cpu::Backend<float>>(1);
  auto is_h1 = [](std::string_view name) { return name.starts_with("h.1."); };
  {  // 2 of 4 steps, then a checkpoint: as if interrupted
    auto model = Tiny::make<cpu::Backend<float>>(1);
    Trainer trainer(model, train, nullptr, config(dir / "run", 4, Patterns{"h.1.*"}));
    trainer.train_step();
    trainer.train_step();
    trainer.save();
  }
  const auto step2 = resolve_checkpoint(dir / "run");
  CHECK(safetensors::File(step2 / "optimizer.safetensors").meta("mom.freeze") == R"(["h.1.*"])");
  const auto recorded = nlohmann::json::parse(safetensors::File(step2 / "model.safetensors").meta("mom.config"));
  CHECK(recorded["freeze"] == nlohmann::json::array({"h.1.*"}));
  // The uninterrupted 4-step run with the same patterns, to compare the resumed one with.
  auto straight = Tiny::make<cpu::Backend<float>>(1);
  Trainer(straight, train, nullptr, config(dir / "straight", 4, Patterns{"h.1.*"})).run();

  SECTION("resumed without patterns of its own: the checkpoint's are restored, nothing reported") {
    auto model = Tiny::make<cpu::Backend<float>>(1);
    Trainer trainer(model, train, nullptr, config(dir / "run", 4, std::nullopt));
    CHECK(trainer.frozen_tensors() == 0);
    CHECK(trainer.resume(dir / "run").empty());
    CHECK(trainer.config().freeze == Patterns{"h.1.*"});
    CHECK(trainer.frozen() == freeze_mask<Tiny>({"h.1.*"}));
    trainer.run();
    for (const auto& p : Tiny::layout) {
      INFO(p.name);
      if (is_h1(p.name)) CHECK(tensor(model, p.name) == tensor(reference, p.name));
      else CHECK(tensor(model, p.name) != tensor(reference, p.name));
    }
    // The same training as the uninterrupted run, bit for bit.
    CHECK(std::equal(model.params().begin(), model.params().end(), straight.params().begin()));
    CHECK(safetensors::File(resolve_checkpoint(dir / "run") / "optimizer.safetensors").meta("mom.freeze") ==
          R"(["h.1.*"])");
  }
  SECTION("resumed with the same patterns: nothing reported") {
    auto model = Tiny::make<cpu::Backend<float>>(1);
    Trainer trainer(model, train, nullptr, config(dir / "run", 4, Patterns{"h.1.*"}));
    CHECK(trainer.resume(dir / "run").empty());
    trainer.run();
    CHECK(std::equal(model.params().begin(), model.params().end(), straight.params().begin()));
  }
  SECTION("resumed with other patterns: they win, and one line says so") {
    auto model = Tiny::make<cpu::Backend<float>>(1);
    Trainer trainer(model, train, nullptr, config(dir / "run", 3, Patterns{"wte"}));
    CHECK(trainer.resume(dir / "run") == Patterns{R"(freeze ["h.1.*"] -> ["wte"])", "steps 4 -> 3"});
    const std::vector<float> at2(model.params().begin(), model.params().end());
    trainer.run();
    CHECK(slice(model.params(), "wte") == slice(at2, "wte"));
    CHECK(slice(model.params(), "h.1.attn.w_qkv") != slice(at2, "h.1.attn.w_qkv"));  // unfrozen: trains now
    CHECK(safetensors::File(resolve_checkpoint(dir / "run") / "optimizer.safetensors").meta("mom.freeze") ==
          R"(["wte"])");
  }
  SECTION("resumed with an empty list: everything trains") {
    auto model = Tiny::make<cpu::Backend<float>>(1);
    Trainer trainer(model, train, nullptr, config(dir / "run", 4, Patterns{}));
    CHECK(trainer.resume(dir / "run") == Patterns{R"(freeze ["h.1.*"] -> [])"});
    CHECK(trainer.frozen_tensors() == 0);
  }
  SECTION("a checkpoint from before mom.freeze means nothing frozen (or its mom.config's list)") {
    rewrite_metadata(step2 / "optimizer.safetensors", [](auto& meta) {
      meta.erase("mom.freeze");
      meta.erase("mom.model_checksum");  // also newer than that version (and the model file is edited below)
    });
    {  // the first --freeze version recorded the patterns in mom.config only
      auto model = Tiny::make<cpu::Backend<float>>(1);
      Trainer trainer(model, train, nullptr, config(dir / "run", 4, std::nullopt));
      CHECK(trainer.resume(dir / "run").empty());
      CHECK(trainer.config().freeze == Patterns{"h.1.*"});
    }
    rewrite_metadata(step2 / "model.safetensors", [](auto& meta) {
      auto config = nlohmann::json::parse(meta.at("mom.config"));
      config.erase("freeze");
      meta["mom.config"] = config.dump();
    });
    {
      auto model = Tiny::make<cpu::Backend<float>>(1);
      Trainer trainer(model, train, nullptr, config(dir / "run", 4, std::nullopt));
      CHECK(trainer.resume(dir / "run").empty());
      CHECK(trainer.config().freeze == Patterns{});
      CHECK(trainer.frozen_tensors() == 0);
    }
    {  // patterns given to a resumed old checkpoint: a change from "nothing frozen"
      auto model = Tiny::make<cpu::Backend<float>>(1);
      Trainer trainer(model, train, nullptr, config(dir / "run", 4, Patterns{"wte"}));
      CHECK(trainer.resume(dir / "run") == Patterns{R"(freeze [] -> ["wte"])"});
    }
  }
  SECTION("a recorded pattern that matches nothing, or a malformed list, is refused before loading") {
    for (const auto& [bad, message] : std::vector<std::pair<std::string, std::string>>{
             {R"(["nope"])", "optimizer metadata mom.freeze: freeze: the pattern 'nope' matches no tensor"},
             {R"("h.1.*")", "optimizer metadata mom.freeze is not a JSON array of strings"},
             {R"([1])", "optimizer metadata mom.freeze is not a JSON array of strings"}}) {
      INFO(bad);
      rewrite_metadata(step2 / "optimizer.safetensors", [&](auto& meta) { meta["mom.freeze"] = bad; });
      auto model = Tiny::make<cpu::Backend<float>>(7);
      const std::vector<float> before(model.params().begin(), model.params().end());
      Trainer trainer(model, train, nullptr, config(dir / "run", 4, std::nullopt));
      CHECK_THROWS_WITH(trainer.resume(dir / "run"), Catch::Contains(message));
      CHECK(std::equal(before.begin(), before.end(), model.params().begin()));  // untouched
    }
  }
}

// Trainer: schedule, learning, bit-identical resume, checkpoint refusal (corrupted, truncated, other
// architecture), and bad configurations.
#include <catch2/catch.hpp>

#include <mom/mom.hpp>
#include <mom/modules/sigma_moe.hpp>
#include <mom/testing/counting_backend.hpp>
#include <mom/train/train.hpp>

#include "helpers.hpp"

#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

using namespace mom;
using namespace mom::train;
using mom_test::read_bytes;
using mom_test::write_bytes;

namespace {

constexpr Dims tiny{.d_model = 32, .heads = 2, .d_ff = 64, .vocab = 256, .context = 32};
using Tiny = LM<tiny, Dense<2>>;
using Tiny3 = LM<tiny, Dense<3>>;
using Instance = decltype(Tiny::make<cpu::Backend<float>>(1));

std::string corpus() {
  std::string text;
  const char* lines[] = {"In the beginning God created the heaven and the earth.\n",
                         "And the earth was without form, and void.\n",
                         "And God said, Let there be light: and there was light.\n"};
  for (int i = 0; i < 60; ++i) text += lines[i % 3];
  return text;
}

// train.bin / val.bin of the byte-level corpus in dir.
PreparedData make_data(const mom_test::TempDir& dir) {
  std::ofstream(dir / "text.txt", std::ios::binary) << corpus();
  return prepare_text(dir / "text.txt", dir / "data", ByteTokenizer{}, 0.2);
}

TrainConfig small_config(const std::filesystem::path& out, index_t steps) {
  TrainConfig c;
  c.steps = steps;
  c.batch = 4;
  c.seq = 16;
  c.lr = 3e-3;
  c.warmup = 2;
  c.eval_interval = 0;
  c.eval_batches = 2;
  c.out_dir = out;
  c.progress = false;
  c.arch_name = "tiny-test";
  c.tokenizer_name = "byte";
  return c;
}


}  // namespace

TEST_CASE("learning rate: linear warm-up, cosine to the floor", "[trainer]") {
  TrainConfig c;
  c.lr = 1e-3;
  c.warmup = 10;
  c.steps = 110;
  c.min_lr_ratio = 0.1;
  CHECK(learning_rate(c, 1) == Approx(1e-4));
  CHECK(learning_rate(c, 10) == Approx(1e-3));
  CHECK(learning_rate(c, 60) == Approx(0.55e-3));  // half way through the cosine: (lr + min) / 2
  CHECK(learning_rate(c, 110) == Approx(1e-4));
  CHECK(learning_rate(c, 200) == Approx(1e-4));
}

TEST_CASE("the validation loss is the cross-entropy alone, not the objective with the auxiliary losses", "[trainer]") {
  // σ-MoE's entropy regulariser is negative and large here (γ = 1/2): the objective and the cross-entropy
  // differ by it, and evaluate() reports the cross-entropy.
  using Moe = LM<tiny, Assembly<Router<Share<Cycle<1>>>, ModuleSet<MHA<1>, FFN<1, SigmaMoE<4, 2, 8, PeriNorm, std::ratio<1, 2>>::type>>,
                                K<1>, H<2>>>;
  mom_test::TempDir dir("val-ce");
  auto prep = make_data(dir);
  TokenFile train(prep.train), val(prep.val);
  auto model = Moe::make<cpu::Backend<float>>(1);
  auto cfg = small_config({}, 1);
  Trainer trainer(model, train, &val, cfg);
  const double reported = trainer.evaluate();
  double ce = 0, objective = 0;
  std::vector<token_t> in(std::size_t(cfg.batch * cfg.seq)), tg(in.size());
  for (index_t i = 0; i < cfg.eval_batches; ++i) {
    eval_batch(val, cfg.batch, cfg.seq, i, in, tg);
    objective += double(model.forward(in, tg, cfg.batch, cfg.seq));
    ce += double(model.cross_entropy());
  }
  ce /= double(cfg.eval_batches);
  objective /= double(cfg.eval_batches);
  CHECK(reported == Approx(ce).epsilon(1e-6));
  CHECK(objective < ce - 0.5);  // the regulariser: 2 uses × γ · (Σ p log p ≈ −log 4)
}

TEST_CASE("trainer learns: validation loss falls well below the unigram entropy", "[trainer]") {
  mom_test::TempDir dir("learn");
  auto prep = make_data(dir);
  TokenFile train(prep.train), val(prep.val);
  auto model = Tiny::make<cpu::Backend<float>>(1);
  auto cfg = small_config({}, 400);
  cfg.batch = 8;
  cfg.lr = 1e-2;
  cfg.warmup = 20;
  cfg.eval_interval = 0;
  Trainer trainer(model, train, &val, cfg);
  const double before = trainer.evaluate();
  CHECK(before == Approx(std::log(256.0)).margin(0.3));  // GPT-2 init: near-uniform predictions
  auto result = trainer.run();
  REQUIRE(result.final_val_loss.has_value());
  const double h = unigram_entropy(train);
  INFO("unigram entropy " << h << " nats, val loss " << *result.final_val_loss);
  CHECK(*result.final_val_loss < 0.5 * h);  // a 3-line text repeated is easy once context is used
  CHECK(result.losses.size() == 400);
  CHECK(result.losses.back() < result.losses.front());
}

TEST_CASE("resume continues bit-identically", "[trainer][checkpoint][resume]") {
  mom_test::TempDir dir("resume");
  auto prep = make_data(dir);
  TokenFile train(prep.train), val(prep.val);
  const index_t N = 4;
  // Uninterrupted: 2N steps, with gradient accumulation and clipping active.
  auto cfg_full = small_config(dir / "full", 2 * N);
  cfg_full.accum = 2;
  cfg_full.grad_clip = 0.5;
  auto model_a = Tiny::make<cpu::Backend<float>>(3);
  Trainer ta(model_a, train, &val, cfg_full);
  const auto full = ta.run();
  REQUIRE(full.losses.size() == 2 * N);

  // Interrupted: N steps, save, then a new process-like start: fresh model with another seed, resume, N more.
  auto cfg_half = cfg_full;
  cfg_half.out_dir = dir / "half";
  cfg_half.checkpoint_interval = N;
  auto model_b = Tiny::make<cpu::Backend<float>>(3);
  {
    Trainer tb(model_b, train, &val, cfg_half);
    tb.train_step();
    for (index_t s = 1; s < N; ++s) tb.train_step();
    tb.save();
  }
  auto model_c = Tiny::make<cpu::Backend<float>>(99);
  Trainer tc(model_c, train, &val, cfg_half);
  CHECK(tc.resume(dir / "half").empty());  // the same configuration: nothing changed
  CHECK(tc.step() == N);
  {  // a changed configuration is applied and listed; another tokenizer is refused
    auto cfg_lr = cfg_half;
    cfg_lr.lr = 1e-3;
    cfg_lr.steps = 3 * N;
    auto model_d = Tiny::make<cpu::Backend<float>>(5);
    Trainer td(model_d, train, &val, cfg_lr);
    CHECK(td.resume(dir / "half") == std::vector<std::string>{"lr 0.003 -> 0.001", "steps 8 -> 12"});
    cfg_lr.tokenizer_name = "gpt2";
    Trainer te(model_d, train, &val, cfg_lr);
    CHECK_THROWS_WITH(te.resume(dir / "half"), Catch::Contains("the checkpoint was trained on \"byte\" tokens"));
  }
  const auto rest = tc.run();
  REQUIRE(rest.losses.size() == N);
  for (index_t i = 0; i < N; ++i) {
    INFO("step " << N + i + 1);
    CHECK(rest.losses[static_cast<std::size_t>(i)] == full.losses[static_cast<std::size_t>(N + i)]);  // exact
  }
  CHECK(std::memcmp(model_a.params().data(), model_c.params().data(), model_a.params().size_bytes()) == 0);
  CHECK(std::memcmp(ta.adam_v().data(), tc.adam_v().data(), ta.adam_v().size_bytes()) == 0);
}

TEST_CASE("checkpoint files: safetensors layout names, metadata, latest pointer", "[trainer][checkpoint]") {
  mom_test::TempDir dir("ckpt");
  auto prep = make_data(dir);
  TokenFile train(prep.train);
  auto model = Tiny::make<cpu::Backend<float>>(1);
  Trainer t(model, train, nullptr, small_config(dir / "run", 2));
  t.run();
  CHECK(read_bytes(dir / "run" / "latest") == "step-000002\n");
  safetensors::File f(dir / "run" / "step-000002" / "model.safetensors");
  CHECK(f.tensors().size() == Tiny::layout.size());
  CHECK(f.meta("mom.describe") == describe<Tiny>());
  CHECK(f.meta("mom.step") == "2");
  CHECK(f.meta("format") == "pt");
  const auto* wte = f.find("wte");
  REQUIRE(wte != nullptr);
  CHECK(wte->shape == std::vector<std::int64_t>{256, 32});
  const auto* ln = f.find("ln_f.b");
  REQUIRE(ln != nullptr);
  CHECK(ln->shape == std::vector<std::int64_t>{32});
  std::vector<float> w(256 * 32);
  f.read<float>("wte", w);
  CHECK(std::memcmp(w.data(), model.params().data(), w.size() * sizeof(float)) == 0);
  // Saving the same step again never writes into the folder `latest` names, and keeps one folder per step:
  // step-N.1 replaces step-N once `latest` moved, then step-N replaces step-N.1.
  t.save();
  CHECK(read_bytes(dir / "run" / "latest") == "step-000002.1\n");
  CHECK_FALSE(std::filesystem::exists(dir / "run" / "step-000002"));
  t.save();
  CHECK(read_bytes(dir / "run" / "latest") == "step-000002\n");
  CHECK_FALSE(std::filesystem::exists(dir / "run" / "step-000002.1"));
}

TEST_CASE("corrupted, truncated and other-architecture checkpoints are refused", "[trainer][checkpoint][bad-input]") {
  mom_test::TempDir dir("refuse");
  auto prep = make_data(dir);
  TokenFile train(prep.train);
  auto model = Tiny::make<cpu::Backend<float>>(1);
  Trainer t(model, train, nullptr, small_config(dir / "run", 1));
  t.run();
  const auto step_dir = dir / "run" / "step-000001";
  const std::string good = read_bytes(step_dir / "model.safetensors");
  const std::string good_opt = read_bytes(step_dir / "optimizer.safetensors");

  auto fresh = Tiny::make<cpu::Backend<float>>(7);
  std::vector<float> before(fresh.params().begin(), fresh.params().end());
  auto untouched = [&] { return std::memcmp(before.data(), fresh.params().data(), before.size() * 4) == 0; };
  Trainer tf(fresh, train, nullptr, small_config(dir / "other", 1));

  SECTION("truncated model file") {
    write_bytes(step_dir / "model.safetensors", good.substr(0, good.size() - 100));
    CHECK_THROWS_WITH(tf.resume(dir / "run"), Catch::Contains("is truncated"));
  }
  SECTION("truncated optimizer file") {
    write_bytes(step_dir / "optimizer.safetensors", good_opt.substr(0, good_opt.size() / 2));
    CHECK_THROWS_WITH(tf.resume(dir / "run"), Catch::Contains("optimizer.safetensors' is truncated"));
  }
  SECTION("corrupted header JSON") {
    std::string bad = good;
    bad[8] = '#';  // the header's opening brace
    write_bytes(step_dir / "model.safetensors", bad);
    CHECK_THROWS_WITH(tf.resume(dir / "run"), Catch::Contains("header is not valid JSON"));
  }
  SECTION("offsets out of range") {
    std::string bad = good;
    const auto at = bad.find("\"data_offsets\":[0,");
    REQUIRE(at != std::string::npos);
    bad[at + 17] = '8';  // "[0," -> "[8," : the first tensor no longer starts at 0
    write_bytes(step_dir / "model.safetensors", bad);
    CHECK_THROWS_WITH(tf.resume(dir / "run"), Catch::Contains("is corrupted"));
  }
  SECTION("files from different saves") {
    t.save();  // a second folder with another checkpoint id
    write_bytes(dir / "run" / "step-000001.1" / "optimizer.safetensors", good_opt);
    CHECK_THROWS_WITH(tf.resume(dir / "run"), Catch::Contains("come from different saves"));
  }
  SECTION("different architecture") {
    auto other = Tiny3::make<cpu::Backend<float>>(1);
    Trainer t3(other, train, nullptr, small_config(dir / "run3", 1));
    t3.run();
    CHECK_THROWS_WITH(tf.resume(dir / "run3"), Catch::Contains("is a different architecture") &&
                                                   Catch::Contains("Dense<3>") && Catch::Contains("Dense<2>"));
  }
  SECTION("missing checkpoint") {
    CHECK_THROWS_WITH(tf.resume(dir / "nowhere"), Catch::Contains("does not exist"));
    CHECK_THROWS_WITH(tf.resume(dir.path), Catch::Contains("no checkpoint in"));
  }
  CHECK(untouched());
  CHECK(tf.step() == 0);
}

TEST_CASE("a resume refuses token files other than those the checkpoint records", "[trainer][checkpoint][bad-input]") {
  mom_test::TempDir dir("datarec");
  auto prep = make_data(dir);
  TokenFile train(prep.train), val(prep.val);
  auto model = Tiny::make<cpu::Backend<float>>(1);
  Trainer t(model, train, &val, small_config(dir / "run", 1));
  t.run();
  const safetensors::File f(dir / "run" / "step-000001" / "model.safetensors");
  const auto rec = nlohmann::json::parse(f.meta("mom.data"));
  CHECK(rec["train"]["checksum"] == train.checksum());
  CHECK(rec["train"]["tokens"] == train.size());
  CHECK(rec["val"]["checksum"] == val.checksum());
  CHECK(train.checksum() == checksum::format(checksum::xxh64(read_bytes(prep.train))));

  auto fresh = Tiny::make<cpu::Backend<float>>(7);
  SECTION("train.bin and val.bin swapped") {
    Trainer tf(fresh, val, &train, small_config(dir / "other", 2));
    CHECK_THROWS_WITH(tf.resume(dir / "run"), Catch::Contains("the training and validation files are swapped"));
  }
  SECTION("other training data") {
    std::ofstream(dir / "other.txt", std::ios::binary) << corpus() << "Amen.\n";
    auto other = prepare_text(dir / "other.txt", dir / "data2", ByteTokenizer{}, 0.2);
    TokenFile train2(other.train);
    Trainer tf(fresh, train2, &val, small_config(dir / "other", 2));
    CHECK_THROWS_WITH(tf.resume(dir / "run"), Catch::Contains("the training data '" + other.train.string() +
                                                              "' is not the file this run trained on"));
  }
  SECTION("no validation file where the run had one") {
    Trainer tf(fresh, train, nullptr, small_config(dir / "other", 2));
    CHECK_THROWS_WITH(tf.resume(dir / "run"), Catch::Contains("this run validated on a file of " +
                                                              std::to_string(val.size()) + " tokens and none is given"));
  }
  SECTION("the same files resume") {
    Trainer tf(fresh, train, &val, small_config(dir / "other", 2));
    CHECK(tf.resume(dir / "run") == std::vector<std::string>{"steps 1 -> 2"});
    CHECK(tf.step() == 1);
  }
}

TEST_CASE("a save that cannot write leaves the good checkpoint in place", "[trainer][checkpoint][atomic]") {
  mom_test::TempDir dir("failsave");
  auto prep = make_data(dir);
  TokenFile train(prep.train);
  auto model = Tiny::make<cpu::Backend<float>>(1);
  Trainer t(model, train, nullptr, small_config(dir / "run", 1));
  t.run();
  const std::string good = read_bytes(dir / "run" / "step-000001" / "model.safetensors");
  t.train_step();
  // `latest` cannot be replaced (a non-empty directory sits in its way): the new step folder is written,
  // but the save fails before `latest` moves, so the checkpoint it named stays the one loaded.
  std::filesystem::remove(dir / "run" / "latest");
  std::filesystem::create_directories(dir / "run" / "latest" / "blocker");
  CHECK_THROWS_WITH(t.save(), Catch::Contains("cannot write") && Catch::Contains("latest"));
  CHECK(read_bytes(dir / "run" / "step-000001" / "model.safetensors") == good);
  // Output directory that cannot be created (its parent is a regular file): refused before any write.
  std::ofstream(dir / "file.txt") << "x";
  auto cfg = small_config(dir / "file.txt" / "run", 1);
  Trainer t2(model, train, nullptr, cfg);
  CHECK_THROWS_WITH(t2.run(), Catch::Contains("cannot create output directory"));
}

TEST_CASE("trainer bad configuration: seq > context, vocab mismatch, too little data", "[trainer][bad-input]") {
  mom_test::TempDir dir("badcfg");
  auto prep = make_data(dir);
  TokenFile train(prep.train);
  auto model = Tiny::make<cpu::Backend<float>>(1);
  auto cfg = small_config({}, 1);
  cfg.seq = 33;
  CHECK_THROWS_WITH(Trainer(model, train, nullptr, cfg), Catch::Contains("seq 33 exceeds the model's context 32"));
  cfg.seq = 16;
  write_token_file(dir / "big.bin", std::vector<token_t>(100, 300), 50257, "gpt2");
  TokenFile big(dir / "big.bin");
  CHECK_THROWS_WITH(Trainer(model, big, nullptr, cfg),
                    Catch::Contains("has vocab 50257 (gpt2) but the model's vocab is 256"));
  write_token_file(dir / "tiny.bin", std::vector<token_t>(10, 65), 256, "byte");
  TokenFile few(dir / "tiny.bin");
  CHECK_THROWS_WITH(Trainer(model, few, nullptr, cfg), Catch::Contains("fewer than seq + 1 = 17"));
  cfg.lr = -1;
  CHECK_THROWS_WITH(Trainer(model, train, nullptr, cfg), Catch::Contains("lr -1 must be a finite number > 0"));
}

TEST_CASE("TrainConfig::check: every value in range, counts bounded so nothing overflows", "[trainer][bad-input]") {
  const auto base = small_config({}, 1);
  CHECK_NOTHROW(base.check());
  auto with = [&](auto set) {
    auto c = base;
    set(c);
    return c;
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  CHECK_THROWS_WITH(with([](auto& c) { c.weight_decay = -100; }).check(), Catch::Contains("weight_decay -100 must be"));
  CHECK_THROWS_WITH(with([&](auto& c) { c.grad_clip = nan; }).check(), Catch::Contains("grad_clip nan must be"));
  CHECK_THROWS_WITH(with([](auto& c) { c.grad_clip = -1; }).check(), Catch::Contains("grad_clip -1 must be"));
  CHECK_THROWS_WITH(with([](auto& c) { c.min_lr_ratio = -5; }).check(), Catch::Contains("min_lr_ratio -5 must be in [0, 1]"));
  CHECK_THROWS_WITH(with([](auto& c) { c.eval_interval = -1; }).check(), Catch::Contains("eval_interval -1 must be >= 0"));
  CHECK_THROWS_WITH(with([](auto& c) { c.checkpoint_interval = -1; }).check(),
                    Catch::Contains("checkpoint_interval -1 must be >= 0"));
  CHECK_THROWS_WITH(with([](auto& c) { c.log_interval = 0; }).check(), Catch::Contains("log_interval 0 must be > 0"));
  CHECK_THROWS_WITH(with([](auto& c) { c.steps = index_t(1) << 62; }).check(), Catch::Contains("must be in [1, 1000000000]"));
  CHECK_THROWS_WITH(with([](auto& c) { c.accum = index_t(1) << 62; }).check(), Catch::Contains("accum"));
  CHECK_THROWS_WITH(with([](auto& c) { c.batch = 100'000'000, c.seq = 32; }).check(), Catch::Contains("tokens per micro-batch exceed"));
  CHECK_THROWS_WITH(with([](auto& c) { c.beta2 = 1; }).check(), Catch::Contains("AdamW betas"));
}

TEST_CASE("divergence: non-finite steps are skipped, the run stops after max_skipped_steps, no bad checkpoint",
          "[trainer][divergence]") {
  mom_test::TempDir dir("diverge");
  auto prep = make_data(dir);
  TokenFile train(prep.train), val(prep.val);
  const auto all_finite = [](std::span<const float> x) {
    return std::all_of(x.begin(), x.end(), [](float v) { return std::isfinite(v); });
  };
  SECTION("a NaN parameter: every step is skipped, the run stops after max_skipped_steps, nothing saved") {
    // (with checkpoint_interval 1 the save at step 1 would stop it first: its check forward gives NaN)
    auto model = Tiny::make<cpu::Backend<float>>(1);
    const auto& ln = Tiny::find("ln_f.w");
    model.params()[std::size_t(ln.offset)] = std::numeric_limits<float>::quiet_NaN();
    const std::vector<float> before(model.params().begin(), model.params().end());
    auto cfg = small_config(dir / "nan", 20);
    cfg.max_skipped_steps = 3;
    Trainer trainer(model, train, &val, cfg);
    CHECK_THROWS_WITH(trainer.run(), Catch::Contains("training diverged: 3 steps in a row (to step 3)"));
    CHECK(trainer.step() == 3);
    CHECK(std::memcmp(before.data(), model.params().data(), before.size() * sizeof(float)) == 0);  // nothing applied
    CHECK(all_finite(trainer.adam_m()));
    CHECK(all_finite(trainer.adam_v()));
    CHECK_FALSE(has_checkpoint(dir / "nan"));
  }
  SECTION("a learning rate of 50: the run fails, every checkpoint it left is finite and gives a finite loss") {
    auto model = Tiny::make<cpu::Backend<float>>(1);
    auto cfg = small_config(dir / "lr", 200);
    cfg.lr = 50;
    cfg.weight_decay = 0;  // (lr x weight_decay must stay below 1)
    cfg.warmup = 0;
    cfg.grad_clip = 0;
    cfg.checkpoint_interval = 1;
    cfg.eval_interval = 1;
    Trainer trainer(model, train, &val, cfg);
    CHECK_THROWS_WITH(trainer.run(), Catch::Contains("training diverged"));
    CHECK(trainer.step() < 200);
    CHECK(all_finite(trainer.adam_v()));  // no +Inf from an overflowing g² (cpu::adamw_skips)
    if (has_checkpoint(dir / "lr")) {
      auto loaded = Tiny::make<cpu::Backend<float>>(2);
      std::vector<float> m(Tiny::params), v(Tiny::params);
      TrainState st;
      Checkpointer<Instance>::load(dir / "lr", loaded, m, v, st);
      CHECK(all_finite(loaded.params()));
      CHECK(all_finite(m));
      CHECK(all_finite(v));
      std::vector<token_t> in(std::size_t(cfg.batch * cfg.seq)), tg(in.size());
      eval_batch(val, cfg.batch, cfg.seq, 0, in, tg);
      loaded.reserve(cfg.batch, cfg.seq);
      CHECK(std::isfinite(loaded.forward(in, tg, cfg.batch, cfg.seq)));
    }
  }
  CHECK_THROWS_WITH(([] {
                      TrainConfig c;
                      c.max_skipped_steps = 0;
                      c.check();
                    }()),
                    Catch::Contains("max_skipped_steps 0 must be in [1, 1000000000]"));
}

TEST_CASE("a finite blow-up is divergence: no checkpoint of parameters above 2 ln(vocab)", "[trainer][divergence]") {
  mom_test::TempDir dir("blowup");
  auto prep = make_data(dir);
  TokenFile train(prep.train), val(prep.val);
  auto model = Tiny::make<cpu::Backend<float>>(1);
  Trainer trainer(model, train, &val, small_config(dir / "run", 10));
  trainer.train_step();
  trainer.save();  // sane: saved
  REQUIRE(read_latest(dir / "run") == "step-000001");
  CHECK(trainer.evaluate() <= trainer.divergence_bound());
  // Finite but exploded parameters (the head's logits scaled by 1000): a cross-entropy far above 2 ln(256).
  for (float& x : model.params().subspan(0, std::size_t(Tiny::find("wte").size()))) x *= 1000.0f;
  trainer.train_step();
  CHECK_THROWS_WITH(trainer.save(), Catch::Contains("training diverged at step 2: the last batch's cross-entropy") &&
                                        Catch::Contains("is above 2 ln(vocab) = 11.09"));
  CHECK(read_latest(dir / "run") == "step-000001");  // the sane checkpoint stays latest
  // run() stops at a validation above the bound, before its checkpoint.
  auto cfg = small_config(dir / "run2", 3);
  cfg.eval_interval = 1;
  cfg.lr = 1e-6;  // the blow-up stays
  Trainer blown(model, train, &val, cfg);
  CHECK_THROWS_WITH(blown.run(), Catch::Contains("training diverged at step 1: validation loss is") &&
                                     Catch::Contains("(above 2 ln(vocab) = 11.09"));
  CHECK_FALSE(has_checkpoint(dir / "run2"));
}

TEST_CASE("docs/read_checkpoint.py reads a checkpoint with numpy + json", "[trainer][checkpoint][python]") {
  if (std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") != 0) {
    WARN("SKIPPED: /usr/bin/python3 with numpy not available (scripts/setup.sh installs python3-numpy)");
    return;
  }
  mom_test::TempDir dir("python");
  auto prep = make_data(dir);
  TokenFile train(prep.train);
  auto model = Tiny::make<cpu::Backend<float>>(1);
  Trainer t(model, train, nullptr, small_config(dir / "run", 2));
  t.run();
  const std::string script = (mom_test::source_dir() / "docs" / "read_checkpoint.py").string();
  const std::string cmd = "/usr/bin/python3 '" + script + "' '" + (dir / "run").string() + "' > '" +
                          (dir / "out.txt").string() + "' 2>&1";
  REQUIRE(std::system(cmd.c_str()) == 0);
  const std::string out = read_bytes(dir / "out.txt");
  INFO(out.substr(0, 2000));
  CHECK_THAT(out, Catch::Contains("meta mom.describe = " + describe<Tiny>()));
  CHECK_THAT(out, Catch::Contains("total " + std::to_string(Tiny::layout.size()) + " tensors, " +
                                  std::to_string(Tiny::params) + " values"));
  // Every tensor's name, shape and sum as Python sees them match the model's parameters.
  for (const auto& p : Tiny::layout) {
    double sum = 0;
    for (index_t i = 0; i < p.size(); ++i) sum += double(model.params()[static_cast<std::size_t>(p.offset + i)]);
    std::ostringstream prefix_os;  // (ostringstream: g++ 12 warns falsely on "[" + std::to_string(...))
    prefix_os << "tensor " << p.name << " float32 [";
    if (p.rows != 1) prefix_os << p.rows << ", ";
    prefix_os << p.cols << "] sum=";
    const std::string prefix = prefix_os.str();
    const auto at = out.find(prefix);
    REQUIRE(at != std::string::npos);
    const double py_sum = std::stod(out.substr(at + prefix.size()));
    CHECK(py_sum == Approx(sum).margin(1e-6));
  }
}

TEST_CASE("scripts/plot_runs.py draws the loss curves of several runs as SVG", "[trainer][metrics][python]") {
  if (std::system("python3 -c 'import json' >/dev/null 2>&1") != 0) {
    WARN("SKIPPED: python3 not available");
    return;
  }
  mom_test::TempDir dir("plot");
  auto prep = make_data(dir);
  TokenFile train(prep.train), val(prep.val);
  for (const char* run : {"a", "b"}) {
    auto model = Tiny::make<cpu::Backend<float>>(1);
    auto cfg = small_config(dir / run, 6);
    cfg.eval_interval = 2;
    Trainer t(model, train, &val, cfg);
    t.run();
  }
  // metrics.jsonl: a run record, 6 train records, 3 val records, each a JSON object on one line.
  std::ifstream in(dir / "a" / "metrics.jsonl");
  int runs = 0, trains = 0, vals = 0;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    runs += j["type"] == "run";
    trains += j["type"] == "train";
    vals += j["type"] == "val";
    if (j["type"] == "val") CHECK(j["ppl"].get<double>() == Approx(std::exp(j["loss"].get<double>())));
  }
  CHECK(runs == 1);
  CHECK(trains == 6);
  CHECK(vals == 3);
  const std::string script = (mom_test::source_dir() / "scripts" / "plot_runs.py").string();
  const std::string cmd = "python3 '" + script + "' '" + (dir / "a").string() + "' '" + (dir / "b").string() +
                          "' -o '" + (dir / "loss.svg").string() + "' > /dev/null";
  REQUIRE(std::system(cmd.c_str()) == 0);
  const std::string svg = read_bytes(dir / "loss.svg");
  CHECK(svg.rfind("<svg", 0) == 0);
  std::size_t polylines = 0;
  for (auto at = svg.find("<polyline"); at != std::string::npos; at = svg.find("<polyline", at + 1)) ++polylines;
  CHECK(polylines == 4);  // train + val for each run
  CHECK_THAT(svg, Catch::Contains("tiny-test"));
}

TEST_CASE("double-precision models checkpoint as F64 and load back exactly", "[trainer][checkpoint]") {
  mom_test::TempDir dir("f64");
  auto prep = make_data(dir);
  TokenFile train(prep.train);
  auto model = Tiny::make<cpu::Backend<double>>(1);
  Trainer t(model, train, nullptr, small_config(dir / "run", 2));
  t.run();
  safetensors::File f(dir / "run" / "step-000002" / "model.safetensors");
  REQUIRE(f.find("h.0.attn.w_qkv") != nullptr);
  CHECK(f.find("h.0.attn.w_qkv")->dtype == "F64");
  auto other = Tiny::make<cpu::Backend<double>>(5);
  Checkpointer<decltype(other)>::load_params(dir / "run", other);
  CHECK(std::memcmp(model.params().data(), other.params().data(), model.params().size_bytes()) == 0);
  // A float model refuses the F64 checkpoint by dtype, naming the tensor.
  auto single = Tiny::make<cpu::Backend<float>>(1);
  CHECK_THROWS_WITH(Checkpointer<decltype(single)>::load_params(dir / "run", single),
                    Catch::Contains("is F64, expected F32"));
}

// The FLOPs of each step, as run (issue 32's budgets): a dense model's are the cost model's, micro-batches summed;
// a MoM model with Skip runs less than its worst case, and the Trainer's count is what a backend that tallies
// every product of the forward and the backward counts (models/realised_flops.hpp).
TEST_CASE("the Trainer counts each step's training FLOPs as run, and logs them", "[trainer][flops]") {
  mom_test::TempDir dir("flops");
  auto prep = make_data(dir);
  TokenFile train(prep.train);
  {
    auto model = Tiny::make<cpu::Backend<float>>(1);
    auto cfg = small_config(dir / "dense", 2);
    cfg.accum = 2;
    Trainer trainer(model, train, nullptr, cfg);
    static_assert(Trainer<Instance>::counts_realised_flops);
    const auto result = trainer.run();
    const double per_step = 2.0 * double(Tiny::training_flops(cfg.batch, cfg.seq));
    CHECK(trainer.last_step_flops() == per_step);
    CHECK(result.training_flops == 2 * per_step);
    std::ifstream log(dir / "dense" / "metrics.jsonl");
    int rows = 0;
    for (std::string line; std::getline(log, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j["type"] == "run") {
        CHECK(j["flops_counted"] == "realised");
        CHECK(j["training_flops_per_token"].get<double>() == double(Tiny::training_flops_per_token(cfg.seq)));
      }
      if (j["type"] != "train") continue;
      CHECK(j["flops"].get<double>() == per_step);
      ++rows;
    }
    CHECK(rows == 2);
  }
  {
    using Routed = LM<tiny, Chunked<Layer, Assembly<Router<GRU, Width<16>>, ModuleSet<MHA<2>, FFN<2>, Skip>, K<2>, H<2>>,
                                    Layer>>;
    ModelInstance<Routed, testing::CountingBackend<float>> model(3);
    std::mt19937_64 rng(3);
    std::normal_distribution<float> normal(0.0f, 0.5f);
    for (auto& p : model.params()) p = normal(rng);  // O(1) router weights: Skip picked often
    Trainer trainer(model, train, nullptr, small_config({}, 3));
    trainer.train_step();
    model.backend().flops = 0;
    trainer.train_step();
    const double counted = double(model.backend().flops);
    const double nominal = double(Routed::training_flops(4, 16));
    INFO("counted " << counted << ", Trainer " << trainer.last_step_flops() << ", worst case " << nominal);
    CHECK(counted < 0.95 * nominal);  // Skip saved work
    CHECK(trainer.last_step_flops() == counted);
  }
}

TEST_CASE("the Trainer on an AnyModel trains bit for bit as on the instance, and checkpoints cross", "[trainer][any-model]") {
  // A routed model (MoM chunk with Skip: realised FLOPs vary per step) through ErasedModel, against itself.
  using Routed = LM<tiny, Chunked<Layer, Assembly<Router<GRU, Width<16>>, ModuleSet<MHA<2>, FFN<2>, Skip>, K<2>, H<2>>,
                                  Layer>>;
  static_assert(TrainableModel<ModelInstance<Routed, cpu::Backend<float>>>);
  static_assert(TrainableModel<AnyModel<cpu::Backend<float>>>);
  static_assert(!TrainableModel<int>);
  mom_test::TempDir dir("any-model");
  auto prep = make_data(dir);
  TokenFile train(prep.train), val(prep.val);
  auto cfg = small_config(dir / "concrete", 4);
  cfg.accum = 2;
  cfg.eval_interval = 2;
  auto concrete = Routed::make<cpu::Backend<float>>(7);
  Trainer tc(concrete, train, &val, cfg);
  const auto rc = tc.run();

  cfg.out_dir = dir / "erased";
  auto instance = Routed::make<cpu::Backend<float>>(7);
  ErasedModel any(instance);
  const ModelCard& card = any.card();
  CHECK(&card == &model_card<Routed>());
  CHECK(card.params == Routed::params);
  CHECK(card.describe == describe<Routed>());
  CHECK(card.layout.size() == Routed::layout.size());
  CHECK(card.training_flops(4, 16) == double(Routed::training_flops(4, 16)));
  int forwards = 0;
  Trainer<AnyModel<cpu::Backend<float>>> te(any, train, &val, cfg);
  te.on_eval_forward = [&](AnyModel<cpu::Backend<float>>& m) { forwards += &m == &any; };
  const auto re = te.run();
  CHECK(forwards == 2 * cfg.eval_batches);  // two validations, each over eval_batches windows
  REQUIRE(re.losses.size() == rc.losses.size());
  for (std::size_t i = 0; i < rc.losses.size(); ++i) CHECK(re.losses[i] == rc.losses[i]);  // exact
  CHECK(re.final_val_loss == rc.final_val_loss);
  CHECK(re.training_flops == rc.training_flops);  // realised FLOPs, read through the interface
  CHECK(std::memcmp(concrete.params().data(), instance.params().data(), concrete.params().size_bytes()) == 0);
  CHECK(std::memcmp(tc.adam_v().data(), te.adam_v().data(), tc.adam_v().size_bytes()) == 0);

  // The erased run's checkpoint loads into a concrete instance, and the other way round.
  auto fresh = Routed::make<cpu::Backend<float>>(1);
  Checkpointer<decltype(fresh)>::load_params(dir / "erased", fresh);
  CHECK(std::memcmp(fresh.params().data(), instance.params().data(), fresh.params().size_bytes()) == 0);
  auto other = Routed::make<cpu::Backend<float>>(2);
  ErasedModel any_other(other);
  Checkpointer<AnyModel<cpu::Backend<float>>>::load_params(dir / "concrete", any_other);
  CHECK(std::memcmp(other.params().data(), concrete.params().data(), other.params().size_bytes()) == 0);
  // Another architecture's checkpoint is refused through the interface as on the instance.
  auto tiny3 = Tiny3::make<cpu::Backend<float>>(1);
  ErasedModel any3(tiny3);
  CHECK_THROWS_WITH(Checkpointer<AnyModel<cpu::Backend<float>>>::load_params(dir / "concrete", any3),
                    Catch::Contains("is a different architecture"));
}

TEST_CASE("save_checkpoints = false: metrics.jsonl, no checkpoint", "[trainer][checkpoint]") {
  mom_test::TempDir dir("no-checkpoint");
  auto prep = make_data(dir);
  TokenFile train(prep.train), val(prep.val);
  auto cfg = small_config(dir / "run", 3);
  cfg.checkpoint_interval = 1;
  cfg.save_checkpoints = false;
  auto model = Tiny::make<cpu::Backend<float>>(1);
  Trainer trainer(model, train, &val, cfg);
  const auto r = trainer.run();
  CHECK(r.losses.size() == 3);
  CHECK(std::filesystem::exists(dir / "run" / "metrics.jsonl"));
  CHECK_FALSE(has_checkpoint(dir / "run"));
  CHECK_FALSE(std::filesystem::exists(dir / "run" / "step-000001"));
  CHECK(cfg.to_json()["save_checkpoints"] == false);
}

TEST_CASE("a FLOP budget: the run ends when the steps' FLOPs reach it, the cosine runs over them, resume continues",
          "[trainer][flops]") {
  TrainConfig c;
  c.lr = 1e-3;
  c.warmup = 2;
  c.steps = 1000;  // the cap
  c.min_lr_ratio = 0.1;
  c.flops_budget = 100;
  CHECK(learning_rate(c, 1, 10, 10) == Approx(0.5e-3));  // warm-up by steps
  CHECK(learning_rate(c, 3, 20, 20) == Approx(1e-3));
  CHECK(learning_rate(c, 9, 60, 20) == Approx(0.55e-3));  // half of the budget after the warm-up's 20
  CHECK(learning_rate(c, 20, 100, 20) == Approx(1e-4));
  CHECK(learning_rate(c, 30, 150, 20) == Approx(1e-4));
  c.flops_budget = -1;
  CHECK_THROWS_WITH(c.check(), Catch::Contains("flops_budget -1 must be a finite number >= 0"));

  mom_test::TempDir dir("flops-budget");
  auto prep = make_data(dir);
  TokenFile train(prep.train), val(prep.val);
  {  // a routed model whose cost changes from step to step (Skip picks): the budget is spent, not the steps
    using Routed = LM<tiny, Chunked<Layer, Assembly<Router<GRU, Width<16>>, ModuleSet<MHA<2>, FFN<2>, Skip>, K<2>, H<2>>,
                                    Layer>>;
    auto model = Routed::make<cpu::Backend<float>>(3);
    std::mt19937_64 rng(3);
    std::normal_distribution<float> normal(0.0f, 0.5f);
    for (auto& p : model.params()) p = normal(rng);  // O(1) router weights: Skip picked often
    auto cfg = small_config({}, 1000);
    const double worst = double(Routed::training_flops(cfg.batch, cfg.seq));
    cfg.flops_budget = 5.5 * worst;
    Trainer trainer(model, train, nullptr, cfg);
    const auto r = trainer.run();
    CHECK(trainer.finished());
    CHECK(r.training_flops >= cfg.flops_budget);
    CHECK(r.training_flops - trainer.last_step_flops() < cfg.flops_budget);  // the step before had not reached it
    CHECK(r.losses.size() >= 6);  // at the worst case, 6 steps; Skip makes steps cheaper
    CHECK(trainer.flops_done() == r.training_flops);
  }
  // Resumed in the middle, the run continues to the same bits and stops at the same step.
  auto cfg = small_config(dir / "full", 1000);
  const double per_step = double(Tiny::training_flops(cfg.batch, cfg.seq));
  cfg.flops_budget = 6.5 * per_step;
  auto full_model = Tiny::make<cpu::Backend<float>>(3);
  Trainer full(full_model, train, &val, cfg);
  const auto rf = full.run();
  REQUIRE(rf.losses.size() == 7);
  auto half_cfg = cfg;
  half_cfg.out_dir = dir / "half";
  auto half_model = Tiny::make<cpu::Backend<float>>(3);
  {
    Trainer half(half_model, train, &val, half_cfg);
    for (int i = 0; i < 3; ++i) half.train_step();
    half.save();
  }
  auto resumed_model = Tiny::make<cpu::Backend<float>>(9);
  Trainer resumed(resumed_model, train, &val, half_cfg);
  resumed.resume(dir / "half");
  CHECK(resumed.flops_done() == 3 * per_step);
  const auto rr = resumed.run();
  REQUIRE(rr.losses.size() == 4);
  for (std::size_t i = 0; i < 4; ++i) CHECK(rr.losses[i] == rf.losses[3 + i]);  // exact
  CHECK(std::memcmp(full_model.params().data(), resumed_model.params().data(), full_model.params().size_bytes()) == 0);
}

// A new user's whole path, from the installed package only (docs/extending.md, "Train it with the Trainer" and
// "Make your attention decode"): the SwiGLU model of main.cpp is checked with the kit, trained 20 steps by the
// bundled Trainer on a text of its own (tokenized, split, written as token files), and decoded: the KV-cache
// decode equals the full forward (testing::decode_check), and the trained model generates text.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <unistd.h>
#include <string>
#include <vector>

#include <mom/infer/generate.hpp>
#include <mom/mom.hpp>
#include <mom/testing.hpp>
#include <mom/train/trainer.hpp>

#include "gqa.hpp"
#include "swiglu.hpp"

using namespace mom;

namespace {
constexpr Dims bytes{.d_model = 32, .heads = 4, .d_ff = 64, .vocab = 256, .context = 32};
using DenseSwiGLU = Assembly<Router<Sequential>, ModuleSet<MHA<2>, FFN<2, ext::SwiGLU>>, K<1>, H<2>>;
using Model = LM<bytes, DenseSwiGLU>;

// Grouped-query attention (gqa.hpp) with its decode members, at a context long enough for decode_check's cases.
constexpr Dims gqa_dims{.d_model = 12, .heads = 4, .d_ff = 16, .vocab = 11, .context = 20};
using DenseGQA = Assembly<Router<Sequential>, ModuleSet<MHA<2, ext::GroupedQuery<2>::type>, FFN<2>>, K<1>, H<2>>;

// A temporary folder, removed at the end of the test.
struct TempDir {
  std::filesystem::path path;
  TempDir() : path(std::filesystem::temp_directory_path() / ("mom-extending-" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};
}  // namespace

TEST_CASE("a user's attention decodes: KV-cache steps equal the full forward", "[extending][decode]") {
  const testing::DecodeReport r = testing::decode_check<LM<gqa_dims, DenseGQA>, double>();
  INFO(r.summary());
  CHECK(r.ok(1e-12));
  const testing::DecodeReport f = testing::decode_check<LM<gqa_dims, DenseGQA>, float>();
  INFO(f.summary());
  CHECK(f.ok(1e-4));
}

TEST_CASE("a new user's model: checked, trained 20 steps by the Trainer, decoded", "[extending][trainer]") {
  // 1. The checks of the installed kit.
  CHECK(testing::decode_check<Model, double>().ok(1e-12));

  // 2. Data: a text of the user's own, byte-tokenized, the last tenth held out.
  TempDir dir;
  std::string text;
  for (int i = 0; text.size() < 40000; ++i)
    text += "In the beginning line " + std::to_string(i % 97) + " of the user's text, and the next one.\n";
  const train::ByteTokenizer tokenizer;
  std::vector<token_t> tokens;
  tokenizer.encode(text, tokens);
  const auto split = tokens.size() * 9 / 10;
  train::write_token_file(dir.path / "train.bin", std::span<const token_t>(tokens).first(split), tokenizer.vocab_size(),
                          tokenizer.name());
  train::write_token_file(dir.path / "val.bin", std::span<const token_t>(tokens).subspan(split), tokenizer.vocab_size(),
                          tokenizer.name());

  // 3. The bundled Trainer: 20 AdamW steps, validation at the end, a checkpoint in dir/run.
  auto model = Model::make<cpu::Backend<float>>(1);
  train::TokenFile train_data(dir.path / "train.bin"), val_data(dir.path / "val.bin");
  train::Trainer trainer(model, train_data, &val_data,
                         train::TrainConfig{.steps = 20, .batch = 8, .seq = 32, .lr = 3e-3, .warmup = 2,
                                            .eval_batches = 2, .out_dir = dir.path / "run", .progress = false,
                                            .arch_name = "user-swiglu", .tokenizer_name = tokenizer.name()});
  const train::TrainResult r = trainer.run();
  REQUIRE(r.losses.size() == 20);
  INFO("loss " << r.losses.front() << " -> " << r.losses.back());
  CHECK(std::isfinite(r.losses.back()));
  CHECK(r.losses.back() < r.losses.front() - 1.0);  // from ln 256 = 5.5 towards the text's byte statistics
  REQUIRE(r.final_val_loss.has_value());
  CHECK(*r.final_val_loss < r.losses.front());
  CHECK(std::filesystem::exists(dir.path / "run" / "latest"));

  // 4. Decoding the trained model: 12 new bytes after a prompt, greedy.
  infer::Decoder dec(model, 1);
  std::vector<token_t> prompt;
  tokenizer.encode("In the beginning", prompt);
  const std::vector<std::vector<token_t>> prompts{prompt};
  const auto out = infer::generate(dec, std::span<const std::vector<token_t>>(prompts),
                                   {.max_new_tokens = 12, .sampling = {.temperature = 0}});
  REQUIRE(out.size() == 1);
  CHECK(out[0].tokens.size() == 12);
  for (token_t t : out[0].tokens) CHECK((t >= 0 && t < 256));
}

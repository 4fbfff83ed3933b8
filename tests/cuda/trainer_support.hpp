#pragma once
// The Trainer runs of the CUDA suite (cuda_trainer_test.cpp, cuda_budget_test.cpp): a small byte-level corpus
// and the configuration of their steps (2 micro-batches of 2 × 16 tokens, clipping active).
#include <filesystem>
#include <fstream>
#include <string>

#include "mom/train/train.hpp"
#include "train/helpers.hpp"

namespace mom::test {

// A byte-level corpus (prepared once per test) and the windows the Trainer samples from it.
struct Data {
  mom_test::TempDir dir{"cuda_trainer"};
  train::PreparedData prep;
  Data() {
    std::string text;
    const char* lines[] = {"In the beginning God created the heaven and the earth.\n",
                           "And the earth was without form, and void; and darkness was upon the face of the deep.\n",
                           "And God said, Let there be light: and there was light.\n"};
    for (int i = 0; i < 40; ++i) text += lines[i % 3];
    std::ofstream(dir / "text.txt", std::ios::binary) << text;
    prep = train::prepare_text(dir / "text.txt", dir / "data", train::ByteTokenizer{}, 0.2);
  }
};

inline train::TrainConfig config(const std::filesystem::path& out, index_t steps) {
  train::TrainConfig c;
  c.steps = steps;
  c.batch = 2;
  c.seq = 16;
  c.accum = 2;
  c.lr = 3e-3;
  c.warmup = 1;
  c.grad_clip = 0.5;  // clipping active (the norm of these small models is above it at first)
  c.eval_interval = 0;
  c.eval_batches = 2;
  c.out_dir = out;
  c.progress = false;
  c.arch_name = "cuda-trainer-test";
  c.tokenizer_name = "byte";
  return c;
}
}  // namespace mom::test

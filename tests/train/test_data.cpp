// Token files, text preparation, deterministic sampling, and their bad-input errors.
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <mom/train/data.hpp>

#include "helpers.hpp"

#include <cmath>
#include <cstring>
#include <fstream>

using namespace mom;
using namespace mom::train;
using mom_test::read_bytes;
using mom_test::write_bytes;

namespace {
}  // namespace

TEST_CASE("token file round trip, u16 and u32", "[data]") {
  mom_test::TempDir dir("tokfile");
  std::vector<token_t> small = {0, 1, 255, 7, 65535};
  write_token_file(dir / "a.bin", small, 65536, "u16");
  TokenFile a(dir / "a.bin");
  CHECK(a.size() == 5);
  CHECK(a.vocab() == 65536);
  CHECK(a.tokenizer() == "u16");
  CHECK(a.max_id() == 65535);
  CHECK(std::filesystem::file_size(dir / "a.bin") == 64 + 5 * 2);
  for (index_t i = 0; i < 5; ++i) CHECK(a[i] == small[static_cast<std::size_t>(i)]);
  // The header bytes are exactly the documented format.
  const std::string raw = read_bytes(dir / "a.bin");
  CHECK(raw.substr(0, 6) == "MOMTOK");
  CHECK(raw[8] == 1);    // version
  CHECK(raw[12] == 2);   // bytes per token
  CHECK(raw[16] == 5);   // count
  CHECK(static_cast<unsigned char>(raw[64 + 2 * 4]) == 0xFF);  // 65535 little-endian
  std::vector<token_t> big = {50256, 0, 65536, 100000};
  write_token_file(dir / "b.bin", big, 100001, "wide");
  TokenFile b(dir / "b.bin");
  CHECK(std::filesystem::file_size(dir / "b.bin") == 64 + 4 * 4);
  std::vector<token_t> back(4);
  b.read(0, back);
  CHECK(back == big);
  CHECK_THROWS_WITH(write_token_file(dir / "c.bin", std::vector<token_t>{3, 256}, 256, "byte"),
                    Catch::Contains("token 1 has id 256 outside the vocabulary [0, 256)"));
  CHECK_FALSE(std::filesystem::exists(dir / "c.bin"));
}

TEST_CASE("token file bad input: missing, empty, garbage, truncated, ids >= vocab", "[data][bad-input]") {
  mom_test::TempDir dir("badtok");
  CHECK_THROWS_WITH(TokenFile(dir / "missing.bin"), Catch::Contains("does not exist"));
  write_bytes(dir / "empty.bin", "");
  CHECK_THROWS_WITH(TokenFile(dir / "empty.bin"), Catch::Contains("is empty"));
  write_bytes(dir / "garbage.bin", std::string("\x7f" "ELF\x02\x01\x01\0\0\0\0\0\0\0\0\0 lots of binary", 32));
  CHECK_THROWS_WITH(TokenFile(dir / "garbage.bin"), Catch::Contains("is not a mom token file"));
  write_token_file(dir / "ok.bin", std::vector<token_t>{1, 2, 3, 4}, 256, "byte");
  std::string raw = read_bytes(dir / "ok.bin");
  write_bytes(dir / "trunc.bin", raw.substr(0, raw.size() - 3));
  CHECK_THROWS_WITH(TokenFile(dir / "trunc.bin"), Catch::Contains("is truncated"));
  std::string bad_id = raw;
  bad_id[64 + 2] = '\x01';  // token 1 becomes 0x0101 = 257 >= 256
  bad_id[64 + 3] = '\x01';
  write_bytes(dir / "badid.bin", bad_id);
  CHECK_THROWS_WITH(TokenFile(dir / "badid.bin"), Catch::Contains("token 1 has id 257 >= vocab 256"));
  // A count whose count x width wraps 2^64 to the real data size (2^63 u16 tokens "are" 0 bytes; 2^63 + 4
  // are 8): refused by division before the multiplication, instead of reading far past the mapping.
  for (const std::uint64_t count : {std::uint64_t(1) << 63, (std::uint64_t(1) << 63) + 4}) {
    std::string wrap = count == (std::uint64_t(1) << 63) ? raw.substr(0, 64) : raw;
    for (int i = 0; i < 8; ++i) wrap[std::size_t(16 + i)] = char((count >> (8 * i)) & 0xFF);
    write_bytes(dir / "wrap.bin", wrap);
    CHECK_THROWS_WITH(TokenFile(dir / "wrap.bin"), Catch::Contains("is truncated: header says " + std::to_string(count)));
  }
  // A header whose vocabulary is not its named tokenizer's (2^28 for "byte") is refused before anything is
  // sized by it; unigram_entropy counts only the ids present.
  std::string huge = raw;
  for (int i = 0; i < 8; ++i) huge[std::size_t(24 + i)] = char(((std::uint64_t(1) << 28) >> (8 * i)) & 0xFF);
  write_bytes(dir / "huge.bin", huge);
  CHECK_THROWS_WITH(TokenFile(dir / "huge.bin"), Catch::Contains("vocab 268435456 is not the byte tokenizer's 256"));
  std::memcpy(huge.data() + 32, "mine\0\0\0\0", 8);  // a tokenizer of the user's: any vocabulary
  write_bytes(dir / "huge.bin", huge);
  const TokenFile claims(dir / "huge.bin");
  CHECK(claims.vocab() == (index_t(1) << 28));
  CHECK(claims.max_id() == 4);
  CHECK(unigram_entropy(claims) == Approx(std::log(4.0)));
  CHECK_THROWS_WITH(write_token_file(dir / "w.bin", std::vector<token_t>{1}, 300, "byte"),
                    Catch::Contains("vocab 300 is not the byte tokenizer's 256"));
  // A 4-byte id >= 2^31 (a negative token_t if read as signed) is refused as the unsigned value it is.
  write_token_file(dir / "wide.bin", std::vector<token_t>{1, 2, 3}, 100001, "wide");
  std::string wide = read_bytes(dir / "wide.bin");
  for (int i = 0; i < 4; ++i) wide[std::size_t(64 + 4 + i)] = '\xFF';
  write_bytes(dir / "wide.bin", wide);
  CHECK_THROWS_WITH(TokenFile(dir / "wide.bin"), Catch::Contains("token 1 has id 4294967295 >= vocab 100001"));
  // A FIFO (or any non-regular file) is refused before it is opened: opening it would block forever.
  REQUIRE(::mkfifo((dir / "fifo").c_str(), 0600) == 0);
  CHECK_THROWS_WITH(TokenFile(dir / "fifo"), Catch::Contains("is not a regular file (a FIFO"));
  CHECK_THROWS_WITH(is_token_file(dir / "fifo"), Catch::Contains("is not a regular file"));
  CHECK_THROWS_WITH(read_text_file(dir / "fifo"), Catch::Contains("is not a regular file"));
  CHECK_THROWS_WITH(read_text_file("/dev/zero"), Catch::Contains("is not a regular file"));
  // Errors are one line.
  try {
    TokenFile f(dir / "trunc.bin");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find('\n') == std::string::npos);
  }
}

TEST_CASE("prepare_text splits a text into train and validation token files", "[data]") {
  mom_test::TempDir dir("prep");
  std::string text;
  for (int i = 0; i < 100; ++i) text += "In the beginning was the Word. ";
  write_bytes(dir / "t.txt", text);
  ByteTokenizer tok;
  auto prep = prepare_text(dir / "t.txt", dir / "data", tok, 0.1);
  CHECK(prep.train_tokens + prep.val_tokens == static_cast<index_t>(text.size()));
  CHECK(prep.val_tokens == static_cast<index_t>(text.size() / 10));
  TokenFile train(prep.train), val(prep.val);
  CHECK(train.tokenizer() == "byte");
  std::vector<token_t> all(static_cast<std::size_t>(train.size()));
  train.read(0, all);
  CHECK(tok.decode(all) == text.substr(0, all.size()));
  std::vector<token_t> tail(static_cast<std::size_t>(val.size()));
  val.read(0, tail);
  CHECK(tok.decode(tail) == text.substr(all.size()));
  // Unigram entropy of a known distribution: 4 equally frequent bytes -> ln 4.
  write_token_file(dir / "u.bin", std::vector<token_t>{1, 2, 3, 4, 1, 2, 3, 4}, 256, "byte");
  CHECK(unigram_entropy(TokenFile(dir / "u.bin")) == Approx(std::log(4.0)));
}

TEST_CASE("prepare_text bad input: missing, empty, binary garbage, too short", "[data][bad-input]") {
  mom_test::TempDir dir("badprep");
  ByteTokenizer tok;
  CHECK_THROWS_WITH(prepare_text(dir / "nope.txt", dir / "d", tok), Catch::Contains("does not exist"));
  write_bytes(dir / "empty.txt", "");
  CHECK_THROWS_WITH(prepare_text(dir / "empty.txt", dir / "d", tok), Catch::Contains("is empty"));
  std::string garbage;
  std::mt19937_64 rng(5);
  for (int i = 0; i < 4096; ++i) garbage += static_cast<char>(rng() & 0xFF);
  write_bytes(dir / "garbage.txt", garbage);
  CHECK_THROWS_WITH(prepare_text(dir / "garbage.txt", dir / "d", tok), Catch::Contains("is not UTF-8 text"));
  write_bytes(dir / "short.txt", "abc");
  CHECK_THROWS_WITH(prepare_text(dir / "short.txt", dir / "d", tok), Catch::Contains("is too short"));
  CHECK_THROWS_WITH(prepare_text(dir.path, dir / "d", tok), Catch::Contains("is a directory"));
}

TEST_CASE("uniform_below is exact and platform independent", "[data][rng]") {
  std::mt19937_64 rng(42);
  // mt19937_64 is fully specified by the standard: its 10000th output from the default seed is fixed.
  std::mt19937_64 def;
  def.discard(9999);
  CHECK(def() == 9981545732273789042ull);
  std::vector<int> hist(6, 0);
  for (int i = 0; i < 60000; ++i) ++hist[uniform_below(rng, 6)];
  for (int h : hist) CHECK(std::abs(h - 10000) < 500);
  CHECK(uniform_below(rng, 1) == 0);
  // Rejection: with n = 2^63 + 1 about half the raw draws are rejected, results stay < n.
  const std::uint64_t n = (1ull << 63) + 1;
  for (int i = 0; i < 100; ++i) CHECK(uniform_below(rng, n) < n);
}

TEST_CASE("BatchSampler: windows, determinism per seed, state save/restore", "[data][rng]") {
  mom_test::TempDir dir("sampler");
  std::vector<token_t> seqn(1000);
  for (int i = 0; i < 1000; ++i) seqn[static_cast<std::size_t>(i)] = i % 251;
  write_token_file(dir / "s.bin", seqn, 256, "byte");
  TokenFile f(dir / "s.bin");
  const index_t B = 4, S = 16;
  std::vector<token_t> x(B * S), y(B * S), x2(B * S), y2(B * S);
  BatchSampler a(f, B, S, 7), b(f, B, S, 7), c(f, B, S, 8);
  a.next(x, y);
  b.next(x2, y2);
  CHECK(x == x2);
  CHECK(y == y2);
  // Targets are inputs shifted by one inside each window; windows are consecutive tokens.
  for (index_t r = 0; r < B; ++r)
    for (index_t t = 0; t < S; ++t) {
      CHECK(y[r * S + t] == (x[r * S + t] + 1) % 251);
    }
  c.next(x2, y2);
  CHECK(x != x2);
  // Save the state, draw, restore, draw again: same batch.
  const std::string st = a.state();
  a.next(x, y);
  BatchSampler d(f, B, S, 12345);
  d.set_state(st);
  d.next(x2, y2);
  CHECK(x == x2);
  CHECK_THROWS_WITH(d.set_state("not a state"), Catch::Contains("RNG state is malformed"));
  // seq + 1 > tokens: refused.
  CHECK_THROWS_WITH(BatchSampler(f, 1, 1000, 1), Catch::Contains("has 1000 tokens, fewer than seq + 1 = 1001"));
  // Fixed evaluation windows are non-overlapping, from the start.
  eval_batch(f, B, S, 0, x, y);
  CHECK(x[0] == 0);
  CHECK(x[S] == S);
  CHECK(y[S - 1] == S);
}

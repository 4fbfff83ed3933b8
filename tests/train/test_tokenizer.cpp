// Tokenizers: byte-level round trip, GPT-2 pre-tokenizer and BPE against ids of the reference implementation.
#include <catch2/catch.hpp>

#include <mom/train/tokenizer.hpp>

#include "helpers.hpp"

#include <vector>

using namespace mom;
using namespace mom::train;

namespace {

std::vector<std::string> pieces(std::string_view s) {
  std::vector<std::string> out;
  gpt2_pretokenize(s, [&](std::string_view p) { out.emplace_back(p); });
  return out;
}

const Gpt2Tokenizer* gpt2() {
  static std::unique_ptr<Gpt2Tokenizer> tok = []() -> std::unique_ptr<Gpt2Tokenizer> {
    auto dir = find_gpt2_files(mom_test::source_dir());
    if (!dir) return nullptr;
    return std::make_unique<Gpt2Tokenizer>(Gpt2Tokenizer::from_dir(*dir));
  }();
  return tok.get();
}

#define REQUIRE_GPT2_FILES()                                                                            \
  if (!gpt2()) {                                                                                        \
    WARN("SKIPPED: GPT-2 encoder.json + vocab.bpe not found (run scripts/setup.sh or set MOM_GPT2_DIR)"); \
    return;                                                                                             \
  }

// Tricky inputs: emoji with skin tone and ZWJ sequences, CJK, combining marks, RTL, digits of other scripts,
// every whitespace kind, and bytes that are not UTF-8 at all.
const std::vector<std::string> tricky = {
    "Emoji 🙂👍🏽 and family 👨‍👩‍👧!",
    "中文分词测试，日本語のテキスト。",
    "e\u0301 combining: cafe\u0301 na\u0308ive",
    "שלום עולם مرحبا بالعالم",
    "Numbers: 3.14159, 2024 and ١٢٣ and Ⅻ.",
    "  leading spaces\n\n\ttabs and   triple spaces   \n",
    "\u00a0nbsp\u2003em-space\u3000ideographic",
    std::string("invalid \xff\xfe bytes \xc3 truncated \xe2\x82 and overlong \xc0\xaf end\x80"),
    std::string("nul \0 inside", 12),
    "",
    " ",
    "'",
    "don't 'll ''s",
};

}  // namespace

TEST_CASE("byte tokenizer round-trips any bytes", "[tokenizer]") {
  ByteTokenizer tok;
  CHECK(tok.vocab_size() == 256);
  for (const auto& s : tricky) CHECK(tok.decode(tok.encode(s)) == s);
  auto ids = tok.encode("A\xff");
  REQUIRE(ids.size() == 2);
  CHECK(ids[0] == 65);
  CHECK(ids[1] == 255);
  std::vector<token_t> bad = {65, 256};
  CHECK_THROWS_WITH(tok.decode(bad), Catch::Contains("token id 256 outside the vocabulary"));
  const auto& kjv = mom_test::kjv_text();
  if (kjv.empty()) { WARN("SKIPPED KJV part: `bible` (Debian bible-kjv) not installed"); return; }
  CHECK(tok.decode(tok.encode(kjv)) == kjv);
}

TEST_CASE("GPT-2 pre-tokenizer splits like the reference regex", "[tokenizer]") {
  using V = std::vector<std::string>;
  CHECK(pieces("Hello world") == V{"Hello", " world"});
  CHECK(pieces("I'll've we're") == V{"I", "'ll", "'ve", " we", "'re"});
  CHECK(pieces("you'VE") == V{"you", "'", "VE"});  // contractions are case-sensitive
  CHECK(pieces("a  b") == V{"a", " ", " b"});      // \s+(?!\S) leaves the last space to ' ?\p{L}+'
  CHECK(pieces("a\t b") == V{"a", "\t", " b"});
  CHECK(pieces("x\n\n") == V{"x", "\n\n"});        // trailing whitespace run stays whole
  CHECK(pieces("a \n\tb") == V{"a", " \n", "\t", "b"});
  CHECK(pieces("3.14") == V{"3", ".", "14"});
  CHECK(pieces(" 42abc") == V{" 42", "abc"});
  CHECK(pieces("...!?") == V{"...!?"});
  CHECK(pieces(" 🙂🙂 x") == V{" 🙂🙂", " x"});
  CHECK(pieces("naïve café") == V{"naïve", " café"});            // precomposed letters are \p{L}
  CHECK(pieces("e\u0301") == V{"e", "\u0301"});                    // a combining mark (Mn) is not \p{L}
  CHECK(pieces("日本語") == V{"日本語"});
  CHECK(pieces("Ⅻ٣") == V{"Ⅻ٣"});                                 // Nl and Nd are both \p{N}
  CHECK(pieces("\u00a0\u3000x") == V{"\u00a0", "\u3000", "x"});    // Unicode spaces are \s
  // Stray bytes are "other": they join punctuation runs and never split a UTF-8 character.
  CHECK(pieces(std::string("a\xff\xfe!b")) == V{"a", std::string("\xff\xfe!"), "b"});
  // The pieces always tile the input.
  for (const auto& s : tricky) {
    std::string joined;
    for (auto& p : pieces(s)) joined += p;
    CHECK(joined == s);
  }
}

TEST_CASE("GPT-2 byte-to-unicode map is a bijection onto printable code points", "[tokenizer]") {
  auto m = gpt2_byte_to_unicode();
  CHECK(m['A'] == 'A');
  CHECK(m[' '] == 0x120);  // 'Ġ', the space marker seen in GPT-2 vocabularies
  CHECK(m['\n'] == 0x10A);  // 'Ċ'
  CHECK(m[0] == 0x100);
  std::vector<std::uint32_t> v(m.begin(), m.end());
  std::sort(v.begin(), v.end());
  CHECK(std::adjacent_find(v.begin(), v.end()) == v.end());
  CHECK(v.back() == 0x143);  // 188 printable bytes keep their value; the 68 others take U+0100..U+0143
}

TEST_CASE("GPT-2 BPE gives the reference token ids", "[tokenizer][gpt2]") {
  REQUIRE_GPT2_FILES();
  const auto& tok = *gpt2();
  CHECK(tok.vocab_size() == 50257);
  CHECK(tok.merge_count() == 50000);
  CHECK(tok.token_bytes(262) == " the");
  CHECK(tok.token_bytes(50256) == "<|endoftext|>");
  // Expected ids from the reference JavaScript implementation (gpt-3-encoder@1.1.4, encode()).
  using V = std::vector<token_t>;
  CHECK(tok.encode("Hello world") == V{15496, 995});
  CHECK(tok.encode(" the") == V{262});
  CHECK(tok.encode("It's a test of the GPT-2 tokenizer!") ==
        V{1026, 338, 257, 1332, 286, 262, 402, 11571, 12, 17, 11241, 7509, 0});
  CHECK(tok.encode("In the beginning God created the heaven and the earth.") ==
        V{818, 262, 3726, 1793, 2727, 262, 9538, 290, 262, 4534, 13});
  CHECK(tok.encode("I'll've we're they'd you'VE 'tis") ==
        V{40, 1183, 1053, 356, 821, 484, 1549, 345, 6, 6089, 705, 48010});
  CHECK(tok.encode("Numbers: 3.14159, 2024 and ١٢٣ and Ⅻ.") ==
        V{49601, 25, 513, 13, 1415, 19707, 11, 48609, 290, 18923, 94, 149, 95, 149, 96, 290, 2343, 227, 104, 13});
  CHECK(tok.encode("Emoji 🙂👍🏽 and family 👨‍👩‍👧!") ==
        V{36, 5908, 7285, 32485, 41840, 235, 8582, 237, 121, 290, 1641, 50169, 101, 447, 235, 41840, 102, 447, 235,
          41840, 100, 0});
  CHECK(tok.encode("中文分词测试，日本語のテキスト。") ==
        V{40792, 23877, 229, 26344, 228, 46237, 235, 38184, 233, 46237, 243, 171, 120, 234, 33768, 98, 17312, 105,
          45739, 252, 5641, 24336, 25084, 43302, 16764});
  CHECK(tok.encode("e\u0301 combining: cafe\u0301 na\u0308ive") ==
        V{68, 136, 223, 19771, 25, 26725, 136, 223, 12385, 136, 230, 425});
  CHECK(tok.encode("  leading spaces\n\n\ttabs and   triple spaces   \n") ==
        V{220, 3756, 9029, 628, 197, 8658, 82, 290, 220, 220, 15055, 9029, 220, 220, 220, 198});
  CHECK(tok.encode("Ελληνικά και русский текст") ==
        V{138, 243, 39377, 39377, 138, 115, 26180, 29945, 43000, 138, 105, 7377, 118, 17394, 29945, 220, 21169,
          35072, 21727, 21727, 31583, 18849, 140, 117, 220, 20375, 16843, 31583, 21727, 20375});
}

TEST_CASE("GPT-2 BPE round-trips tricky Unicode and invalid UTF-8 exactly", "[tokenizer][gpt2]") {
  REQUIRE_GPT2_FILES();
  const auto& tok = *gpt2();
  for (const auto& s : tricky) {
    auto ids = tok.encode(s);
    for (token_t t : ids) REQUIRE((t >= 0 && t < tok.vocab_size()));
    CHECK(tok.decode(ids) == s);
  }
  std::vector<token_t> bad = {50257};
  CHECK_THROWS_WITH(tok.decode(bad), Catch::Contains("outside the vocabulary"));
}

TEST_CASE("GPT-2 BPE round-trips the KJV corpus", "[tokenizer][gpt2][kjv]") {
  REQUIRE_GPT2_FILES();
  const auto& kjv = mom_test::kjv_text();
  if (kjv.empty()) { WARN("SKIPPED: `bible` (Debian bible-kjv) not installed"); return; }
  const auto& tok = *gpt2();
  // The first 200,000 bytes, encoded by the reference JavaScript implementation (gpt-3-encoder@1.1.4), give
  // 54,383 tokens whose FNV-1a-style hash (h ^= id; h *= 0x100000001b3) is 0x629b364df6bb0d7d.
  const auto head = tok.encode(std::string_view(kjv).substr(0, 200000));
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (token_t id : head) h = (h ^ static_cast<std::uint64_t>(id)) * 0x100000001b3ull;
  CHECK(head.size() == 54383);
  CHECK(h == 0x629b364df6bb0d7dull);
  auto ids = tok.encode(kjv);
  CHECK(tok.decode(ids) == kjv);
  // About 4.3 bytes per token on English prose; KJV's verse numbers and indentation lower it.
  const double bytes_per_token = double(kjv.size()) / double(ids.size());
  CHECK(bytes_per_token > 3.0);
  CHECK(bytes_per_token < 4.5);
}

TEST_CASE("tokenizer factory and file errors", "[tokenizer]") {
  CHECK(make_tokenizer("byte")->vocab_size() == 256);
  CHECK_THROWS_WITH(make_tokenizer("sentencepiece"), Catch::Contains("unknown tokenizer 'sentencepiece'"));
  mom_test::TempDir dir("tok");
  CHECK_THROWS_WITH(Gpt2Tokenizer::from_dir(dir.path), Catch::Contains("no encoder.json + vocab.bpe"));
  {
    std::ofstream(dir / "encoder.json") << "{not json";
    std::ofstream(dir / "vocab.bpe") << "#version: 0.2\n";
  }
  CHECK_THROWS_WITH(Gpt2Tokenizer::from_dir(dir.path), Catch::Contains("is not valid JSON"));
}

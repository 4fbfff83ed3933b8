// libFuzzer harness for the tokenizers (mom/train/tokenizer.hpp), over arbitrary bytes (valid UTF-8 or not):
//   - GPT-2 pre-tokenization cuts the input into non-empty pieces that concatenate back to it;
//   - GPT-2 BPE: every id is inside the vocabulary, decode(encode(x)) == x byte for byte, and a second
//     encode (served from the piece cache) gives the same ids;
//   - the byte tokenizer: one id per byte, decode(encode(x)) == x;
//   - decoding the input read as int32 ids either succeeds with the tokens' bytes or throws mom::Error;
//   - decode_utf8 / append_utf8 agree on every valid code point of the input.
// The GPT-2 vocabulary is read once from $MOM_GPT2_DIR or the repository's third_party/ (scripts/setup.sh).
#include <mom/train/tokenizer.hpp>

#include "fuzz_support.hpp"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace tr = mom::train;
using mom::token_t;

namespace {
std::unique_ptr<tr::Gpt2Tokenizer> gpt2;
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const auto dir = tr::find_gpt2_files(MOM_SOURCE_DIR);
  if (!dir) {
    std::fprintf(stderr, "fuzz_tokenizer: GPT-2 encoder.json + vocab.bpe not found (run scripts/setup.sh or set "
                         "MOM_GPT2_DIR)\n");
    std::exit(1);
  }
  gpt2 = std::make_unique<tr::Gpt2Tokenizer>(tr::Gpt2Tokenizer::from_dir(*dir));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);

  std::string joined;
  tr::gpt2_pretokenize(text, [&](std::string_view piece) {
    MOM_FUZZ_ASSERT(!piece.empty(), "an empty pre-token at byte %zu", joined.size());
    MOM_FUZZ_ASSERT(piece.data() == text.data() + joined.size(), "pre-tokens are not consecutive at byte %zu",
                    joined.size());
    joined += piece;
  });
  MOM_FUZZ_ASSERT(joined == text, "pre-tokens cover %zu of %zu bytes", joined.size(), text.size());

  const std::vector<token_t> ids = gpt2->encode(text);
  MOM_FUZZ_ASSERT(ids.size() <= text.size(), "%zu ids for %zu bytes", ids.size(), text.size());
  for (token_t t : ids) MOM_FUZZ_ASSERT(t >= 0 && t < gpt2->vocab_size(), "id %d outside the vocabulary", t);
  MOM_FUZZ_ASSERT(gpt2->decode(ids) == text, "gpt2: decode(encode(x)) != x (%zu bytes, %zu ids)", text.size(),
                  ids.size());
  MOM_FUZZ_ASSERT(gpt2->encode(text) == ids, "gpt2: a second encode (cached pieces) differs");

  const tr::ByteTokenizer bytes;
  const std::vector<token_t> b = bytes.encode(text);
  MOM_FUZZ_ASSERT(b.size() == text.size() && bytes.decode(b) == text, "byte: decode(encode(x)) != x");

  std::vector<token_t> raw(size / sizeof(token_t));
  if (!raw.empty()) std::memcpy(raw.data(), data, raw.size() * sizeof(token_t));
  for (const tr::Tokenizer* tok : {static_cast<const tr::Tokenizer*>(gpt2.get()), static_cast<const tr::Tokenizer*>(&bytes)}) {
    bool in_vocab = true;
    for (token_t t : raw) in_vocab &= t >= 0 && t < tok->vocab_size();
    try {
      const std::string s = tok->decode(raw);
      MOM_FUZZ_ASSERT(in_vocab, "%s: decoded an id outside the vocabulary", tok->name().c_str());
      if (tok == gpt2.get()) {
        std::string expect;
        for (token_t t : raw) expect += gpt2->token_bytes(t);
        MOM_FUZZ_ASSERT(s == expect, "gpt2: decode is not the concatenation of the tokens' bytes");
      }
    } catch (const mom::Error&) {
      MOM_FUZZ_ASSERT(!in_vocab, "%s: refused ids that are all inside the vocabulary", tok->name().c_str());
    }
  }

  for (std::size_t i = 0; i < text.size();) {
    std::int32_t cp;
    const int len = tr::unicode::decode_utf8(text, i, &cp);
    MOM_FUZZ_ASSERT(len >= 1 && len <= 4 && i + static_cast<std::size_t>(len) <= text.size(), "length %d at %zu", len, i);
    if (cp >= 0) {
      std::string re;
      tr::unicode::append_utf8(re, static_cast<std::uint32_t>(cp));
      MOM_FUZZ_ASSERT(re == text.substr(i, static_cast<std::size_t>(len)), "U+%04X does not re-encode to its bytes", cp);
    } else {
      MOM_FUZZ_ASSERT(len == 1, "an invalid sequence of length %d", len);
    }
    i += static_cast<std::size_t>(len);
  }
  return 0;
}

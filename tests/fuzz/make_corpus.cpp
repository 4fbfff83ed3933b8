// Writes the fuzzers' seed corpus with the library's own writers: small valid inputs that libFuzzer mutates.
//   make_corpus <out-dir>     (scripts/fuzz.sh --make-corpus runs it on tests/fuzz/corpus)
// Files: <out-dir>/safetensors/*.safetensors (safetensors::Writer), <out-dir>/token_file/*.tok
// (write_token_file), <out-dir>/tokenizer/* (texts, valid UTF-8 and not, and GPT-2 ids as int32).
#include <mom/train/data.hpp>
#include <mom/train/safetensors.hpp>
#include <mom/train/tokenizer.hpp>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;
namespace tr = mom::train;
namespace st = mom::train::safetensors;
using mom::token_t;
using namespace std::string_view_literals;

namespace {

void write_bytes(const fs::path& p, const std::string& s) {
  std::ofstream(p, std::ios::binary) << s;
  std::printf("%s (%zu bytes)\n", p.c_str(), s.size());
}
// A safetensors file as another tool writes it (no mom checksums, so the reader checks it unverified):
// the header JSON padded with spaces to a multiple of 8, then the data bytes.
std::string plain_safetensors(std::string json, const std::string& data) {
  json.resize((json.size() + 7) / 8 * 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>((json.size() >> (8 * i)) & 0xFF);
  return out + json + data;
}
void wrote(const fs::path& p) { std::printf("%s (%ju bytes)\n", p.c_str(), static_cast<std::uintmax_t>(fs::file_size(p))); }

}  // namespace

int main(int argc, char** argv) {
  const fs::path out = argc > 1 ? fs::path(argv[1]) : fs::path(MOM_SOURCE_DIR) / "tests/fuzz/corpus";
  for (const char* d : {"safetensors", "token_file", "tokenizer"}) fs::create_directories(out / d);

  // safetensors: one F32 matrix with metadata; every dtype the reader reads, a scalar included; no tensors;
  // zero-element tensors.
  {
    const std::vector<float> w = {1.f, -2.f, 0.5f, 3.25f, -0.f, 1e-3f};
    st::Writer f;
    f.add<float>("wte", w, {2, 3});
    f.metadata("step", "10");
    f.metadata("arch", "dense");
    f.write(out / "safetensors/f32_meta.safetensors");
    wrote(out / "safetensors/f32_meta.safetensors");
  }
  {
    const std::vector<double> a = {1.5, -2.25};
    const std::vector<std::int32_t> b = {7, -8, 9};
    const std::vector<std::int64_t> c = {1LL << 40, -1};
    const std::vector<std::uint8_t> d = {0, 1, 2, 254, 255};
    const std::vector<float> e = {42.f};
    st::Writer f;
    f.add<double>("layers.0.a", a, {2});
    f.add<std::int32_t>("layers.0.b", b, {3, 1});
    f.add<std::int64_t>("c", c, {1, 2});
    f.add<std::uint8_t>("d", d, {5});
    f.add<float>("scalar", e, {});
    f.metadata("format", "pt");
    f.write(out / "safetensors/dtypes.safetensors");
    wrote(out / "safetensors/dtypes.safetensors");
  }
  {
    st::Writer f;
    f.write(out / "safetensors/empty.safetensors");
    wrote(out / "safetensors/empty.safetensors");
  }
  {
    const std::vector<float> none;
    const std::vector<std::uint8_t> d = {3, 4, 5};
    st::Writer f;
    f.add<float>("empty", none, {0, 4});
    f.add<std::uint8_t>("u8", d, {3});
    f.write(out / "safetensors/zero_elements.safetensors");
    wrote(out / "safetensors/zero_elements.safetensors");
  }

  // The same kinds of file without checksums: a mutation of these reaches the checks after the checksums.
  write_bytes(out / "safetensors/plain_f32.safetensors",
              plain_safetensors(R"({"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})",
                                std::string("\x00\x00\x80\x3f\x00\x00\x00\xc0\x00\x00\x00\x3f\x00\x00\x50\x40"sv)));
  write_bytes(out / "safetensors/plain_dtypes.safetensors",
              plain_safetensors(R"({"b":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},)"
                                R"("h":{"dtype":"F16","shape":[1,1],"data_offsets":[4,6]},)"
                                R"("i":{"dtype":"I64","shape":[1],"data_offsets":[6,14]},)"
                                R"("u":{"dtype":"U8","shape":[],"data_offsets":[14,15]},)"
                                R"("z":{"dtype":"BOOL","shape":[0],"data_offsets":[15,15]}})",
                                std::string("\x80\x3f\x00\xc0\x00\x3c\x01\x00\x00\x00\x00\x00\x00\x80\x07"sv)));

  // token files: byte tokens (u16), GPT-2 tokens (u16, when the vocabulary is installed), a vocabulary
  // above 65536 (u32 tokens), a single token.
  const std::string text = "In the beginning God created the heaven and the earth. It's 1611; we'll see.\n";
  {
    const tr::ByteTokenizer bytes;
    const auto ids = bytes.encode(text);
    tr::write_token_file(out / "token_file/byte.tok", ids, 256, "byte");
    wrote(out / "token_file/byte.tok");
  }
  std::unique_ptr<tr::Gpt2Tokenizer> gpt2;
  if (auto dir = tr::find_gpt2_files(MOM_SOURCE_DIR)) gpt2 = std::make_unique<tr::Gpt2Tokenizer>(tr::Gpt2Tokenizer::from_dir(*dir));
  if (gpt2) {
    const auto ids = gpt2->encode(text);
    tr::write_token_file(out / "token_file/gpt2.tok", ids, gpt2->vocab_size(), "gpt2");
    wrote(out / "token_file/gpt2.tok");
  } else {
    std::fprintf(stderr, "make_corpus: no GPT-2 vocabulary (scripts/setup.sh): gpt2 seeds skipped\n");
  }
  {
    const std::vector<token_t> ids = {0, 69999, 65536, 12345, 1, 65535, 0};
    tr::write_token_file(out / "token_file/wide.tok", ids, 70000, "wide");
    wrote(out / "token_file/wide.tok");
  }
  {
    const std::vector<token_t> ids = {0};
    tr::write_token_file(out / "token_file/single.tok", ids, 1, "x");
    wrote(out / "token_file/single.tok");
  }

  // tokenizer inputs: English with contractions and numbers, other scripts and emoji, whitespace runs,
  // invalid UTF-8 (stray continuation, truncated, overlong, surrogate, 0xFF), code, GPT-2 ids as int32.
  write_bytes(out / "tokenizer/english.txt",
              "Hello, world! It's the 1st of May; we'll see... They've paid $5.99 (or 3.14%) -- I'd say 'ok'.\n");
  write_bytes(out / "tokenizer/unicode.txt",
              "Caf\xC3\xA9 na\xC3\xAFve \xE2\x80\x94 \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xF0\x9F\x99\x82 "
              "\xCE\x95\xCE\xBB\xCE\xBB\xCE\xB7\xCE\xBD\xCE\xB9\xCE\xBA\xCE\xAC \xD9\xA1\xD9\xA2\xD9\xA3 "
              "\xC2\xA0nbsp \xE2\x85\xA7 \xF0\x9D\x90\x80\n");
  write_bytes(out / "tokenizer/whitespace.txt", "  leading\t\ttabs\n\n  \r\n trailing   \xE3\x80\x80x \xE2\x80\xA8 y   ");
  write_bytes(out / "tokenizer/invalid_utf8.bin",
              std::string("\xFF\xFE" "abc \xC3\x28 \xE2\x82 \xF0\x9F\x98 \xED\xA0\x80 \xC0\xAF \x80\x80 end\0zero\0"sv));
  write_bytes(out / "tokenizer/code.txt",
              "for (int i = 0; i < n; ++i) {\n    x[i] += y[i] * 2;  // it's fine\n}\nreturn 'a'+'b';\n");
  if (gpt2) {
    const auto ids = gpt2->encode("Hello world, it's GPT-2.");
    write_bytes(out / "tokenizer/gpt2_ids.bin",
                std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(token_t)));
  }
  return 0;
}

// The data pipeline: a text is tokenized once into binary token files (train + validation), which training
// maps into memory and samples random windows from.
//
// Token file format (all integers little-endian), 64-byte header then the tokens:
//   offset  0  char[8]  magic "MOMTOK\0\0"
//           8  u32      version (1)
//          12  u32      bytes per token: 2 (u16) or 4 (u32)
//          16  u64      token count
//          24  u64      vocabulary size (every token id is < vocab)
//          32  char[16] tokenizer name, NUL-padded ("byte", "gpt2")
//          48  u8[16]   reserved, zero
//          64  count tokens
#pragma once

#include <mom/core/check.hpp>
#include <mom/core/tensor.hpp>
#include <mom/train/checksum.hpp>
#include <mom/train/file_io.hpp>
#include <mom/train/tokenizer.hpp>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace mom::train {

inline constexpr std::array<char, 8> token_file_magic = {'M', 'O', 'M', 'T', 'O', 'K', '\0', '\0'};
inline constexpr std::uint32_t token_file_version = 1;
inline constexpr std::size_t token_file_header_bytes = 64;

// A data path must name a regular file: opening a FIFO would block until a writer appears (a hang), and a
// device or socket has no size to map. Checked before anything opens the path.
inline void check_regular_data_file(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto st = fs::status(path, ec);
  MOM_CHECK(st.type() != fs::file_type::not_found, "data file '", path.string(), "' does not exist");
  MOM_CHECK(st.type() != fs::file_type::directory, "data file '", path.string(), "' is a directory");
  MOM_CHECK(st.type() == fs::file_type::regular, "data file '", path.string(),
            "' is not a regular file (a FIFO, device or socket): pass a file");
}

// Writes tokens (all in [0, vocab)) to a token file, atomically. u16 when the vocabulary fits, else u32.
inline void write_token_file(const std::filesystem::path& path, std::span<const token_t> tokens, index_t vocab,
                             std::string_view tokenizer_name) {
  MOM_CHECK(vocab > 0 && vocab <= (index_t(1) << 31), "write_token_file: vocab ", vocab, " out of range");
  MOM_CHECK(tokenizer_name.size() < 16, "write_token_file: tokenizer name '", std::string(tokenizer_name),
            "' is longer than 15 characters");
  if (const auto known = known_tokenizer_vocab(tokenizer_name))
    MOM_CHECK(vocab == *known, "write_token_file: vocab ", vocab, " is not the ", std::string(tokenizer_name),
              " tokenizer's ", *known);
  for (std::size_t i = 0; i < tokens.size(); ++i)
    MOM_CHECK(tokens[i] >= 0 && tokens[i] < vocab, "write_token_file: token ", i, " has id ", tokens[i],
              " outside the vocabulary [0, ", vocab, ")");
  const int width = vocab <= 65536 ? 2 : 4;
  std::array<std::byte, token_file_header_bytes> header{};
  std::memcpy(header.data(), token_file_magic.data(), 8);
  put_le(header.data() + 8, token_file_version, 4);
  put_le(header.data() + 12, static_cast<std::uint64_t>(width), 4);
  put_le(header.data() + 16, tokens.size(), 8);
  put_le(header.data() + 24, static_cast<std::uint64_t>(vocab), 8);
  std::memcpy(header.data() + 32, tokenizer_name.data(), tokenizer_name.size());
  write_file_atomically(path, [&](const auto& sink) {
    sink(header.data(), header.size());
    std::vector<std::byte> chunk;
    constexpr std::size_t per_chunk = 1 << 16;
    for (std::size_t i = 0; i < tokens.size(); i += per_chunk) {
      const std::size_t n = std::min(per_chunk, tokens.size() - i);
      chunk.resize(n * static_cast<std::size_t>(width));
      for (std::size_t k = 0; k < n; ++k)
        put_le(chunk.data() + k * static_cast<std::size_t>(width), static_cast<std::uint32_t>(tokens[i + k]), width);
      sink(chunk.data(), chunk.size());
    }
  });
}

// A token file mapped read-only. Opening validates the header, the size and every token id.
class TokenFile {
 public:
  explicit TokenFile(const std::filesystem::path& path) : file_(open_checked(path)) {
    const std::byte* h = file_.bytes().data();
    const std::uint64_t width = get_le(h + 12, 4), count = get_le(h + 16, 8), vocab = get_le(h + 24, 8);
    char name[17] = {};
    std::memcpy(name, h + 32, 16);
    tokenizer_ = name;
    const std::string where = "token file '" + path.string() + "'";
    MOM_CHECK(width == 2 || width == 4, where, ": bytes per token is ", width, " (expected 2 or 4)");
    for (std::size_t i = 48; i < token_file_header_bytes; ++i)  // a later version may use them: not this one's
      MOM_CHECK(h[i] == std::byte{0}, where, ": reserved header byte ", i, " is not zero");
    MOM_CHECK(vocab > 0 && vocab <= (std::uint64_t(1) << 31), where, ": vocab ", vocab, " out of range");
    if (const auto known = known_tokenizer_vocab(tokenizer_))
      MOM_CHECK(vocab == std::uint64_t(*known), where, ": vocab ", vocab, " is not the ", tokenizer_,
                " tokenizer's ", *known, " (the header is inconsistent)");
    // Sizes compared by division, before any multiplication can wrap (a count near 2^64 / width would).
    const std::uint64_t data_bytes = file_.size() - token_file_header_bytes;
    MOM_CHECK(count <= data_bytes / width, where, " is truncated: header says ", count, " tokens of ", width,
              " bytes but only ", data_bytes, " data bytes follow the header");
    MOM_CHECK(data_bytes == count * width, where, " has ", data_bytes - count * width, " trailing bytes after ",
              count, " tokens");
    MOM_CHECK(count > 0, where, " holds no tokens");
    width_ = static_cast<int>(width);
    count_ = static_cast<index_t>(count);
    vocab_ = static_cast<index_t>(vocab);
    // Ids compared as the unsigned values stored (a 4-byte id >= 2^31 would be a negative token_t).
    std::uint64_t max_id = 0;
    index_t max_at = 0;
    const std::byte* tokens = file_.bytes().data() + token_file_header_bytes;
    for (index_t i = 0; i < count_; ++i)
      if (const std::uint64_t t = get_le(tokens + i * width_, width_); t > max_id) max_id = t, max_at = i;
    MOM_CHECK(max_id < std::uint64_t(vocab_), where, ": token ", max_at, " has id ", max_id, " >= vocab ", vocab_);
    max_id_ = static_cast<index_t>(max_id);
  }

  index_t size() const { return count_; }
  index_t vocab() const { return vocab_; }
  const std::string& tokenizer() const { return tokenizer_; }
  const std::filesystem::path& path() const { return file_.path(); }
  index_t max_id() const { return max_id_; }  // the largest token id in the file (< vocab)
  // XXH64 of the whole file (header and tokens), "xxh64:<hex>": what a checkpoint records of the data it
  // trained on. Computed on first use (~10 GB/s) and kept.
  const std::string& checksum() const {
    if (checksum_.empty()) checksum_ = checksum::format(checksum::xxh64(file_.bytes()));
    return checksum_;
  }
  token_t operator[](index_t i) const {
    const std::byte* p = file_.bytes().data() + token_file_header_bytes + i * width_;
    return static_cast<token_t>(get_le(p, width_));
  }
  // tokens[start .. start + out.size()) into out.
  void read(index_t start, std::span<token_t> out) const {
    MOM_CHECK(start >= 0 && start + ssize(out) <= count_, "TokenFile::read: [", start, ", ", start + ssize(out),
              ") outside the file's ", count_, " tokens");
    for (std::size_t k = 0; k < out.size(); ++k) out[k] = (*this)[start + static_cast<index_t>(k)];
  }

 private:
  static MappedFile open_checked(const std::filesystem::path& path) {
    check_regular_data_file(path);
    MappedFile f(path);
    MOM_CHECK(f.size() > 0, "data file '", path.string(), "' is empty");
    MOM_CHECK(f.size() >= token_file_header_bytes &&
                  std::memcmp(f.bytes().data(), token_file_magic.data(), token_file_magic.size()) == 0,
              "'", path.string(), "' is not a mom token file (bad magic; make one with `mom-train --data <text>`)");
    const auto version = get_le(f.bytes().data() + 8, 4);
    MOM_CHECK(version == token_file_version, "token file '", path.string(), "' has version ", version,
              ", this build reads version ", token_file_version);
    return f;
  }
  MappedFile file_;
  int width_ = 0;
  index_t count_ = 0, vocab_ = 0, max_id_ = 0;
  std::string tokenizer_;
  mutable std::string checksum_;
};

inline bool is_token_file(const std::filesystem::path& path) {
  check_regular_data_file(path);
  std::ifstream in(path, std::ios::binary);
  std::array<char, 8> magic{};
  return in.read(magic.data(), 8) && magic == token_file_magic;
}

// Reads a text file for tokenization; refuses missing, empty and binary files with a one-line message.
// "Binary" = any NUL byte, or more than 1% of the bytes in invalid UTF-8 sequences.
inline std::string read_text_file(const std::filesystem::path& path) {
  check_regular_data_file(path);
  MappedFile f(path);
  MOM_CHECK(f.size() > 0, "data file '", path.string(), "' is empty");
  const std::string_view text(reinterpret_cast<const char*>(f.bytes().data()), f.size());
  std::size_t nul = 0, invalid = 0;
  for (std::size_t i = 0; i < text.size();) {
    std::int32_t cp;
    const int len = unicode::decode_utf8(text, i, &cp);
    nul += cp == 0;
    invalid += cp < 0;
    i += static_cast<std::size_t>(len);
  }
  MOM_CHECK(nul == 0 && invalid * 100 <= text.size(), "data file '", path.string(),
            "' is not UTF-8 text (", nul, " NUL bytes, ", invalid, " invalid UTF-8 bytes in ", text.size(), ")");
  return std::string(text);
}

struct PreparedData {
  std::filesystem::path train, val;
  index_t train_tokens = 0, val_tokens = 0, vocab = 0;
  std::size_t text_bytes = 0;
};

// Tokenizes a UTF-8 text file into <out_dir>/train.bin and <out_dir>/val.bin: the last val_fraction of the
// tokens is the validation split (a contiguous tail, so no validation window overlaps a training one).
inline PreparedData prepare_text(const std::filesystem::path& text_path, const std::filesystem::path& out_dir,
                                 const Tokenizer& tokenizer, double val_fraction = 0.1) {
  MOM_CHECK(val_fraction > 0 && val_fraction < 1, "prepare_text: val_fraction ", val_fraction, " not in (0, 1)");
  const std::string text = read_text_file(text_path);
  std::vector<token_t> tokens;
  tokenizer.encode(text, tokens);
  const auto n = static_cast<index_t>(tokens.size());
  const auto n_val = static_cast<index_t>(double(n) * val_fraction);
  MOM_CHECK(n_val >= 2 && n - n_val >= 2, "data file '", text_path.string(), "' is too short: ", n,
            " tokens cannot be split into train and validation");
  ensure_writable_dir(out_dir);
  PreparedData out;
  out.train = out_dir / "train.bin";
  out.val = out_dir / "val.bin";
  const std::span<const token_t> all(tokens);
  write_token_file(out.train, all.first(static_cast<std::size_t>(n - n_val)), tokenizer.vocab_size(), tokenizer.name());
  write_token_file(out.val, all.last(static_cast<std::size_t>(n_val)), tokenizer.vocab_size(), tokenizer.name());
  out.train_tokens = n - n_val;
  out.val_tokens = n_val;
  out.vocab = tokenizer.vocab_size();
  out.text_bytes = text.size();
  return out;
}

// Entropy in nats of the unigram (token frequency) distribution of a token file: the loss of the best
// model that ignores context, the bar a trained model must get well below.
inline double unigram_entropy(const TokenFile& f) {
  // Sized by the ids present, not the header's vocabulary (which a file can claim to be 2^31).
  std::vector<std::uint64_t> counts(static_cast<std::size_t>(f.max_id()) + 1, 0);
  for (index_t i = 0; i < f.size(); ++i) ++counts[static_cast<std::size_t>(f[i])];
  double h = 0;
  for (auto c : counts)
    if (c) {
      const double p = double(c) / double(f.size());
      h -= p * std::log(p);
    }
  return h;
}

// ---- deterministic sampling -----------------------------------------------------------------------------------

// Uniform integer in [0, n) from raw mt19937_64 output by rejection (no std::uniform_int_distribution,
// whose algorithm differs between standard libraries): the same seed gives the same draws everywhere.
inline std::uint64_t uniform_below(std::mt19937_64& rng, std::uint64_t n) {
  MOM_CHECK(n > 0, "uniform_below: n must be > 0");
  const std::uint64_t threshold = (0 - n) % n;  // 2^64 mod n: draws below it would bias the modulo
  for (;;) {
    const std::uint64_t r = rng();
    if (r >= threshold) return r % n;
  }
}

// mt19937_64 state as text (the standard's portable operator<< format) and back.
inline std::string rng_state(const std::mt19937_64& rng) {
  std::ostringstream os;
  os << rng;
  return os.str();
}
inline void set_rng_state(std::mt19937_64& rng, const std::string& state) {
  std::istringstream is(state);
  std::mt19937_64 r;
  is >> r;
  MOM_CHECK(!is.fail(), "RNG state is malformed (", state.size(), " characters)");
  rng = r;
}

// Random (batch, seq + 1) windows of a token file: inputs are a window's first seq tokens, targets its last
// seq. Window starts are uniform over the file, drawn from a seeded mt19937_64.
//
// Data parallelism (train/distributed.hpp): rank r of `ranks` draws ranks x batch windows per micro-batch, as
// one process with batch ranks x batch would, and keeps windows [r batch, (r + 1) batch). Every rank's RNG
// stays in step, the ranks' windows are disjoint draws, and together they are exactly the windows of that
// single process (or of one process with batch `batch` and ranks micro-batches of gradient accumulation).
class BatchSampler {
 public:
  BatchSampler(const TokenFile& data, index_t batch, index_t seq, std::uint64_t seed, int rank = 0, int ranks = 1)
      : data_(&data), batch_(batch), seq_(seq), rank_(rank), ranks_(ranks), rng_(seed) {
    MOM_CHECK(batch > 0 && seq > 0, "BatchSampler: batch ", batch, " and seq ", seq, " must be > 0");
    MOM_CHECK(ranks > 0 && rank >= 0 && rank < ranks, "BatchSampler: rank ", rank, " of ", ranks);
    MOM_CHECK(data.size() >= seq + 1, "data file '", data.path().string(), "' has ", data.size(),
              " tokens, fewer than seq + 1 = ", seq + 1);
  }

  // Fills inputs and targets, each [batch * seq], row-major.
  void next(std::span<token_t> inputs, std::span<token_t> targets) {
    const auto n = static_cast<std::size_t>(batch_ * seq_);
    MOM_CHECK(inputs.size() == n && targets.size() == n, "BatchSampler::next: buffers of ", inputs.size(), " and ",
              targets.size(), " tokens for batch ", batch_, " x seq ", seq_);
    const auto starts = static_cast<std::uint64_t>(data_->size() - seq_);  // last start: size - seq - 1
    for (int r = 0; r < rank_; ++r)  // the windows of the ranks before this one
      for (index_t b = 0; b < batch_; ++b) uniform_below(rng_, starts);
    for (index_t b = 0; b < batch_; ++b) {
      const auto start = static_cast<index_t>(uniform_below(rng_, starts));
      for (index_t t = 0; t < seq_; ++t) {
        inputs[static_cast<std::size_t>(b * seq_ + t)] = (*data_)[start + t];
        targets[static_cast<std::size_t>(b * seq_ + t)] = (*data_)[start + t + 1];
      }
    }
    for (int r = rank_ + 1; r < ranks_; ++r)  // and after it
      for (index_t b = 0; b < batch_; ++b) uniform_below(rng_, starts);
  }

  std::string state() const { return rng_state(rng_); }
  void set_state(const std::string& s) { set_rng_state(rng_, s); }
  index_t batch() const { return batch_; }
  index_t seq() const { return seq_; }

 private:
  const TokenFile* data_;
  index_t batch_, seq_;
  int rank_, ranks_;
  std::mt19937_64 rng_;
};

// The i-th fixed evaluation window set: consecutive, non-overlapping windows from the start of the file
// (wrapping around), the same for every evaluation so validation losses are comparable across steps.
inline void eval_batch(const TokenFile& data, index_t batch, index_t seq, index_t i, std::span<token_t> inputs,
                       std::span<token_t> targets) {
  MOM_CHECK(data.size() >= seq + 1, "validation file '", data.path().string(), "' has ", data.size(),
            " tokens, fewer than seq + 1 = ", seq + 1);
  const index_t windows = (data.size() - 1) / seq;
  for (index_t b = 0; b < batch; ++b) {
    const index_t start = ((i * batch + b) % windows) * seq;
    for (index_t t = 0; t < seq; ++t) {
      inputs[static_cast<std::size_t>(b * seq + t)] = data[start + t];
      targets[static_cast<std::size_t>(b * seq + t)] = data[start + t + 1];
    }
  }
}

}  // namespace mom::train

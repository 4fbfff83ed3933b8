// libFuzzer harness for the token-file reader (mom::train::TokenFile, mom/train/data.hpp): any byte string is
// either refused with a mom::Error or opens into a file whose header matches its size and whose every token
// is inside the vocabulary; reading, sampling and evaluation windows then stay inside the file.
#include <mom/train/data.hpp>

#include "fuzz_support.hpp"

#include <cmath>
#include <cstdint>
#include <vector>

namespace tr = mom::train;
using mom::index_t;
using mom::token_t;

namespace {

void check(const tr::TokenFile& f, std::size_t size, const std::uint8_t* data) {
  std::uint64_t width = 0;
  for (int i = 0; i < 4; ++i) width |= static_cast<std::uint64_t>(data[12 + i]) << (8 * i);
  MOM_FUZZ_ASSERT(width == 2 || width == 4, "bytes per token %llu accepted", static_cast<unsigned long long>(width));
  const index_t n = f.size();
  MOM_FUZZ_ASSERT(n > 0, "a file of %lld tokens accepted", static_cast<long long>(n));
  std::uint64_t body = 0;
  const bool overflow = __builtin_mul_overflow(static_cast<std::uint64_t>(n), width, &body);
  MOM_FUZZ_ASSERT(!overflow && body == size - tr::token_file_header_bytes,
                  "header says %lld tokens of %llu bytes but the file has %zu bytes after the header",
                  static_cast<long long>(n), static_cast<unsigned long long>(width), size - tr::token_file_header_bytes);
  MOM_FUZZ_ASSERT(f.vocab() > 0 && f.vocab() <= (index_t(1) << 31), "vocab %lld accepted",
                  static_cast<long long>(f.vocab()));
  MOM_FUZZ_ASSERT(f.tokenizer().size() <= 16, "tokenizer name of %zu bytes", f.tokenizer().size());
  std::vector<token_t> all(static_cast<std::size_t>(n));
  f.read(0, all);
  if (mom_fuzz::known("negative-token-id"))  // u32 ids >= 2^31 read back as negative token_t and pass the check
    for (token_t t : all)
      if (t < 0) return;
  for (index_t i = 0; i < n; ++i) {
    const token_t t = all[static_cast<std::size_t>(i)];
    MOM_FUZZ_ASSERT(t == f[i], "read() and operator[] disagree at %lld", static_cast<long long>(i));
    MOM_FUZZ_ASSERT(t >= 0 && t < f.vocab(), "token %lld is %d, vocab %lld", static_cast<long long>(i), t,
                    static_cast<long long>(f.vocab()));
  }
  bool refused = false;
  try {
    std::vector<token_t> one(1);
    f.read(n, one);
  } catch (const mom::Error&) {
    refused = true;
  }
  MOM_FUZZ_ASSERT(refused, "read past the last token accepted");
  if (f.vocab() <= (1 << 20)) {
    const double h = tr::unigram_entropy(f);
    MOM_FUZZ_ASSERT(std::isfinite(h) && h >= 0 && h <= std::log(double(f.vocab())) + 1e-9, "unigram entropy %g", h);
  }
  if (n >= 2) {
    const index_t seq = std::min<index_t>(8, n - 1), batch = 3;
    std::vector<token_t> in(static_cast<std::size_t>(batch * seq)), tg(in.size());
    tr::BatchSampler sampler(f, batch, seq, 7);
    for (int k = 0; k < 2; ++k) sampler.next(in, tg);
    for (index_t i = 0; i < 3; ++i) tr::eval_batch(f, batch, seq, i, in, tg);
    for (std::size_t k = 0; k < in.size(); ++k)
      MOM_FUZZ_ASSERT(in[k] >= 0 && in[k] < f.vocab() && tg[k] >= 0 && tg[k] < f.vocab(), "window token out of range");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static mom_fuzz::MemFile file;
  const std::string& path = file.write(data, size);
  try {
    const tr::TokenFile f(path);
    MOM_FUZZ_ASSERT(tr::is_token_file(path), "an opened token file is not is_token_file()");
    check(f, size, data);
  } catch (const mom::Error&) {
    // refused with a message: the expected outcome for malformed input
  }
  return 0;
}

// libFuzzer harness for the safetensors reader (mom/train/safetensors.hpp): any byte string is either
// refused with a mom::Error or opens into tensors whose shapes, dtypes and offsets are consistent with the
// bytes, and every tensor then reads back. Anything else (another exception, a sanitizer report, an
// inconsistent tensor) is a finding.
#include <mom/train/safetensors.hpp>

#include "fuzz_support.hpp"

#include <cstdint>
#include <vector>

namespace st = mom::train::safetensors;

namespace {

std::uint64_t le64(const std::uint8_t* p) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(p[i]) << (8 * i);
  return v;
}

template <class T>
void read_all(const st::File& f, const st::TensorInfo& t, std::int64_t elements) {
  std::vector<T> out(static_cast<std::size_t>(elements));
  if (elements == 0 && mom_fuzz::known("empty-span-read")) {
    // read() memcpy's into out.data(), which is null for an empty vector: UB even for 0 bytes.
    T one{};
    f.read<T>(t.name, std::span<T>(&one, 0));
    return;
  }
  f.read<T>(t.name, std::span<T>(out));
  if (elements > 0) {  // a wrong element count is refused
    bool refused = false;
    try {
      f.read<T>(t.name, std::span<T>(out).first(out.size() - 1));
    } catch (const mom::Error&) {
      refused = true;
    }
    MOM_FUZZ_ASSERT(refused, "tensor '%s': read with one element too few was accepted", t.name.c_str());
  }
}

void check(const st::File& f, std::size_t size, const std::uint8_t* data) {
  const std::uint64_t header = le64(data);
  const std::uint64_t data_bytes = size - 8 - header;  // the reader accepted the header length
  for (const auto& t : f.tensors()) {
    const std::size_t es = st::dtype_size(t.dtype);
    MOM_FUZZ_ASSERT(es > 0, "tensor '%s' has unknown dtype '%s'", t.name.c_str(), t.dtype.c_str());
    std::uint64_t elements = 1;
    bool overflow = false;
    for (auto s : t.shape) {
      MOM_FUZZ_ASSERT(s >= 0, "tensor '%s' has a negative dimension", t.name.c_str());
      overflow |= __builtin_mul_overflow(elements, static_cast<std::uint64_t>(s), &elements);
    }
    std::uint64_t bytes = 0;
    overflow |= __builtin_mul_overflow(elements, static_cast<std::uint64_t>(es), &bytes);
    MOM_FUZZ_ASSERT(!overflow, "tensor '%s': element count times dtype size overflows 64 bits", t.name.c_str());
    MOM_FUZZ_ASSERT(t.begin <= t.end && t.end <= data_bytes && t.end - t.begin == bytes,
                    "tensor '%s': offsets [%llu, %llu] vs %llu bytes of shape, %llu data bytes", t.name.c_str(),
                    static_cast<unsigned long long>(t.begin), static_cast<unsigned long long>(t.end),
                    static_cast<unsigned long long>(bytes), static_cast<unsigned long long>(data_bytes));
    MOM_FUZZ_ASSERT(f.find(t.name) == &t, "find('%s') is not the tensor", t.name.c_str());
    const auto n = static_cast<std::int64_t>(elements);
    if (t.dtype == "F32") read_all<float>(f, t, n);
    else if (t.dtype == "F64") read_all<double>(f, t, n);
    else if (t.dtype == "I32") read_all<std::int32_t>(f, t, n);
    else if (t.dtype == "I64") read_all<std::int64_t>(f, t, n);
    else if (t.dtype == "U8") read_all<std::uint8_t>(f, t, n);
    if (t.dtype != "F32") {  // a dtype mismatch is refused
      std::vector<float> out(static_cast<std::size_t>(n) + 1);
      out.pop_back();
      bool refused = false;
      try {
        f.read<float>(t.name, std::span<float>(out));
      } catch (const mom::Error&) {
        refused = true;
      }
      MOM_FUZZ_ASSERT(refused, "tensor '%s' of dtype %s read as F32", t.name.c_str(), t.dtype.c_str());
    }
  }
  for (const auto& [k, v] : f.metadata()) MOM_FUZZ_ASSERT(f.meta(k) == v, "metadata '%s' reads back differently", k.c_str());
  try {
    (void)f.meta("\x01 not a key");
    MOM_FUZZ_ASSERT(f.metadata().count("\x01 not a key"), "a missing metadata key was found");
  } catch (const mom::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static mom_fuzz::MemFile file;
  const std::string& path = file.write(data, size);
  try {
    const st::File f(path);
    check(f, size, data);
  } catch (const mom::Error&) {
    // refused with a message: the expected outcome for malformed input
  }
  return 0;
}

// safetensors (https://github.com/huggingface/safetensors), the format PyTorch / Hugging Face users load
// directly:
//   8 bytes      N, unsigned little-endian: length of the header
//   N bytes      UTF-8 JSON: {"<name>": {"dtype": "F32", "shape": [r, c], "data_offsets": [begin, end]}, ...,
//                             "__metadata__": {"<key>": "<string value>", ...}}
//                (padded with spaces to a multiple of 8 so the data is aligned)
//   the rest     tensor data, little-endian, row-major; offsets relative to the start of this block
// The reader validates everything before handing out a byte: JSON syntax, dtype names, shapes against
// offsets, offsets inside the file, tensors tiling the data block, and a truncated file is named as such.
#pragma once

#include <mom/core/check.hpp>
#include <mom/core/tensor.hpp>
#include <mom/train/file_io.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace mom::train::safetensors {

// Bytes per element of a safetensors dtype name; 0 for names this library does not read.
inline std::size_t dtype_size(std::string_view dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL") return 1;
  return 0;
}

template <class T>
constexpr std::string_view dtype_of() {
  if constexpr (std::is_same_v<T, float>) return "F32";
  else if constexpr (std::is_same_v<T, double>) return "F64";
  else if constexpr (std::is_same_v<T, std::int32_t>) return "I32";
  else if constexpr (std::is_same_v<T, std::int64_t>) return "I64";
  else if constexpr (std::is_same_v<T, std::uint8_t>) return "U8";
  else static_assert(sizeof(T) == 0, "safetensors: unsupported element type");
}

// Collects tensors (by reference: the data must outlive write()) and metadata, then writes one file atomically.
class Writer {
 public:
  template <class T>
  void add(std::string name, std::span<const T> data, std::vector<std::int64_t> shape) {
    static_assert(std::endian::native == std::endian::little, "safetensors writer: big-endian hosts not supported");
    std::int64_t n = 1;
    for (auto s : shape) n *= s;
    MOM_CHECK(n == static_cast<std::int64_t>(data.size()), "safetensors: tensor '", name, "' has ", data.size(),
              " elements but shape product ", n);
    MOM_CHECK(name != "__metadata__" && !name.empty(), "safetensors: invalid tensor name '", name, "'");
    for (const auto& e : entries_) MOM_CHECK(e.name != name, "safetensors: duplicate tensor name '", name, "'");
    entries_.push_back({std::move(name), std::string(dtype_of<T>()), std::move(shape),
                        reinterpret_cast<const std::byte*>(data.data()), data.size_bytes()});
  }
  void metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }

  void write(const std::filesystem::path& path) const {
    nlohmann::ordered_json header = nlohmann::ordered_json::object();
    if (!metadata_.empty()) header["__metadata__"] = metadata_;
    std::uint64_t offset = 0;
    for (const auto& e : entries_) {
      header[e.name] = {{"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {offset, offset + e.bytes}}};
      offset += e.bytes;
    }
    std::string json = header.dump();
    json.resize((json.size() + 7) / 8 * 8, ' ');
    std::byte len[8];
    put_le(len, json.size(), 8);
    write_file_atomically(path, [&](const auto& sink) {
      sink(len, 8);
      sink(json.data(), json.size());
      for (const auto& e : entries_) sink(e.data, e.bytes);
    });
  }

 private:
  struct Entry {
    std::string name, dtype;
    std::vector<std::int64_t> shape;
    const std::byte* data;
    std::size_t bytes;
  };
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

struct TensorInfo {
  std::string name, dtype;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;  // byte offsets in the data block
  std::int64_t elements() const {
    std::int64_t n = 1;
    for (auto s : shape) n *= s;
    return n;
  }
};

// A safetensors file mapped read-only and validated on open.
class File {
 public:
  explicit File(const std::filesystem::path& path) {
    const std::string where = "checkpoint file '" + path.string() + "'";
    MOM_CHECK(std::filesystem::exists(path), where, " does not exist");
    file_ = MappedFile(path);
    const auto bytes = file_.bytes();
    MOM_CHECK(bytes.size() >= 8, where, " is truncated (", bytes.size(), " bytes, less than the 8-byte header length)");
    const std::uint64_t n = get_le(bytes.data(), 8);
    MOM_CHECK(n <= 100'000'000, where, " is corrupted: header length ", n, " is implausible");
    MOM_CHECK(n <= bytes.size() - 8, where, " is truncated: header of ", n, " bytes but only ", bytes.size() - 8,
              " bytes follow");
    nlohmann::json header;
    try {
      header = nlohmann::json::parse(reinterpret_cast<const char*>(bytes.data()) + 8,
                                     reinterpret_cast<const char*>(bytes.data()) + 8 + n);
    } catch (const std::exception& e) {
      throw Error(where + " is corrupted: header is not valid JSON (" + e.what() + ")");
    }
    MOM_CHECK(header.is_object(), where, " is corrupted: header is not a JSON object");
    data_ = bytes.subspan(8 + n);
    for (auto& [key, value] : header.items()) {
      if (key == "__metadata__") {
        MOM_CHECK(value.is_object(), where, " is corrupted: __metadata__ is not an object");
        for (auto& [k, v] : value.items()) {
          MOM_CHECK(v.is_string(), where, " is corrupted: metadata '", k, "' is not a string");
          metadata_[k] = v.get<std::string>();
        }
        continue;
      }
      try {
        TensorInfo t;
        t.name = key;
        t.dtype = value.at("dtype").get<std::string>();
        t.shape = value.at("shape").get<std::vector<std::int64_t>>();
        const auto offsets = value.at("data_offsets").get<std::vector<std::uint64_t>>();
        MOM_CHECK(offsets.size() == 2, "data_offsets has ", offsets.size(), " entries");
        t.begin = offsets[0];
        t.end = offsets[1];
        tensors_.push_back(std::move(t));
      } catch (const nlohmann::json::exception& e) {
        throw Error(where + " is corrupted: entry '" + key + "' is malformed (" + e.what() + ")");
      } catch (const Error& e) {
        throw Error(where + " is corrupted: entry '" + key + "': " + e.what());
      }
    }
    // Tensors must tile the data block exactly: sorted by offset, each starting where the previous ended.
    std::vector<const TensorInfo*> by_offset;
    for (const auto& t : tensors_) by_offset.push_back(&t);
    std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
    std::uint64_t at = 0;
    for (const TensorInfo* t : by_offset) {
      const std::size_t es = dtype_size(t->dtype);
      MOM_CHECK(es > 0, where, " is corrupted: tensor '", t->name, "' has unknown dtype '", t->dtype, "'");
      for (auto s : t->shape) MOM_CHECK(s >= 0, where, " is corrupted: tensor '", t->name, "' has a negative dimension");
      MOM_CHECK(t->begin <= t->end && t->end - t->begin == static_cast<std::uint64_t>(t->elements()) * es, where,
                " is corrupted: tensor '", t->name, "' data_offsets [", t->begin, ", ", t->end,
                "] do not match its shape and dtype");
      MOM_CHECK(t->begin == at, where, " is corrupted: tensor '", t->name, "' starts at byte ", t->begin,
                ", expected ", at, " (tensors must tile the data without gaps or overlap)");
      at = t->end;
    }
    MOM_CHECK(at <= data_.size(), where, " is truncated: tensors need ", at, " data bytes but the file has ",
              data_.size());
    MOM_CHECK(at == data_.size(), where, " is corrupted: ", data_.size() - at, " bytes after the last tensor");
  }

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path_string() const { return file_.path().native(); }

  const TensorInfo* find(std::string_view name) const {
    for (const auto& t : tensors_)
      if (t.name == name) return &t;
    return nullptr;
  }
  std::string meta(const std::string& key) const {
    auto it = metadata_.find(key);
    MOM_CHECK(it != metadata_.end(), "checkpoint file '", file_.path().string(), "' lacks metadata '", key, "'");
    return it->second;
  }

  // Copies tensor `name` (dtype must be T's, element count out.size()) into out.
  template <class T>
  void read(std::string_view name, std::span<T> out) const {
    const TensorInfo* t = find(name);
    MOM_CHECK(t != nullptr, "checkpoint file '", file_.path().string(), "' has no tensor '", std::string(name), "'");
    MOM_CHECK(t->dtype == dtype_of<T>(), "checkpoint file '", file_.path().string(), "': tensor '", t->name,
              "' is ", t->dtype, ", expected ", dtype_of<T>());
    MOM_CHECK(t->elements() == static_cast<std::int64_t>(out.size()), "checkpoint file '", file_.path().string(),
              "': tensor '", t->name, "' has ", t->elements(), " elements, expected ", out.size());
    std::memcpy(out.data(), data_.data() + t->begin, out.size_bytes());
  }

 private:
  MappedFile file_;
  std::span<const std::byte> data_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace mom::train::safetensors

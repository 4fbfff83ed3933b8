// safetensors (https://github.com/huggingface/safetensors), the format PyTorch / Hugging Face users load
// directly:
//   8 bytes      N, unsigned little-endian: length of the header
//   N bytes      UTF-8 JSON: {"<name>": {"dtype": "F32", "shape": [r, c], "data_offsets": [begin, end]}, ...,
//                             "__metadata__": {"<key>": "<string value>", ...}}
//                (padded with spaces to a multiple of 8 so the data is aligned)
//   the rest     tensor data, little-endian, row-major; offsets relative to the start of this block
//
// Checksums (mom's addition; plain string metadata, so other readers ignore them): the Writer stores
//   "mom.checksum.<tensor name>": "xxh64:<hex>"   XXH64 (checksum.hpp) of that tensor's data bytes
//   "mom.header_checksum":        "xxh64:<hex>"   XXH64 of canonical_header(): every other metadata entry
//                                                 (the per-tensor checksums included) and every tensor's name,
//                                                 dtype, shape and data_offsets
// so any change to a tensor's bytes, a metadata value, a key, a shape, a dtype or an offset is caught, while
// the JSON's formatting (whitespace, key order) is not part of what is checked. A file with neither kind of
// key (written by another tool, or by mom before checksums) is read unverified; a file with either must
// carry all of them.
//
// The reader validates everything before handing out a byte: JSON syntax and types (integers are integers),
// dtype names, shapes against offsets (sizes that would overflow are refused), offsets inside the file,
// tensors tiling the data block, the checksums, and a truncated file is named as such.
#pragma once

#include <mom/core/check.hpp>
#include <mom/core/tensor.hpp>
#include <mom/train/checksum.hpp>
#include <mom/train/file_io.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace mom::train::safetensors {

inline constexpr std::string_view checksum_prefix = "mom.checksum.";      // + tensor name
inline constexpr std::string_view header_checksum_key = "mom.header_checksum";

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

// The element count of a shape; nullopt when a dimension is negative or the product overflows int64.
inline std::optional<std::int64_t> checked_elements(std::span<const std::int64_t> shape) {
  std::int64_t n = 1;
  for (auto s : shape)
    if (s < 0 || __builtin_mul_overflow(n, s, &n)) return std::nullopt;
  return n;
}

struct TensorInfo {
  std::string name, dtype;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;  // byte offsets in the data block
  std::int64_t elements() const {
    const auto n = checked_elements(shape);
    MOM_CHECK(n.has_value(), "safetensors: tensor '", name, "' has a negative dimension or an overflowing size");
    return *n;
  }
};

// The text mom.header_checksum hashes, byte for byte (a reader in another language rebuilds it from the
// parsed header): the line "mom.header.v1\n", then for every metadata entry except mom.header_checksum, by
// key in byte order,
//   "m <key bytes>:<key> <value bytes>:<value>\n"
// then for every tensor, by name in byte order,
//   "t <name bytes>:<name> <dtype> [<dim>,<dim>,...] <begin>,<end>\n"
// (numbers in decimal; strings UTF-8 as in the JSON after unescaping; <x bytes> is the length of x).
inline std::string canonical_header(const std::map<std::string, std::string>& metadata,
                                    std::vector<const TensorInfo*> tensors) {
  std::string out = "mom.header.v1\n";
  auto str = [&](const std::string& s) {
    out += std::to_string(s.size());
    out += ':';
    out += s;
  };
  for (const auto& [k, v] : metadata) {  // std::map: byte order
    if (k == header_checksum_key) continue;
    out += "m ";
    str(k);
    out += ' ';
    str(v);
    out += '\n';
  }
  std::sort(tensors.begin(), tensors.end(), [](auto* a, auto* b) { return a->name < b->name; });
  for (const TensorInfo* t : tensors) {
    out += "t ";
    str(t->name);
    out += ' ';
    out += t->dtype;
    out += " [";
    for (std::size_t i = 0; i < t->shape.size(); ++i) {
      if (i) out += ',';
      out += std::to_string(t->shape[i]);
    }
    out += "] ";
    out += std::to_string(t->begin);
    out += ',';
    out += std::to_string(t->end);
    out += '\n';
  }
  return out;
}

// Collects tensors (by reference: the data must outlive write()) and metadata, then writes one file
// atomically, with the checksums described above.
class Writer {
 public:
  template <class T>
  void add(std::string name, std::span<const T> data, std::vector<std::int64_t> shape) {
    static_assert(std::endian::native == std::endian::little, "safetensors writer: big-endian hosts not supported");
    const auto n = checked_elements(shape);
    MOM_CHECK(n.has_value(), "safetensors: tensor '", name, "' has a negative dimension or an overflowing shape");
    MOM_CHECK(*n == static_cast<std::int64_t>(data.size()), "safetensors: tensor '", name, "' has ", data.size(),
              " elements but shape product ", *n);
    MOM_CHECK(name != "__metadata__" && !name.empty(), "safetensors: invalid tensor name '", name, "'");
    for (const auto& e : entries_) MOM_CHECK(e.info.name != name, "safetensors: duplicate tensor name '", name, "'");
    Entry e;
    e.info.name = std::move(name);
    e.info.dtype = std::string(dtype_of<T>());
    e.info.shape = std::move(shape);
    e.data = reinterpret_cast<const std::byte*>(data.data());
    e.bytes = data.size_bytes();
    e.info.begin = entries_.empty() ? 0 : entries_.back().info.end;
    e.info.end = e.info.begin + e.bytes;
    entries_.push_back(std::move(e));
    signed_.reset();
  }
  void metadata(const std::string& key, const std::string& value) {
    MOM_CHECK(!key.starts_with(checksum_prefix) && key != header_checksum_key, "safetensors: metadata key '", key,
              "' is reserved for the checksums");
    metadata_[key] = value;
    signed_.reset();
  }

  // The "mom.header_checksum" write() stores: it names the file's exact contents (its tensors' checksums are
  // part of what it hashes), so another file can record which file it belongs with (a checkpoint's optimizer
  // file records its model file's). The tensors are hashed once for this and write() together: their data
  // must not change in between (as it must not before write() anyway).
  std::string header_checksum() const { return signed_metadata().at(std::string(header_checksum_key)); }

  void write(const std::filesystem::path& path) const {
    const std::map<std::string, std::string>& meta = signed_metadata();

    nlohmann::ordered_json header = nlohmann::ordered_json::object();
    header["__metadata__"] = meta;
    for (const auto& e : entries_)
      header[e.info.name] = {{"dtype", e.info.dtype}, {"shape", e.info.shape},
                             {"data_offsets", {e.info.begin, e.info.end}}};
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
  // The metadata with every tensor's checksum and the header checksum added; computed once, until add() or
  // metadata() changes what it covers.
  const std::map<std::string, std::string>& signed_metadata() const {
    if (signed_) return *signed_;
    std::map<std::string, std::string> meta = metadata_;
    std::vector<const TensorInfo*> infos;
    for (const auto& e : entries_) {
      infos.push_back(&e.info);
      meta[std::string(checksum_prefix) + e.info.name] = checksum::format(checksum::xxh64(e.data, e.bytes));
    }
    meta[std::string(header_checksum_key)] = checksum::format(checksum::xxh64(canonical_header(meta, infos)));
    return *(signed_ = std::move(meta));
  }
  struct Entry {
    TensorInfo info;
    const std::byte* data;
    std::size_t bytes;
  };
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
  mutable std::optional<std::map<std::string, std::string>> signed_;  // signed_metadata()
};

// A safetensors file mapped read-only and validated (checksums included) on open.
// A JSON value for an error message, without recursion on its depth (a header nested 200,000 deep would overflow
// the stack in dump()): a scalar, or an array / object of scalars, as JSON (at most `max_chars`); one holding
// arrays or objects as "an array of N" / "an object of N".
inline std::string json_brief(const nlohmann::json& j, std::size_t max_chars = 400) {
  if (j.is_structured()) {
    for (const auto& e : j)
      if (e.is_structured()) return std::string(j.is_array() ? "an array of " : "an object of ") + std::to_string(j.size());
  }
  std::string s = j.dump();
  if (s.size() > max_chars) s = s.substr(0, max_chars) + "...";
  return s;
}

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
        tensors_.push_back(parse_entry(key, value));
      } catch (const Error& e) {
        throw Error(where + " is corrupted: entry '" + key + "' is malformed (" + e.what() + ")");
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
      const auto count = checked_elements(t->shape);
      std::uint64_t size = 0;
      MOM_CHECK(count && !__builtin_mul_overflow(static_cast<std::uint64_t>(*count), es, &size), where,
                " is corrupted: tensor '", t->name, "' has a negative dimension or a size that overflows");
      MOM_CHECK(t->begin <= t->end && t->end - t->begin == size, where, " is corrupted: tensor '", t->name,
                "' data_offsets [", t->begin, ", ", t->end, "] do not match its shape and dtype");
      MOM_CHECK(t->begin == at, where, " is corrupted: tensor '", t->name, "' starts at byte ", t->begin,
                ", expected ", at, " (tensors must tile the data without gaps or overlap)");
      at = t->end;
    }
    MOM_CHECK(at <= data_.size(), where, " is truncated: tensors need ", at, " data bytes but the file has ",
              data_.size());
    MOM_CHECK(at == data_.size(), where, " is corrupted: ", data_.size() - at, " bytes after the last tensor");
    verify_checksums(where);
  }

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path_string() const { return file_.path().native(); }
  // True when the file carries mom's checksums (all verified on open); false for a file from another tool.
  bool checksummed() const { return checksummed_; }

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
    if (!out.empty()) std::memcpy(out.data(), data_.data() + t->begin, out.size_bytes());  // memcpy(nullptr, ..): UB
  }

 private:
  // One tensor entry: exactly dtype (a string), shape (integers >= 0) and data_offsets (two integers >= 0).
  static TensorInfo parse_entry(const std::string& key, const nlohmann::json& value) {
    MOM_CHECK(value.is_object(), "not an object");
    MOM_CHECK(value.size() == 3 && value.contains("dtype") && value.contains("shape") && value.contains("data_offsets"),
              "an entry holds exactly dtype, shape and data_offsets");
    TensorInfo t;
    t.name = key;
    const auto& dtype = value["dtype"];
    MOM_CHECK(dtype.is_string(), "dtype is not a string");
    t.dtype = dtype.get<std::string>();
    const auto& shape = value["shape"];
    MOM_CHECK(shape.is_array(), "shape is not an array");
    for (const auto& d : shape) {
      MOM_CHECK(d.is_number_unsigned() && d.get<std::uint64_t>() <= std::uint64_t(std::numeric_limits<std::int64_t>::max()),
                "shape holds ", json_brief(d), ", not an integer >= 0");
      t.shape.push_back(static_cast<std::int64_t>(d.get<std::uint64_t>()));
    }
    const auto& offsets = value["data_offsets"];
    MOM_CHECK(offsets.is_array() && offsets.size() == 2 && offsets[0].is_number_unsigned() &&
                  offsets[1].is_number_unsigned(),
              "data_offsets ", json_brief(offsets), " is not two integers >= 0");
    t.begin = offsets[0].get<std::uint64_t>();
    t.end = offsets[1].get<std::uint64_t>();
    return t;
  }

  // See the top of this file. Runs after the structure is validated (offsets inside the data block).
  void verify_checksums(const std::string& where) {
    const auto header_it = metadata_.find(std::string(header_checksum_key));
    bool any = header_it != metadata_.end();
    for (const auto& [k, v] : metadata_) any = any || k.starts_with(checksum_prefix);
    if (!any) return;  // another tool's file: nothing to verify
    MOM_CHECK(header_it != metadata_.end(), where, " is corrupted: it has tensor checksums but no ",
              header_checksum_key);
    const auto want = checksum::parse(header_it->second);
    MOM_CHECK(want.has_value(), where, " is corrupted: ", header_checksum_key, " '", header_it->second,
              "' is not of the form xxh64:<16 hex digits>");
    std::vector<const TensorInfo*> infos;
    for (const auto& t : tensors_) infos.push_back(&t);
    MOM_CHECK(checksum::xxh64(canonical_header(metadata_, infos)) == *want, where,
              " is corrupted: its header (metadata, tensor names, shapes, dtypes or offsets) fails its checksum");
    for (const auto& [k, v] : metadata_)
      if (k.starts_with(checksum_prefix))
        MOM_CHECK(find(std::string_view(k).substr(checksum_prefix.size())) != nullptr, where,
                  " is corrupted: checksum '", k, "' names no tensor");
    for (const auto& t : tensors_) {
      const auto it = metadata_.find(std::string(checksum_prefix) + t.name);
      MOM_CHECK(it != metadata_.end(), where, " is corrupted: tensor '", t.name, "' has no checksum");
      const auto h = checksum::parse(it->second);
      MOM_CHECK(h.has_value(), where, " is corrupted: the checksum of tensor '", t.name, "' ('", it->second,
                "') is not of the form xxh64:<16 hex digits>");
      MOM_CHECK(checksum::xxh64(data_.data() + t.begin, t.end - t.begin) == *h, where, ": tensor '", t.name,
                "' fails its checksum (the file is corrupted)");
    }
    checksummed_ = true;
  }

  MappedFile file_;
  std::span<const std::byte> data_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
  bool checksummed_ = false;
};

}  // namespace mom::train::safetensors

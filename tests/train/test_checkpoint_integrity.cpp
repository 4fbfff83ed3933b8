// Checkpoint integrity: a seeded mutation test (a few hundred corrupted copies of a real checkpoint's two
// files; each must be refused with a mom::Error, or load bit-identically when the change is one the format
// ignores), the metadata cross-checks (step, ids, architecture, optimizer shapes, strict integers), non-finite
// values refused on load and on save, and files without checksums still loading.
#include <catch2/catch.hpp>

#include <mom/mom.hpp>
#include <mom/train/train.hpp>

#include "helpers.hpp"

#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>

using namespace mom;
using namespace mom::train;
using mom_test::read_bytes;
using mom_test::write_bytes;

namespace {

constexpr Dims tiny{.d_model = 32, .heads = 2, .d_ff = 64, .vocab = 256, .context = 32};
using Tiny = LM<tiny, Dense<2>>;
using Instance = decltype(Tiny::make<cpu::Backend<float>>(1));
using Ckpt = Checkpointer<Instance>;


// A safetensors file split into its parsed header and its data block, and joined back (header padded to 8).
struct Split {
  nlohmann::ordered_json header;
  std::string data;
};
std::uint64_t header_length(const std::string& bytes) {
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= std::uint64_t(static_cast<unsigned char>(bytes[std::size_t(i)])) << (8 * i);
  return n;
}
Split split(const std::string& bytes) {
  const std::uint64_t n = header_length(bytes);
  return {nlohmann::ordered_json::parse(bytes.substr(8, n)), bytes.substr(8 + n)};
}
std::string join(std::string json, const std::string& data, bool pad = true) {
  if (pad) json.resize((json.size() + 7) / 8 * 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[std::size_t(i)] = static_cast<char>((json.size() >> (8 * i)) & 0xFF);
  return out + json + data;
}
bool is_checksum_key(const std::string& k) { return k.rfind("mom.checksum.", 0) == 0 || k == "mom.header_checksum"; }
std::string without_checksums(const std::string& bytes) {
  Split s = split(bytes);
  auto& meta = s.header["__metadata__"];
  for (auto it = meta.begin(); it != meta.end();) it = is_checksum_key(it.key()) ? meta.erase(it) : std::next(it);
  return join(s.header.dump(), s.data);
}
// Rewrites a (float) checkpoint file through safetensors::Writer, so its checksums are valid again, after
// `edit` changed its metadata or tensors (name -> (shape, values)).
struct Tensors {
  std::vector<std::string> names;
  std::map<std::string, std::pair<std::vector<std::int64_t>, std::vector<float>>> values;
};
template <class Edit>
void resign(const std::filesystem::path& p, Edit edit) {
  std::map<std::string, std::string> meta;
  Tensors t;
  {
    safetensors::File f(p);
    for (const auto& [k, v] : f.metadata())
      if (!is_checksum_key(k)) meta[k] = v;
    for (const auto& info : f.tensors()) {
      std::vector<float> v(std::size_t(info.elements()));
      f.read<float>(info.name, v);
      t.names.push_back(info.name);
      t.values[info.name] = {info.shape, std::move(v)};
    }
  }
  edit(meta, t);
  safetensors::Writer w;
  for (const auto& name : t.names) w.add<float>(name, t.values[name].second, t.values[name].first);
  for (const auto& [k, v] : meta) w.metadata(k, v);
  w.write(p);
}

// A small model's checkpoint saved by the real Checkpointer, with non-trivial moments and sampler state.
struct Saved {
  mom_test::TempDir dir{"integrity"};
  Instance model = Tiny::make<cpu::Backend<float>>(1);
  std::vector<float> m, v;
  TrainState state;
  std::filesystem::path step_dir;
  Saved() {
    std::mt19937_64 g(5);
    std::normal_distribution<float> normal(0.f, 0.01f);
    for (index_t i = 0; i < Tiny::params; ++i) {
      const float x = normal(g);
      m.push_back(x);
      v.push_back(x * x + 1e-9f);
    }
    std::mt19937_64 sampler(42);
    sampler.discard(1000);
    state = {7, rng_state(sampler)};
    step_dir = Ckpt::save(dir / "run", model, m, v, state,
                          {{"mom.arch", "tiny-test"}, {"mom.tokenizer", "byte"}, {"mom.config", "{\"steps\":7}"}});
  }
  std::filesystem::path model_file() const { return step_dir / "model.safetensors"; }
  std::filesystem::path opt_file() const { return step_dir / "optimizer.safetensors"; }
};

// Loads `path` into a fresh model (other init) and returns whether it equals `saved` bit for bit; a refusal
// throws, and leaves the fresh model untouched (checked).
struct Loaded {
  bool identical;
};
Loaded load_and_compare(Saved& saved, const std::filesystem::path& path) {
  static auto fresh = Tiny::make<cpu::Backend<float>>(9);  // made once: the mutation test loads hundreds of times
  static const std::vector<float> before(fresh.params().begin(), fresh.params().end());
  std::copy(before.begin(), before.end(), fresh.params().begin());
  std::vector<float> m(Tiny::params, 3.f), v(Tiny::params, 3.f);
  TrainState s{-1, "untouched"};
  try {
    Ckpt::load(path, fresh, m, v, s);
  } catch (const Error&) {
    const bool untouched = std::memcmp(before.data(), fresh.params().data(), before.size() * sizeof(float)) == 0 &&
                           m == std::vector<float>(Tiny::params, 3.f) && s.step == -1 && s.sampler_state == "untouched";
    if (!untouched) throw std::runtime_error("a refused checkpoint changed the model or the state");
    throw;
  }
  const bool same =
      std::memcmp(saved.model.params().data(), fresh.params().data(), fresh.params().size_bytes()) == 0 &&
      std::memcmp(saved.m.data(), m.data(), m.size() * sizeof(float)) == 0 &&
      std::memcmp(saved.v.data(), v.data(), v.size() * sizeof(float)) == 0 && s.step == saved.state.step &&
      s.sampler_state == saved.state.sampler_state;
  return {same};
}

// One mutation of a safetensors file's bytes. Returns a description; `out` is the mutant (never == in).
std::string mutate(const std::string& in, std::mt19937_64& g, std::string& out) {
  auto pick = [&](std::size_t n) { return std::size_t(std::uniform_int_distribution<std::size_t>(0, n - 1)(g)); };
  const std::uint64_t n = header_length(in);
  const std::size_t data_at = 8 + n;
  out = in;
  switch (pick(16)) {
    case 0: {  // bit flip in the length prefix
      const std::size_t at = pick(8), bit = pick(8);
      out[at] = char(out[at] ^ (1 << bit));
      return "flip length byte " + std::to_string(at) + " bit " + std::to_string(bit);
    }
    case 1: case 2: {  // bit flip in the header JSON
      const std::size_t at = 8 + pick(n), bit = pick(8);
      out[at] = char(out[at] ^ (1 << bit));
      return "flip header byte " + std::to_string(at) + " bit " + std::to_string(bit);
    }
    case 3: case 4: {  // bit flip in the data
      const std::size_t at = data_at + pick(in.size() - data_at), bit = pick(8);
      out[at] = char(out[at] ^ (1 << bit));
      return "flip data byte " + std::to_string(at) + " bit " + std::to_string(bit);
    }
    case 5: {  // a byte overwritten anywhere
      const std::size_t at = pick(in.size());
      out[at] = char(out[at] ^ (1 + pick(255)));
      return "overwrite byte " + std::to_string(at);
    }
    case 6: {  // truncated
      const std::size_t len = pick(in.size());
      out.resize(len);
      return "truncate to " + std::to_string(len);
    }
    case 7: {  // bytes appended
      const std::size_t k = 1 + pick(64);
      for (std::size_t i = 0; i < k; ++i) out += char(pick(256));
      return "append " + std::to_string(k) + " bytes";
    }
    case 8: {  // header length changed
      const std::int64_t delta = std::int64_t(pick(33)) - 16;
      const std::uint64_t len = n + std::uint64_t(delta == 0 ? 8 : delta);
      for (int i = 0; i < 8; ++i) out[std::size_t(i)] = static_cast<char>((len >> (8 * i)) & 0xFF);
      return "header length " + std::to_string(len) + " instead of " + std::to_string(n);
    }
    case 9: {  // a 512-byte block of data zeroed (a lost sector)
      const std::size_t at = data_at + pick(in.size() - data_at);
      for (std::size_t i = at; i < std::min(in.size(), at + 512); ++i) out[i] = 0;
      return "zero data block at " + std::to_string(at);
    }
    case 10: {  // two equally long data ranges swapped
      const std::size_t len = 4 * (1 + pick(64)), span = in.size() - data_at - len;
      const std::size_t a = data_at + pick(span), b = data_at + pick(span);
      for (std::size_t i = 0; i < len; ++i) std::swap(out[a + i], out[b + i]);
      return "swap data ranges at " + std::to_string(a) + " and " + std::to_string(b);
    }
    default: break;
  }
  // JSON edits (cases 11..15), the file re-assembled with a correct length prefix.
  Split s = split(in);
  std::vector<std::string> tensors, keys;
  for (auto& [k, v] : s.header.items())
    if (k != "__metadata__") tensors.push_back(k);
  for (auto& [k, v] : s.header["__metadata__"].items()) keys.push_back(k);
  const std::string t = tensors[pick(tensors.size())];
  std::string what;
  switch (pick(12)) {
    case 0: {
      auto& shape = s.header[t]["shape"];
      const std::size_t d = pick(shape.size());
      const std::int64_t old = shape[d].get<std::int64_t>();
      const std::int64_t values[] = {old + 1, old - 1, old * 2, 0, (std::int64_t(1) << 62) + old};
      shape[d] = values[pick(5)];
      what = "shape of " + t + " -> " + shape.dump();
      break;
    }
    case 1: {
      auto shape = s.header[t]["shape"];  // the same element count, another shape
      if (shape.size() == 2) s.header[t]["shape"] = {shape[1], shape[0]};
      else s.header[t]["shape"] = {1, shape[0]};
      what = "reshape " + t + " -> " + s.header[t]["shape"].dump();
      break;
    }
    case 2: {
      auto& off = s.header[t]["data_offsets"][pick(2)];
      off = off.get<std::uint64_t>() + 4 * (1 + pick(4)) * (pick(2) ? 1 : std::uint64_t(-1));
      what = "offsets of " + t + " -> " + s.header[t]["data_offsets"].dump();
      break;
    }
    case 3: {
      const char* dtypes[] = {"F16", "BF16", "F64", "I32", "U32", "U8", "X"};
      s.header[t]["dtype"] = dtypes[pick(7)];
      what = "dtype of " + t + " -> " + s.header[t]["dtype"].dump();
      break;
    }
    case 4: case 5: {
      const std::string k = keys[pick(keys.size())];
      std::string value = s.header["__metadata__"][k].get<std::string>();
      const std::string replacements[] = {"", "8", "7.0", " 7", "7abc", "-7", value + "x", "x" + value};
      if (!value.empty() && pick(2)) value[pick(value.size())] ^= char(1 + pick(127));
      else value = replacements[pick(8)];
      s.header["__metadata__"][k] = value;
      what = "metadata " + k + " -> '" + value.substr(0, 40) + "'";
      break;
    }
    case 6: {
      const std::string k = keys[pick(keys.size())];
      s.header["__metadata__"].erase(k);
      what = "remove metadata " + k;
      break;
    }
    case 7:
      s.header["__metadata__"]["mom.extra"] = "1";
      what = "add metadata mom.extra";
      break;
    case 8: {  // two tensors' offsets swapped (their data exchanged), when they have the same size
      const std::string u = tensors[pick(tensors.size())];
      std::swap(s.header[t]["data_offsets"], s.header[u]["data_offsets"]);
      std::swap(s.header[t]["shape"], s.header[u]["shape"]);
      what = "swap data of " + t + " and " + u;
      break;
    }
    case 9: {
      auto entry = s.header[t];
      s.header.erase(t);
      s.header[t + "x"] = entry;
      what = "rename " + t;
      break;
    }
    case 10: {  // ignorable: another layout of the same JSON (indentation, key order)
      nlohmann::ordered_json reordered = nlohmann::ordered_json::object();
      for (auto it = s.header.rbegin(); it != s.header.rend(); ++it) reordered[it.key()] = it.value();
      out = join(reordered.dump(pick(3)), s.data, pick(2));
      return "reformat the header JSON";
    }
    default: {  // ignorable: the checksums removed (a file as another tool or an older mom writes it)
      for (const auto& k : keys)
        if (is_checksum_key(k)) s.header["__metadata__"].erase(k);
      out = join(s.header.dump(), s.data);
      return "strip the checksums";
    }
  }
  out = join(s.header.dump(), s.data);
  return what;
}

// The change is one the format ignores: same data block, same header up to JSON layout and checksum keys.
bool ignorable(const std::string& original, const std::string& mutant) {
  try {
    nlohmann::json headers[2];
    std::string data[2];
    for (int i = 0; i < 2; ++i) {
      const std::string& bytes = i ? mutant : original;
      const std::uint64_t n = header_length(bytes);
      headers[i] = nlohmann::json::parse(bytes.substr(8, n));
      data[i] = bytes.substr(8 + n);
      auto& meta = headers[i]["__metadata__"];
      for (auto it = meta.begin(); it != meta.end();) it = is_checksum_key(it.key()) ? meta.erase(it) : std::next(it);
    }
    return data[0] == data[1] && headers[0] == headers[1];
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

TEST_CASE("mutation test: no corrupted checkpoint loads silently", "[checkpoint][integrity][mutation]") {
  Saved saved;
  REQUIRE(load_and_compare(saved, saved.dir / "run").identical);
  const std::string files[2] = {read_bytes(saved.model_file()), read_bytes(saved.opt_file())};
  const std::filesystem::path paths[2] = {saved.model_file(), saved.opt_file()};
  std::mt19937_64 g(20240611);
  const int mutants = 400;
  int refused = 0, identical = 0, silent = 0;
  std::map<std::string, int> first_words;  // what refused them, by the message's start
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < mutants; ++i) {
    const int f = i % 2;
    std::string mutant, what;
    do what = mutate(files[f], g, mutant);
    while (mutant == files[f]);
    write_bytes(paths[f], mutant);
    INFO("mutant " << i << " of " << paths[f].filename().string() << ": " << what);
    try {
      const Loaded r = load_and_compare(saved, saved.dir / "run");
      CHECK(r.identical);
      const bool ok = ignorable(files[f], mutant);
      CHECK(ok);
      (r.identical && ok ? identical : silent) += 1;
    } catch (const Error& e) {
      ++refused;
      const std::string msg = e.what();
      ++first_words[msg.find("checksum") != std::string::npos ? "checksum"
                    : msg.find("truncated") != std::string::npos ? "truncated"
                                                                  : "structure/metadata"];
    } catch (const std::exception& e) {
      FAIL("refused with something other than a mom::Error: " << e.what());
    }
    write_bytes(paths[f], files[f]);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("mutation test: %d mutants, %d refused (checksum %d, truncated %d, structure/metadata %d), %d loaded "
              "identically (ignorable changes), %d silent; %.2f s\n",
              mutants, refused, first_words["checksum"], first_words["truncated"], first_words["structure/metadata"],
              identical, silent, secs);
  CHECK(silent == 0);
  CHECK(refused + identical == mutants);
  CHECK(refused >= mutants * 3 / 4);
  CHECK(identical > 0);  // the ignorable kinds did occur and did load
  CHECK(secs < 120);  // a few seconds in a release build; generous for sanitizer builds
}

TEST_CASE("checkpoint cross-checks: ids, steps, architecture, optimizer shapes, strict integers",
          "[checkpoint][integrity][bad-input]") {
  Saved saved;
  const auto run = saved.dir / "run";
  const std::string model = read_bytes(saved.model_file()), opt = read_bytes(saved.opt_file());
  auto refused = [&](const std::string& message) {
    CHECK_THROWS_WITH(load_and_compare(saved, run), Catch::Contains(message));
    write_bytes(saved.model_file(), model);
    write_bytes(saved.opt_file(), opt);
  };
  const std::string P = std::to_string(Tiny::params);
  SECTION("the steps of the two files differ") {
    resign(saved.model_file(), [](auto& meta, auto&) { meta["mom.step"] = "8"; });
    refused("model.safetensors is at step 8 but optimizer.safetensors at step 7");
  }
  SECTION("mom.step is not a whole number") {
    for (const char* bad : {"3.5", "3abc", " 7", "+7", "", "-1", "99999999999999999999", "0x7"}) {
      INFO(bad);
      resign(saved.opt_file(), [&](auto& meta, auto&) { meta["mom.step"] = bad; });
      refused("optimizer.safetensors': metadata mom.step '" + std::string(bad) + "' is not a whole number >= 0");
    }
  }
  SECTION("a missing checkpoint id names the file and the key") {
    resign(saved.opt_file(), [](auto& meta, auto&) { meta.erase("mom.checkpoint_id"); });
    refused("optimizer.safetensors' lacks metadata 'mom.checkpoint_id'");
    resign(saved.model_file(), [](auto& meta, auto&) { meta.erase("mom.checkpoint_id"); });
    refused("model.safetensors' lacks metadata 'mom.checkpoint_id'");
    resign(saved.opt_file(), [](auto& meta, auto&) { meta.erase("mom.step"); });
    refused("optimizer.safetensors' lacks metadata 'mom.step'");
  }
  SECTION("a model file other than the one the optimizer file was saved with (same id and step)") {
    resign(saved.model_file(), [](auto& meta, auto& t) {
      meta["mom.arch"] = "another";
      t.values["wte"].second[0] += 1.f;
    });
    refused("model.safetensors is not the file optimizer.safetensors was saved with (its header checksum xxh64:");
  }
  SECTION("the optimizer file of another architecture") {
    resign(saved.opt_file(), [](auto& meta, auto&) { meta["mom.describe"] = "LM<other>"; });
    refused("optimizer.safetensors is of another architecture ('LM<other>')");
  }
  SECTION("adam.m reshaped, or with another element count") {
    resign(saved.opt_file(), [&](auto&, Tensors& t) { t.values["adam.m"].first = {Tiny::params / 2, 2}; });
    refused("tensor 'adam.m' has shape [" + std::to_string(Tiny::params / 2) + ", 2], expected [" + P + "]");
    resign(saved.opt_file(), [&](auto&, Tensors& t) {
      t.values["adam.v"].first = {Tiny::params - 1};
      t.values["adam.v"].second.pop_back();
    });
    refused("tensor 'adam.v' has shape [" + std::to_string(Tiny::params - 1) + "], expected [" + P + "]");
    resign(saved.opt_file(), [&](auto&, Tensors& t) {
      t.names.push_back("adam.w");
      t.values["adam.w"] = {{1}, {0.f}};
    });
    refused("optimizer.safetensors holds 3 tensors, expected adam.m and adam.v");
  }
  SECTION("adam.m as [2^62 + params/4, 4] (the element count wraps to params) in a file without checksums") {
    static_assert(Tiny::params % 4 == 0);
    Split s = split(without_checksums(opt));
    s.header["adam.m"]["shape"] = {(std::uint64_t(1) << 62) + std::uint64_t(Tiny::params / 4), 4};
    write_bytes(saved.opt_file(), join(s.header.dump(), s.data));
    refused("tensor 'adam.m' has a negative dimension or a size that overflows");
  }
  SECTION("a sampler state that is not one") {
    resign(saved.opt_file(), [](auto& meta, auto&) { meta["mom.sampler_state"] = "1 2 3"; });
    refused("mom.sampler_state: RNG state is malformed");
  }
  SECTION("non-finite parameters and moments, negative second moments") {
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    resign(saved.model_file(), [&](auto&, Tensors& t) { t.values["wte"].second[5] = nan; });
    refused("': tensor 'wte' holds NaN/Inf at element 5");
    resign(saved.model_file(), [&](auto&, Tensors& t) { t.values["h.1.attn.w_qkv"].second[3] = -inf; });
    refused("': tensor 'h.1.attn.w_qkv' holds NaN/Inf at element 3");
    resign(saved.opt_file(), [&](auto&, Tensors& t) { t.values["adam.m"].second[8192 + 4] = inf; });
    refused("tensor 'adam.m' holds NaN/Inf at element 8196 (parameter 'wpe' element 4)");
    resign(saved.opt_file(), [&](auto&, Tensors& t) { t.values["adam.v"].second[10] = -1e-3f; });
    refused("tensor 'adam.v' holds a negative value at element 10");
  }
  SECTION("a flipped data bit names the file and the tensor") {
    const safetensors::File file(saved.model_file());  // named: t points into it
    const auto* t = file.find("h.0.attn.w_qkv");
    REQUIRE(t != nullptr);
    std::string bad = model;
    bad[8 + header_length(model) + t->begin + 17] ^= 4;
    write_bytes(saved.model_file(), bad);
    refused("checkpoint file '" + saved.model_file().string() +
            "': tensor 'h.0.attn.w_qkv' fails its checksum (the file is corrupted)");
  }
  SECTION("files without checksums (another tool's, or an older mom's) still load, bit for bit") {
    write_bytes(saved.model_file(), without_checksums(model));
    write_bytes(saved.opt_file(), without_checksums(opt));
    CHECK_FALSE(safetensors::File(saved.model_file()).checksummed());
    CHECK(load_and_compare(saved, run).identical);
  }
  CHECK(load_and_compare(saved, run).identical);  // every section restored the files
}

TEST_CASE("a save refuses non-finite values and leaves the previous checkpoint", "[checkpoint][integrity][bad-input]") {
  Saved saved;
  const auto run = saved.dir / "run";
  const std::string latest = read_bytes(run / "latest"), model = read_bytes(saved.model_file());
  auto folders = [&] {
    int n = 0;
    for (const auto& e : std::filesystem::directory_iterator(run)) n += e.is_directory();
    return n;
  };
  const TrainState next{8, saved.state.sampler_state};
  std::vector<float> m = saved.m, v = saved.v;
  m[100] = std::numeric_limits<float>::quiet_NaN();
  CHECK_THROWS_WITH(Ckpt::save(run, saved.model, m, v, next),
                    Catch::Contains("not saving step 8") && Catch::Contains("previous checkpoint stays") &&
                        Catch::Contains("tensor 'adam.m' holds NaN/Inf at element 100 (parameter 'wte' element 100)"));
  saved.model.params()[256 * 32 + 3] = std::numeric_limits<float>::infinity();  // wpe[3]
  CHECK_THROWS_WITH(Ckpt::save(run, saved.model, saved.m, saved.v, next),
                    Catch::Contains("tensor 'wpe' holds NaN/Inf at element 3 (inf)"));
  CHECK(read_bytes(run / "latest") == latest);
  CHECK(read_bytes(saved.model_file()) == model);
  CHECK(folders() == 1);
}

TEST_CASE("the tokenizer a model file names is cross-checked against its data record and the model",
          "[checkpoint][integrity][bad-input]") {
  const std::string where = "checkpoint 'c'";
  const auto rec = [](const char* tok, int vocab) {
    return nlohmann::json{{"train", {{"checksum", "xxh64:0000000000000001"}, {"tokens", 10}, {"vocab", vocab},
                                     {"tokenizer", tok}}},
                          {"val", nullptr}}
        .dump();
  };
  using Meta = std::map<std::string, std::string>;
  CHECK(checkpoint_tokenizer(Meta{{"mom.tokenizer", "byte"}, {"mom.data", rec("byte", 256)}}, 256, where) == "byte");
  CHECK(checkpoint_tokenizer(Meta{}, 256, where) == "byte");  // older files: no record, byte
  CHECK(checkpoint_tokenizer(Meta{{"mom.tokenizer", "byte"}}, 50257, where) == "byte");  // a byte run of a gpt2 model
  // mom.tokenizer changed to gpt2 on a byte-trained model: the record disagrees, and gpt2 does not fit the model.
  CHECK_THROWS_WITH(checkpoint_tokenizer(Meta{{"mom.tokenizer", "gpt2"}, {"mom.data", rec("byte", 256)}}, 256, where),
                    Catch::Contains("metadata mom.tokenizer is 'gpt2' but the data it trained on was tokenized by 'byte'"));
  CHECK_THROWS_WITH(checkpoint_tokenizer(Meta{{"mom.tokenizer", "gpt2"}}, 256, where),
                    Catch::Contains("metadata mom.tokenizer 'gpt2' has 50257 tokens, more than the model's vocabulary of 256"));
  CHECK_THROWS_WITH(checkpoint_tokenizer(Meta{{"mom.tokenizer", "byte"}, {"mom.data", rec("byte", 300)}}, 512, where),
                    Catch::Contains("has a vocabulary of 300, not the byte tokenizer's 256"));
  CHECK_THROWS_WITH(checkpoint_tokenizer(Meta{{"mom.data", "{\"train\": 3}"}}, 256, where),
                    Catch::Contains("mom.data is malformed (no valid \"train\" record)"));
  CHECK_THROWS_WITH(checkpoint_tokenizer(Meta{{"mom.data", "[[[["}}, 256, where), Catch::Contains("mom.data is malformed"));
}

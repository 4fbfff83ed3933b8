// safetensors writer/reader: format bytes, round trip, refusal of corrupted / truncated files, the checksums
// (XXH64 against the reference vectors, verification, files without them), temporary-file clean-up.
#include <catch2/catch.hpp>

#include <mom/train/safetensors.hpp>

#include "helpers.hpp"

#include <sys/wait.h>

#include <fstream>

using namespace mom;
using namespace mom::train;
using mom_test::read_bytes;
using mom_test::write_bytes;
using mom_test::dead_pid;

namespace {
// A file with a hand-written header and `data_bytes` zero bytes of data.
void write_raw(const std::filesystem::path& p, const std::string& header, std::size_t data_bytes) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xFF);
  out += header;
  out += std::string(data_bytes, '\0');
  write_bytes(p, out);
}
}  // namespace

TEST_CASE("safetensors round trip and exact layout", "[safetensors]") {
  mom_test::TempDir dir("st");
  std::vector<float> a = {1.f, 2.f, 3.f, 4.f, 5.f, 6.f};
  std::vector<double> b = {0.5, -0.25};
  safetensors::Writer w;
  w.add<float>("a", a, {2, 3});
  w.add<double>("b", b, {2});
  w.metadata("note", "hi \"there\"");
  w.write(dir / "x.safetensors");
  const std::string raw = read_bytes(dir / "x.safetensors");
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= std::uint64_t(static_cast<unsigned char>(raw[static_cast<std::size_t>(i)])) << (8 * i);
  CHECK(n % 8 == 0);
  CHECK(raw.size() == 8 + n + 6 * 4 + 2 * 8);
  auto header = nlohmann::json::parse(raw.substr(8, n));
  CHECK(header["a"]["dtype"] == "F32");
  CHECK(header["a"]["shape"] == nlohmann::json::array({2, 3}));
  CHECK(header["a"]["data_offsets"] == nlohmann::json::array({0, 24}));
  CHECK(header["b"]["data_offsets"] == nlohmann::json::array({24, 40}));
  CHECK(header["__metadata__"]["note"] == "hi \"there\"");
  safetensors::File f(dir / "x.safetensors");
  CHECK(f.tensors().size() == 2);
  CHECK(f.meta("note") == "hi \"there\"");
  std::vector<float> a2(6);
  f.read<float>("a", a2);
  CHECK(a2 == a);
  std::vector<double> b2(2);
  f.read<double>("b", b2);
  CHECK(b2 == b);
  std::vector<float> wrong(2);
  CHECK_THROWS_WITH(f.read<float>("b", wrong), Catch::Contains("is F64, expected F32"));
  CHECK_THROWS_WITH(f.read<float>("zzz", wrong), Catch::Contains("has no tensor 'zzz'"));
  CHECK_THROWS_WITH(w.add<float>("a", a, {6}), Catch::Contains("duplicate tensor name"));
  CHECK_THROWS_WITH(w.add<float>("c", a, {5}), Catch::Contains("shape product 5"));
}

TEST_CASE("safetensors refuses corrupted and truncated files", "[safetensors][bad-input]") {
  mom_test::TempDir dir("stbad");
  const auto p = dir / "f.safetensors";
  write_bytes(p, "abc");
  CHECK_THROWS_WITH(safetensors::File(p), Catch::Contains("is truncated") && Catch::Contains("8-byte header"));
  write_raw(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 8);
  CHECK_NOTHROW(safetensors::File(p));
  write_raw(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]", 8);
  CHECK_THROWS_WITH(safetensors::File(p), Catch::Contains("header is not valid JSON"));
  write_raw(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 4);
  CHECK_THROWS_WITH(safetensors::File(p), Catch::Contains("is truncated: tensors need 8 data bytes"));
  write_raw(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [0, 8]}}", 8);
  CHECK_THROWS_WITH(safetensors::File(p), Catch::Contains("do not match its shape and dtype"));
  write_raw(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 16]}}", 16);
  CHECK_THROWS_WITH(safetensors::File(p), Catch::Contains("tile the data"));
  write_raw(p, "{\"a\": {\"dtype\": \"Q4\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 8);
  CHECK_THROWS_WITH(safetensors::File(p), Catch::Contains("unknown dtype 'Q4'"));
  write_raw(p, "{\"a\": {\"shape\": [2], \"data_offsets\": [0, 8]}}", 8);
  CHECK_THROWS_WITH(safetensors::File(p), Catch::Contains("entry 'a' is malformed"));
  write_raw(p, "[1, 2]", 0);
  CHECK_THROWS_WITH(safetensors::File(p), Catch::Contains("not a JSON object"));
  // Header length beyond the end of the file.
  std::string big(8, '\0');
  big[0] = '\x10';
  big[1] = '\x27';
  write_bytes(p, big + "{}");
  CHECK_THROWS_WITH(safetensors::File(p), Catch::Contains("is truncated: header of 10000 bytes"));
  CHECK_THROWS_WITH(safetensors::File(dir / "missing.safetensors"), Catch::Contains("does not exist"));
}

TEST_CASE("atomic write leaves the old file on failure", "[safetensors][atomic]") {
  mom_test::TempDir dir("atomic");
  const auto p = dir / "keep.txt";
  write_file_atomically(p, std::string("good"));
  CHECK(read_bytes(p) == "good");
  CHECK_THROWS_WITH(write_file_atomically(p, [](const auto& sink) {
                      sink("partial", 7);
                      throw Error("simulated failure mid-write");
                    }),
                    Catch::Contains("simulated failure"));
  CHECK(read_bytes(p) == "good");
  // No temporary file is left behind.
  int files = 0;
  for (auto& e : std::filesystem::directory_iterator(dir.path)) (void)e, ++files;
  CHECK(files == 1);
  CHECK_THROWS_WITH(write_file_atomically(dir / "no/such/dir/x", std::string("y")), Catch::Contains("cannot write"));
}

TEST_CASE("XXH64 matches the reference vectors", "[safetensors][checksum]") {
  using checksum::xxh64;
  CHECK(xxh64("") == 0xef46db3751d8e999ULL);
  CHECK(xxh64("a") == 0xd24ec4f1a98c6e5bULL);
  CHECK(xxh64("abc") == 0x44bc2cf5ad770999ULL);
  CHECK(xxh64("1234") == 0xd8316e61d84f6ba4ULL);
  CHECK(xxh64("12345678") == 0xd2d02f08cf7cfd4aULL);
  CHECK(xxh64("123456789012345") == 0xc377d78ade001a3cULL);
  CHECK(xxh64("1234567890123456") == 0xb61c33dc6c59f270ULL);
  CHECK(xxh64("1234567890123456789012345678901") == 0x8f367cb873a5376eULL);
  CHECK(xxh64("12345678901234567890123456789012") == 0x40fd1aa52d98274cULL);
  CHECK(xxh64("The quick brown fox jumps over the lazy dog") == 0x0b242d361fda71bcULL);
  CHECK(xxh64("Nobody inspects the spammish repetition") == 0xfbcea83c8a378bf1ULL);
  CHECK(checksum::xxh64("abc", 3, 5381) == 0x19d1c1b5c673451fULL);
  CHECK(checksum::format(0x0b242d361fda71bcULL) == "xxh64:0b242d361fda71bc");
  CHECK(checksum::parse("xxh64:0b242d361fda71bc") == 0x0b242d361fda71bcULL);
  for (const char* bad : {"xxh64:0B242D361FDA71BC", "xxh64:0b242d361fda71b", "xxh64:0b242d361fda71bc0",
                          "crc32:0b242d361fda71bc", "", "xxh64: b242d361fda71bc"})
    CHECK_FALSE(checksum::parse(bad).has_value());
}

TEST_CASE("safetensors checksums: written, verified, named on failure, files without them load",
          "[safetensors][checksum][bad-input]") {
  mom_test::TempDir dir("stsum");
  const auto p = dir / "x.safetensors";
  std::vector<float> a(64), b(16);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = float(i) * 0.5f;
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = -float(i);
  safetensors::Writer w;
  w.add<float>("layer.a", a, {8, 8});
  w.add<float>("layer.b", b, {16});
  w.metadata("mom.step", "7");
  CHECK_THROWS_WITH(w.metadata("mom.checksum.layer.a", "x"), Catch::Contains("reserved"));
  CHECK_THROWS_WITH(w.metadata("mom.header_checksum", "x"), Catch::Contains("reserved"));
  w.write(p);
  const std::string good = read_bytes(p);
  {
    safetensors::File f(p);
    CHECK(f.checksummed());
    CHECK(f.meta("mom.checksum.layer.a") ==
          checksum::format(checksum::xxh64(a.data(), a.size() * sizeof(float))));  // the plain XXH64 of the bytes
    CHECK(f.meta("mom.header_checksum").rfind("xxh64:", 0) == 0);
  }
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= std::uint64_t(static_cast<unsigned char>(good[std::size_t(i)])) << (8 * i);
  const std::size_t data_at = 8 + n;
  // A flipped bit in a tensor's data: the error names the file and the tensor.
  std::string bad = good;
  bad[data_at + 64 * 4 + 5] ^= 0x10;
  write_bytes(p, bad);
  CHECK_THROWS_WITH(safetensors::File(p), Catch::Contains("checkpoint file '" + p.string() + "': tensor 'layer.b' fails its checksum (the file is corrupted)"));
  // A metadata value changed (same length, so the layout stays valid): the header checksum.
  bad = good;
  const auto at = bad.find("\"mom.step\":\"7\"");
  REQUIRE(at != std::string::npos);
  bad[at + 12] = '8';
  write_bytes(p, bad);
  CHECK_THROWS_WITH(safetensors::File(p), Catch::Contains("its header") && Catch::Contains("fails its checksum"));
  // Checksums removed from the header: a file without any loads (another tool's), one with some does not.
  auto strip = [&](auto&& keep) {
    auto header = nlohmann::ordered_json::parse(good.substr(8, n));
    auto& meta = header["__metadata__"];
    for (auto it = meta.begin(); it != meta.end();)
      it = keep(it.key()) ? std::next(it) : meta.erase(it);
    std::string json = header.dump();
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[std::size_t(i)] = static_cast<char>((json.size() >> (8 * i)) & 0xFF);
    write_bytes(p, out + json + good.substr(data_at));
  };
  strip([](const std::string& k) { return k.rfind("mom.checksum.", 0) != 0 && k != "mom.header_checksum"; });
  {
    safetensors::File f(p);
    CHECK_FALSE(f.checksummed());
    std::vector<float> back(16);
    f.read<float>("layer.b", back);
    CHECK(back == b);
  }
  strip([](const std::string& k) { return k != "mom.header_checksum"; });
  CHECK_THROWS_WITH(safetensors::File(p), Catch::Contains("has tensor checksums but no mom.header_checksum"));
  strip([](const std::string& k) { return k != "mom.checksum.layer.a"; });
  CHECK_THROWS_WITH(safetensors::File(p), Catch::Contains("fails its checksum"));
}

TEST_CASE("safetensors: strict integer types, sizes that overflow are refused", "[safetensors][bad-input]") {
  mom_test::TempDir dir("ststrict");
  const auto p = dir / "f.safetensors";
  auto entry = [](const std::string& shape, const std::string& offsets, const std::string& dtype = "\"F32\"") {
    return "{\"a\": {\"dtype\": " + dtype + ", \"shape\": " + shape + ", \"data_offsets\": " + offsets + "}}";
  };
  write_raw(p, entry("[2]", "[0, 8]"), 8);
  CHECK_NOTHROW(safetensors::File(p));
  for (const char* shape : {"[2.0]", "[\"2\"]", "[-2]", "[1e0, 2]", "2", "[9223372036854775808]"}) {
    INFO(shape);
    write_raw(p, entry(shape, "[0, 8]"), 8);
    CHECK_THROWS_WITH(safetensors::File(p), Catch::Contains("entry 'a' is malformed"));
  }
  for (const char* offsets : {"[0.0, 8]", "[0, 8, 9]", "[-8, 0]", "[0]", "{\"0\": 8}"}) {
    INFO(offsets);
    write_raw(p, entry("[2]", offsets), 8);
    CHECK_THROWS_WITH(safetensors::File(p), Catch::Contains("entry 'a' is malformed"));
  }
  write_raw(p, entry("[2]", "[0, 8]", "7"), 8);
  CHECK_THROWS_WITH(safetensors::File(p), Catch::Contains("dtype is not a string"));
  write_raw(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8], \"extra\": 1}}", 8);
  CHECK_THROWS_WITH(safetensors::File(p), Catch::Contains("exactly dtype, shape and data_offsets"));
  // (2^62 + 2) x 4 F32 elements: the element count wraps int64 to 8 and the byte count to 32 = the data. Refused.
  write_raw(p, entry("[4611686018427387906, 4]", "[0, 32]"), 32);
  CHECK_THROWS_WITH(safetensors::File(p), Catch::Contains("a size that overflows"));
  write_raw(p, entry("[4611686018427387904, 4611686018427387904, 0]", "[0, 0]"), 0);
  CHECK_THROWS_WITH(safetensors::File(p), Catch::Contains("a size that overflows"));
  safetensors::TensorInfo t;
  t.shape = {std::int64_t(1) << 62, 4};
  CHECK_THROWS_WITH(t.elements(), Catch::Contains("overflowing size"));
  std::vector<float> x(8);
  safetensors::Writer w;
  CHECK_THROWS_WITH(w.add<float>("x", x, {std::int64_t(1) << 62, 4}), Catch::Contains("overflowing shape"));
}

TEST_CASE("stale temporary files of killed writers are removed, live ones kept", "[safetensors][atomic][cleanup]") {
  CHECK(temp_file_pid(".model.safetensors.tmp.123") == 123);
  CHECK(temp_file_pid(".mom_write_test.77") == 77);
  for (const char* other : {"model.safetensors", ".tmp.12", ".x.tmp.", ".x.tmp.12a", ".x.tmp.012", "x.tmp.12",
                            ".x.tmp.1234567890", ".mom_write_test."})
    CHECK_FALSE(temp_file_pid(other).has_value());
  mom_test::TempDir dir("stale");
  const pid_t dead = dead_pid();
  REQUIRE_FALSE(process_alive(dead));
  const std::string d = std::to_string(dead), me = std::to_string(::getpid()), parent = std::to_string(::getppid());
  const std::vector<std::string> stale = {".latest.tmp." + d, ".mom_write_test." + d, ".model.safetensors.tmp." + d};
  const std::vector<std::string> kept = {".latest.tmp." + me, ".metrics.jsonl.tmp." + parent, "notes.tmp." + d,
                                         ".notes.tmp.x" + d, "latest"};
  for (const auto& name : stale) write_bytes(dir / name, "x");
  for (const auto& name : kept) write_bytes(dir / name, "x");
  std::filesystem::create_directories(dir / (".dir.tmp." + d));  // not a regular file: left alone
  ensure_writable_dir(dir.path);
  for (const auto& name : stale) CHECK_FALSE(std::filesystem::exists(dir / name));
  for (const auto& name : kept) CHECK(std::filesystem::exists(dir / name));
  CHECK(std::filesystem::exists(dir / (".dir.tmp." + d)));
  CHECK(remove_stale_temp_files(dir.path) == 0);
  CHECK(remove_stale_temp_files(dir / "missing") == 0);
}

// safetensors writer/reader: format bytes, round trip, and refusal of corrupted / truncated files.
#include <catch2/catch.hpp>

#include <mom/train/safetensors.hpp>

#include "helpers.hpp"

#include <fstream>

using namespace mom;
using namespace mom::train;

namespace {
std::string read_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void write_bytes(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary) << bytes;
}
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

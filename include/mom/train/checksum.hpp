// Checksums of checkpoint files: XXH64 (the xxHash 64-bit hash, seed 0; https://github.com/Cyan4973/xxHash,
// doc/xxhash_spec.md), written as "xxh64:<16 lowercase hex digits>" so any xxHash implementation (Python's
// `xxhash.xxh64(data).hexdigest()`, the `xxh64sum` tool) checks it. XXH64 reads 32 bytes per round in four
// independent lanes: ~10 GB/s on one core, so hashing a checkpoint costs far less than writing it.
//
// It detects corruption (bit rot, truncation, a torn or mixed-up file); it is not a cryptographic hash and
// does not protect against deliberate tampering.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace mom::train::checksum {

namespace detail {
inline constexpr std::uint64_t p1 = 0x9E3779B185EBCA87ULL, p2 = 0xC2B2AE3D27D4EB4FULL, p3 = 0x165667B19E3779F9ULL,
                               p4 = 0x85EBCA77C2B2AE63ULL, p5 = 0x27D4EB2F165667C5ULL;
inline std::uint64_t read64(const unsigned char* p) {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap64(v);
  return v;
}
inline std::uint32_t read32(const unsigned char* p) {
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap32(v);
  return v;
}
inline std::uint64_t round(std::uint64_t acc, std::uint64_t input) {
  acc += input * p2;
  acc = std::rotl(acc, 31);
  return acc * p1;
}
inline std::uint64_t merge(std::uint64_t acc, std::uint64_t lane) {
  acc ^= round(0, lane);
  return acc * p1 + p4;
}
}  // namespace detail

// XXH64 of `n` bytes at `data` with seed `seed` (the reference algorithm, byte for byte).
inline std::uint64_t xxh64(const void* data, std::size_t n, std::uint64_t seed = 0) {
  using namespace detail;
  const auto* p = static_cast<const unsigned char*>(data);
  const unsigned char* const end = p + n;
  std::uint64_t h;
  if (n >= 32) {
    std::uint64_t v1 = seed + p1 + p2, v2 = seed + p2, v3 = seed, v4 = seed - p1;
    const unsigned char* const limit = end - 32;
    do {
      v1 = round(v1, read64(p));
      v2 = round(v2, read64(p + 8));
      v3 = round(v3, read64(p + 16));
      v4 = round(v4, read64(p + 24));
      p += 32;
    } while (p <= limit);
    h = std::rotl(v1, 1) + std::rotl(v2, 7) + std::rotl(v3, 12) + std::rotl(v4, 18);
    h = merge(h, v1);
    h = merge(h, v2);
    h = merge(h, v3);
    h = merge(h, v4);
  } else {
    h = seed + p5;
  }
  h += static_cast<std::uint64_t>(n);
  for (; p + 8 <= end; p += 8) h = std::rotl(h ^ round(0, read64(p)), 27) * p1 + p4;
  if (p + 4 <= end) {
    h = std::rotl(h ^ (static_cast<std::uint64_t>(read32(p)) * p1), 23) * p2 + p3;
    p += 4;
  }
  for (; p < end; ++p) h = std::rotl(h ^ (*p * p5), 11) * p1;
  h ^= h >> 33;
  h *= p2;
  h ^= h >> 29;
  h *= p3;
  h ^= h >> 32;
  return h;
}
inline std::uint64_t xxh64(std::span<const std::byte> bytes) { return xxh64(bytes.data(), bytes.size()); }
inline std::uint64_t xxh64(std::string_view text) { return xxh64(text.data(), text.size()); }

// "xxh64:<16 lowercase hex digits>", the form stored in safetensors metadata.
inline std::string format(std::uint64_t h) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s = "xxh64:0000000000000000";
  for (int i = 0; i < 16; ++i) s[6 + i] = digits[(h >> (60 - 4 * i)) & 0xF];
  return s;
}

// The hash a "xxh64:<16 lowercase hex digits>" string holds; nullopt for anything else (another algorithm,
// upper-case or missing digits, trailing characters).
inline std::optional<std::uint64_t> parse(std::string_view s) {
  if (s.size() != 22 || s.substr(0, 6) != "xxh64:") return std::nullopt;
  std::uint64_t h = 0;
  for (char c : s.substr(6)) {
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else return std::nullopt;
    h = (h << 4) | static_cast<std::uint64_t>(d);
  }
  return h;
}

}  // namespace mom::train::checksum

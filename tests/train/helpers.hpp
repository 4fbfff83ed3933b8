// Shared helpers of the train tests: repo root, the KJV corpus, scratch folders.
#pragma once
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>

namespace mom_test {

inline std::filesystem::path source_dir() {
  const char* env = std::getenv("MOM_SOURCE_DIR");
  return env && *env ? std::filesystem::path(env) : std::filesystem::path(__FILE__).parent_path().parent_path().parent_path();
}

// The whole King James Bible as printed by Debian's bible-kjv (`bible Gen1:1-Rev22:21`), cached once per
// process; empty when the `bible` program is not installed.
inline const std::string& kjv_text() {
  static const std::string text = [] {
    std::string out;
    if (std::system("command -v bible >/dev/null 2>&1") != 0) return out;
    FILE* p = popen("bible Gen1:1-Rev22:21 2>/dev/null", "r");
    if (!p) return out;
    char buf[1 << 16];
    std::size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    pclose(p);
    return out;
  }();
  return text;
}

// A whole file as bytes, and bytes as a whole file (replacing it).
inline std::string read_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
inline void write_bytes(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
}

// The pid of a process that has exited (a child, reaped): a writer that was killed.
inline pid_t dead_pid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return pid;
}

// A fresh empty folder under the system temp dir, removed by the destructor.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& tag) {
    std::random_device rd;
    path = std::filesystem::temp_directory_path() / ("mom_test_" + tag + "_" + std::to_string(rd()));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::filesystem::path operator/(const std::string& name) const { return path / name; }
};

}  // namespace mom_test

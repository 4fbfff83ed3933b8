// Shared by the libFuzzer harnesses (tests/fuzz/README.md): the readers under test take a path, so each
// input is written to an in-memory file (memfd_create) and read back through /proc/self/fd/<fd>.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace mom_fuzz {

// One memfd per process, rewritten for every input: no file-system traffic, nothing left behind.
class MemFile {
 public:
  MemFile() {
    fd_ = ::memfd_create("mom-fuzz", MFD_CLOEXEC);
    if (fd_ < 0) {
      std::perror("memfd_create");
      std::abort();
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  // Replaces the file's contents with data[0, size).
  const std::string& write(const std::uint8_t* data, std::size_t size) {
    if (::ftruncate(fd_, 0) != 0 || ::lseek(fd_, 0, SEEK_SET) != 0) fail("ftruncate");
    std::size_t done = 0;
    while (done < size) {
      const ssize_t w = ::write(fd_, data + done, size - done);
      if (w <= 0) fail("write");
      done += static_cast<std::size_t>(w);
    }
    return path_;
  }

 private:
  [[noreturn]] static void fail(const char* what) {
    std::perror(what);
    std::abort();
  }
  int fd_ = -1;
  std::string path_;
};

// MOM_FUZZ_KNOWN=<name>[,<name>...] lets a long local run explore past findings that are reported but not
// fixed yet (each harness names its own; tests/fuzz/README.md lists them). CI never sets it, so a finding
// fails CI until it is fixed.
inline bool known(const char* name) {
  const char* env = std::getenv("MOM_FUZZ_KNOWN");
  if (!env) return false;
  const std::string list = std::string(",") + env + ",";
  return list.find(std::string(",") + name + ",") != std::string::npos;
}

// A property of the reader does not hold: report it as a crash with a message libFuzzer shows.
#define MOM_FUZZ_ASSERT(cond, ...)                                       \
  do {                                                                   \
    if (!(cond)) {                                                       \
      std::fprintf(stderr, "property violated: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
      std::fprintf(stderr, __VA_ARGS__);                                 \
      std::fprintf(stderr, "\n");                                        \
      std::abort();                                                      \
    }                                                                    \
  } while (0)

}  // namespace mom_fuzz

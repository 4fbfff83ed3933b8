// Files for training: read-only memory maps and atomic writes (POSIX).
//
// An atomic write goes to a temporary file next to the target, is flushed and fsync'ed, then renamed over the
// target, and the folder is fsync'ed: a reader sees the old file or the new one, never a mix, and a failure at
// any point leaves the old file untouched.
//
// Temporary names: ".<target name>.tmp.<pid>" (write_file_atomically) and ".mom_write_test.<pid>"
// (ensure_writable_dir). A process killed mid-write (kill -9, power loss) leaves one behind; the next
// ensure_writable_dir of that folder removes those whose process is gone (remove_stale_temp_files). One of
// this very process (a pid reused after a restart, as in a container) is left alone: the next write of the
// same target reuses its name.
#pragma once

#include <mom/core/check.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>

namespace mom::train {

// A whole file mapped read-only. Empty files map to an empty span.
class MappedFile {
 public:
  MappedFile() = default;
  explicit MappedFile(const std::filesystem::path& path) : path_(path) {
    // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever (refused below).
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    MOM_CHECK(fd_ >= 0, "cannot open '", path.string(), "': ", std::strerror(errno));
    struct stat st {};
    if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd_);
      fd_ = -1;
      throw Error("'" + path.string() + "' is not a regular file");
    }
    size_ = static_cast<std::size_t>(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd_, 0);
      if (p == MAP_FAILED) {
        ::close(fd_);
        fd_ = -1;
        throw Error("cannot map '" + path.string() + "': " + std::strerror(errno));
      }
      data_ = static_cast<const std::byte*>(p);
    }
  }
  MappedFile(MappedFile&& o) noexcept
      : path_(std::move(o.path_)), fd_(std::exchange(o.fd_, -1)), data_(std::exchange(o.data_, nullptr)),
        size_(std::exchange(o.size_, 0)) {}
  MappedFile& operator=(MappedFile&& o) noexcept {
    if (this != &o) {
      release();
      path_ = std::move(o.path_);
      fd_ = std::exchange(o.fd_, -1);
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile() { release(); }

  std::span<const std::byte> bytes() const { return {data_, size_}; }
  std::size_t size() const { return size_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  void release() {
    if (data_) ::munmap(const_cast<std::byte*>(data_), size_);
    if (fd_ >= 0) ::close(fd_);
    data_ = nullptr;
    fd_ = -1;
  }
  std::filesystem::path path_;
  int fd_ = -1;
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

// Writes `path` atomically: write(sink) is called with a function appending bytes to the temporary file.
inline void write_file_atomically(const std::filesystem::path& path,
                                  const std::function<void(const std::function<void(const void*, std::size_t)>&)>& write) {
  namespace fs = std::filesystem;
  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  std::string tmp_name = ".";  // built by appending: GCC 12 -Wrestrict misfires on "." + std::string
  tmp_name += path.filename().string();
  tmp_name += ".tmp.";
  tmp_name += std::to_string(::getpid());
  const fs::path tmp = dir / tmp_name;
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  MOM_CHECK(fd >= 0, "cannot write '", path.string(), "': ", std::strerror(errno));
  auto fail = [&](const std::string& what) {
    const int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    throw Error("cannot write '" + path.string() + "': " + what + (err ? std::string(": ") + std::strerror(err) : ""));
  };
  try {
    write([&](const void* data, std::size_t n) {
      const char* p = static_cast<const char*>(data);
      while (n > 0) {
        const ssize_t w = ::write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) throw Error("cannot write '" + path.string() + "': write failed: " + std::strerror(errno));
        p += w;
        n -= static_cast<std::size_t>(w);
      }
    });
  } catch (const Error&) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  errno = 0;
  if (::fsync(fd) != 0) fail("fsync failed");
  if (::close(fd) != 0) {
    ::unlink(tmp.c_str());
    throw Error("cannot write '" + path.string() + "': close failed: " + std::strerror(errno));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw Error("cannot write '" + path.string() + "': rename failed: " + std::strerror(err));
  }
  if (const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    ::fsync(dfd);  // makes the rename itself durable
    ::close(dfd);
  }
}

inline void write_file_atomically(const std::filesystem::path& path, std::span<const std::byte> data) {
  write_file_atomically(path, [&](const auto& sink) { sink(data.data(), data.size()); });
}
inline void write_file_atomically(const std::filesystem::path& path, const std::string& text) {
  write_file_atomically(path, std::as_bytes(std::span(text.data(), text.size())));
}

// The pid in the name of one of the temporary files above; nullopt for any other name.
inline std::optional<pid_t> temp_file_pid(std::string_view name) {
  std::string_view digits;
  if (name.starts_with(".mom_write_test.")) {
    digits = name.substr(16);
  } else {
    const auto at = name.rfind(".tmp.");
    if (name.size() < 2 || name[0] != '.' || at == std::string_view::npos || at < 2) return std::nullopt;
    digits = name.substr(at + 5);
  }
  if (digits.empty() || digits.size() > 9 || digits[0] == '0') return std::nullopt;
  long pid = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    pid = pid * 10 + (c - '0');
  }
  return static_cast<pid_t>(pid);
}

// True when process `pid` exists (EPERM: it exists but belongs to someone else).
inline bool process_alive(pid_t pid) { return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM); }

// Removes the temporary files (names above) directly in `dir` whose process is gone; returns how many. Never
// throws: what cannot be listed or removed stays.
inline int remove_stale_temp_files(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  int removed = 0;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const auto pid = temp_file_pid(it->path().filename().native());
    if (!pid || *pid == ::getpid() || process_alive(*pid)) continue;
    std::error_code rc;
    if (it->is_regular_file(rc) && fs::remove(it->path(), rc)) ++removed;
  }
  return removed;
}

// Creates `dir` (and parents) and checks that a file can be created in it; the message names the problem.
// Removes stale temporary files of killed writers from it (remove_stale_temp_files).
inline void ensure_writable_dir(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(dir, ec)) {
    MOM_CHECK(fs::is_directory(dir, ec), "output path '", dir.string(), "' exists and is not a directory");
  } else {
    fs::create_directories(dir, ec);
    MOM_CHECK(!ec, "cannot create output directory '", dir.string(), "': ", ec.message());
  }
  const fs::path probe = dir / (".mom_write_test." + std::to_string(::getpid()));
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  MOM_CHECK(fd >= 0, "output directory '", dir.string(), "' is not writable: ", std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());
  remove_stale_temp_files(dir);
}

// An exclusive lock on an output folder for as long as the object lives: a second process writing the same
// run (its checkpoints, metrics.jsonl, prepared data) is refused in one line naming the first one's pid. The lock
// is flock(2) on "<dir>/.lock" (released by the kernel when its holder exits, kill -9 included; the file stays,
// holding the pid of its last holder). Within one process the lock is shared: nested holders of the same folder
// (mom-train's preparation, then Trainer::run) count up and down.
class DirLock {
 public:
  DirLock() = default;
  explicit DirLock(const std::filesystem::path& dir) {
    std::error_code ec;
    key_ = std::filesystem::weakly_canonical(dir, ec).string();
    if (ec) key_ = std::filesystem::absolute(dir).lexically_normal().string();
    Held& h = held()[key_];
    if (h.count > 0 && h.pid != ::getpid()) {  // inherited through fork(): the child is another writer
      ::close(h.fd);
      h = Held{};
    }
    if (h.count++ > 0) return;
    h.pid = ::getpid();
    const std::string path = (std::filesystem::path(key_) / ".lock").string();
    h.fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NONBLOCK, 0644);
    if (h.fd < 0) {
      held().erase(key_);
      detail::fail("cannot lock output directory '", dir.string(), "': ", std::strerror(errno));
    }
    if (::flock(h.fd, LOCK_EX | LOCK_NB) != 0) {
      char pid[32] = {};
      const ssize_t n = ::pread(h.fd, pid, sizeof pid - 1, 0);
      ::close(h.fd);
      held().erase(key_);
      const std::string who = n > 0 ? std::string(pid, std::size_t(n)) : std::string("?");
      detail::fail("output directory '", dir.string(), "' is in use by another mom-train process (pid ",
                   who.substr(0, who.find_first_of(" \n")), "); wait for it to end, or choose another --out");
    }
    const std::string me = std::to_string(::getpid()) + "\n";
    if (::ftruncate(h.fd, 0) == 0) (void)::pwrite(h.fd, me.data(), me.size(), 0);
  }
  bool locked() const { return !key_.empty(); }
  DirLock(DirLock&& o) noexcept : key_(std::exchange(o.key_, {})) {}
  DirLock& operator=(DirLock&& o) noexcept {
    std::swap(key_, o.key_);
    return *this;
  }
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;
  ~DirLock() {
    if (key_.empty()) return;
    auto it = held().find(key_);
    if (it == held().end() || --it->second.count > 0) return;
    ::close(it->second.fd);  // releases the flock
    held().erase(it);
  }

 private:
  struct Held {
    int fd = -1;
    int count = 0;
    pid_t pid = 0;  // the process that took it
  };
  static std::map<std::string, Held>& held() {
    static std::map<std::string, Held> h;
    return h;
  }
  std::string key_;
};

// Little-endian encoding of fixed-width integers, independent of the host's byte order.
inline void put_le(std::byte* out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<std::byte>((v >> (8 * i)) & 0xFF);
}
inline std::uint64_t get_le(const std::byte* in, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<std::uint64_t>(std::to_integer<unsigned>(in[i])) << (8 * i);
  return v;
}

}  // namespace mom::train

// Metrics as JSON lines (one object per line, appended and flushed as they happen), and the terminal
// progress display.
//
// Lines written by the Trainer (scripts/plot_runs.py reads them):
//   {"type":"run", "arch":..., "describe":..., "config":{...}, "resumed_from":step}   at every (re)start
//   {"type":"train", "step":s, "loss":l, "lr":..., "grad_norm":..., "tokens":..., "tok_per_s":..., "elapsed_s":...}
//   {"type":"val", "step":s, "loss":l, "ppl":exp(l), "elapsed_s":...}
#pragma once

#include <mom/core/check.hpp>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>

namespace mom::train {

class MetricsLog {
 public:
  MetricsLog() = default;
  explicit MetricsLog(const std::filesystem::path& path) : path_(path) {
    file_ = std::fopen(path.c_str(), "a");
    MOM_CHECK(file_ != nullptr, "cannot open metrics file '", path.string(), "': ", std::strerror(errno));
  }
  MetricsLog(MetricsLog&& o) noexcept : path_(std::move(o.path_)), file_(std::exchange(o.file_, nullptr)) {}
  MetricsLog& operator=(MetricsLog&& o) noexcept {
    std::swap(path_, o.path_);
    std::swap(file_, o.file_);
    return *this;
  }
  ~MetricsLog() {
    if (file_) std::fclose(file_);
  }
  bool enabled() const { return file_ != nullptr; }
  void write(const nlohmann::json& record) {
    if (!file_) return;
    const std::string line = record.dump() + "\n";
    // A failed write (a full disk) ends the run with the cause, instead of dropping or truncating records.
    MOM_CHECK(std::fwrite(line.data(), 1, line.size(), file_) == line.size() && std::fflush(file_) == 0,
              "cannot write metrics file '", path_.string(), "': ", std::strerror(errno));
  }

 private:
  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
};

inline std::string format_duration(double seconds) {
  if (!(seconds >= 0) || seconds > 1e7) return "--:--";
  const long s = static_cast<long>(seconds + 0.5);
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", s / 3600, (s / 60) % 60, s % 60);
  else std::snprintf(buf, sizeof buf, "%ld:%02ld", s / 60, s % 60);
  return buf;
}

// One status line rewritten in place on a terminal ("\r" + clear-line); on a pipe or file, plain lines
// every `plain_every` updates, so logs stay readable.
class Progress {
 public:
  explicit Progress(std::FILE* out = stdout, long plain_every = 10)
      : out_(out), tty_(out && ::isatty(::fileno(out))), plain_every_(plain_every > 0 ? plain_every : 1) {}
  void set_enabled(bool on) { enabled_ = on; }
  bool tty() const { return tty_; }

  // A status update; `force` prints it even between plain-mode intervals.
  void status(long step, const std::string& line, bool force = false) {
    if (!enabled_ || !out_) return;
    if (tty_) {
      std::fprintf(out_, "\r\033[K%s", line.c_str());
      pending_ = true;
    } else if (force || step % plain_every_ == 0) {
      std::fprintf(out_, "%s\n", line.c_str());
    }
    std::fflush(out_);
  }
  // A line that stays (validation results, checkpoints).
  void message(const std::string& line) {
    if (!enabled_ || !out_) return;
    if (tty_ && pending_) std::fputs("\r\033[K", out_);
    std::fprintf(out_, "%s\n", line.c_str());
    pending_ = false;
    std::fflush(out_);
  }
  void finish() {
    if (enabled_ && out_ && tty_ && pending_) std::fputs("\n", out_);
    pending_ = false;
    if (out_) std::fflush(out_);
  }

 private:
  std::FILE* out_;
  bool tty_;
  long plain_every_;
  bool enabled_ = true;
  bool pending_ = false;
};

}  // namespace mom::train

// DirLock (train/file_io.hpp): one process writes a run folder at a time; a second one is refused naming the
// first's pid; nested holders in one process share the lock; it is released when the last holder goes (and by
// the kernel when the process dies).
#include <catch2/catch.hpp>

#include <mom/train/file_io.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "helpers.hpp"

using mom::train::DirLock;

namespace {
// Tries to lock `dir` in a child process: 0 when it got the lock, 3 when refused with a message naming `holder`'s
// pid, 4 when refused otherwise.
int lock_in_child(const std::filesystem::path& dir, pid_t holder) {
  const pid_t child = ::fork();
  if (child == 0) {
    try {
      DirLock lock(dir);
      ::_exit(0);
    } catch (const std::exception& e) {
      const std::string m = e.what();
      ::_exit(m.find("in use by another mom-train process (pid " + std::to_string(holder) + ")") != std::string::npos ? 3 : 4);
    }
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}
}  // namespace

TEST_CASE("DirLock: a second writer of a run folder is refused naming the first's pid", "[train][lock]") {
  mom_test::TempDir dir("dir_lock");
  {
    DirLock outer(dir.path);
    {
      DirLock inner(dir.path);  // mom-train's preparation, then Trainer::run: one process, one lock
      CHECK(inner.locked());
      CHECK(lock_in_child(dir.path, ::getpid()) == 3);
    }
    CHECK(lock_in_child(dir.path, ::getpid()) == 3);  // the outer holder still has it
  }
  CHECK(lock_in_child(dir.path, ::getpid()) == 0);  // released
  DirLock again(dir.path);
  CHECK(again.locked());
}

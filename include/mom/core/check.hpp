#pragma once
// Checked errors. MOM_CHECK stays on in release builds: each op checks its shapes
// once per call (a handful of integer compares), never per element.
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace mom {

// Every error the library raises on bad input is a mom::Error; its message names
// the operation and the offending shapes / values.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
template <class... Args>
[[noreturn]] [[gnu::cold]] [[gnu::noinline]] void fail(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  throw Error(os.str());
}
}  // namespace detail
}  // namespace mom

// MOM_CHECK(cond, "op: message parts ", value, ...) throws mom::Error when cond is false.
#define MOM_CHECK(cond, ...)                                 \
  do {                                                       \
    if (!(cond)) [[unlikely]] ::mom::detail::fail(__VA_ARGS__); \
  } while (0)

#pragma once
// Errors by layer (docs/architecture.md):
//  - bad files, bad requests and bad arguments throw tern::Error with context; the CLI prints
//    its message on one line and exits non-zero, the server turns it into a 4xx;
//  - "not now" (no KV room, queue full) is a returned value, never an exception;
//  - broken invariants abort with file:line (TERN_ASSERT). Kernels never throw.
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace tern {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Concatenates its arguments with operator<< into one string.
template <class... Args>
std::string str_cat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

template <class... Args>
[[noreturn]] void fail(Args&&... args) {
  throw Error(str_cat(std::forward<Args>(args)...));
}

[[noreturn]] void assert_fail(const char* expr, const char* file, int line, const char* msg);

}  // namespace tern

#define TERN_ASSERT(cond) \
  do { if (!(cond)) ::tern::assert_fail(#cond, __FILE__, __LINE__, nullptr); } while (0)
#define TERN_ASSERT_MSG(cond, msg) \
  do { if (!(cond)) ::tern::assert_fail(#cond, __FILE__, __LINE__, (msg)); } while (0)

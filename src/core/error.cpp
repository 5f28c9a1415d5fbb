#include "core/error.h"

#include <cstdio>
#include <cstdlib>

namespace tern {

void assert_fail(const char* expr, const char* file, int line, const char* msg) {
  std::fprintf(stderr, "tern: internal error: %s:%d: assertion `%s` failed%s%s\n", file, line, expr,
               msg ? ": " : "", msg ? msg : "");
  std::abort();
}

}  // namespace tern

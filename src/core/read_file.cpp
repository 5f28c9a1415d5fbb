#include "core/read_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace tern {
namespace {

// "cannot open" when the file cannot be opened, "cannot read" when what opened is no text.
[[noreturn]] void refuse(const char* verb, const std::string& path, const std::string& what, int err) {
  fail(verb, " ", what, " ", path, ": ", std::strerror(err));
}

}  // namespace

std::string read_file_text(const std::string& path, const std::string& what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) refuse("cannot open", path, what, errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0 || S_ISDIR(st.st_mode)) {
    // A directory opens fine and reads as EISDIR (or, through some streams, as empty).
    const int err = S_ISDIR(st.st_mode) ? EISDIR : errno;
    ::close(fd);
    refuse("cannot read", path, what, err);
  }
  std::string text;
  if (S_ISREG(st.st_mode)) text.reserve(size_t(st.st_size));
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      refuse("cannot read", path, what, err);
    }
    text.append(buf, size_t(n));
  }
  ::close(fd);
  return text;
}

bool path_exists(const std::string& path) {
  std::error_code ec;
  return std::filesystem::exists(path, ec);
}

}  // namespace tern

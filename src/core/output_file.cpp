#include "core/output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace tern {
namespace {

namespace fs = std::filesystem;

// What writing to a path means once symbolic links are followed.
struct OutputTarget {
  enum Kind { kNew, kRegular, kSpecial } kind = kNew;
  std::string path;      // the file to create or replace (the path itself for kSpecial)
  struct stat st {};     // kRegular, kSpecial: the file's status
};

// Follows `path` to what a write would reach; throws for a directory or an unreachable path.
OutputTarget resolve_output(const std::string& path) {
  if (path.empty()) fail("empty output path");
  OutputTarget t;
  if (::stat(path.c_str(), &t.st) == 0) {
    if (S_ISDIR(t.st.st_mode)) fail("cannot write ", path, ": it is a directory");
    if (!S_ISREG(t.st.st_mode)) {
      // Opened by its own name: /dev/stdout and /proc/self/fd/N are links the kernel resolves.
      t.kind = OutputTarget::kSpecial;
      t.path = path;
      return t;
    }
    char real[PATH_MAX];
    if (!::realpath(path.c_str(), real)) fail("cannot resolve ", path, ": ", std::strerror(errno));
    t.kind = OutputTarget::kRegular;
    t.path = real;
    return t;
  }
  if (errno != ENOENT) fail("cannot write ", path, ": ", std::strerror(errno));
  // Nothing there yet, or a link to nothing: the link's (last) target is the file to create.
  std::string p = path;
  for (int hops = 0;; ++hops) {
    struct stat ls {};
    if (::lstat(p.c_str(), &ls) != 0 || !S_ISLNK(ls.st_mode)) break;
    if (hops == 40) fail("cannot write ", path, ": too many levels of symbolic links");
    std::error_code ec;
    const fs::path link = fs::read_symlink(p, ec);
    if (ec) fail("cannot read the symbolic link ", p, ": ", ec.message());
    p = (link.is_absolute() ? link : fs::path(p).parent_path() / link).string();
  }
  t.path = p;
  return t;
}

std::string directory_of(const std::string& path) {
  const std::string dir = fs::path(path).parent_path().string();
  return dir.empty() ? "." : dir;
}

// The process's umask, which a file made by mkstemp (always 0600) does not get by itself.
// umask() can only be read by setting it; nothing else creates files while an output is made.
mode_t current_umask() {
  const mode_t mask = ::umask(022);
  ::umask(mask);
  return mask;
}

}  // namespace

OutputFile::OutputFile(const std::string& path) : path_(path) {
  const OutputTarget t = resolve_output(path);
  target_ = t.path;
  if (t.kind == OutputTarget::kSpecial) {
    fd_ = ::open(target_.c_str(), O_WRONLY | O_CLOEXEC | O_NOCTTY);
    if (fd_ < 0) fail("cannot open ", path_, " for writing: ", std::strerror(errno));
    return;
  }
  // A unique name beside the target: rename() only replaces atomically within a file system,
  // and two runs writing the same output must not share a temporary file.
  std::string tmpl = target_ + ".tmp.XXXXXX";
  fd_ = ::mkostemp(tmpl.data(), O_CLOEXEC);
  if (fd_ < 0) fail("cannot create ", path_, ": ", std::strerror(errno));
  tmp_ = tmpl;
  const mode_t mode = t.kind == OutputTarget::kRegular ? (t.st.st_mode & 07777) : (0666 & ~current_umask());
  if (::fchmod(fd_, mode) != 0) fail_with("cannot set the permissions of", errno);
}

OutputFile::~OutputFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!tmp_.empty()) ::unlink(tmp_.c_str());
}

void OutputFile::fail_with(const char* action, int err) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!tmp_.empty()) ::unlink(tmp_.c_str());
  tmp_.clear();
  fail(action, " ", path_, ": ", std::strerror(err));
}

void OutputFile::write(const void* data, size_t n) {
  if (fd_ < 0) fail("cannot write ", path_, ": the file is closed");
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail_with("cannot write", errno);
    }
    if (w == 0) fail_with("cannot write", ENOSPC);  // no progress and no error: treat as full
    p += w;
    n -= size_t(w);
  }
}

void OutputFile::commit() {
  if (fd_ < 0) fail("cannot write ", path_, ": the file is closed");
  if (tmp_.empty()) {  // written through: devices and pipes have nothing to sync or rename
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail("cannot write ", path_, ": ", std::strerror(errno));
    return;
  }
  // Data on disk before the name points at it: without the fsync, a crash soon after the
  // rename can leave the path naming an empty or partial file (delayed allocation).
  if (::fsync(fd_) != 0) fail_with("cannot write", errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail_with("cannot write", errno);
  if (::rename(tmp_.c_str(), target_.c_str()) != 0) {
    const int err = errno;  // before building the message, which may allocate
    fail_with(("cannot rename " + tmp_ + " to").c_str(), err);
  }
  tmp_.clear();
  // The directory synced too, so that the rename itself survives a crash. Some file systems
  // cannot sync a directory; the file is complete under its name either way, so that error
  // is not reported.
  const int dfd = ::open(directory_of(target_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
}

void write_output_file(const std::string& path, const void* data, size_t n) {
  OutputFile f(path);
  f.write(data, n);
  f.commit();
}

void check_output_path(const std::string& path) {
  const OutputTarget t = resolve_output(path);
  if (t.kind == OutputTarget::kSpecial) {
    if (::access(t.path.c_str(), W_OK) != 0) fail("cannot write ", path, ": ", std::strerror(errno));
    return;
  }
  const std::string dir = directory_of(t.path);
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) fail("cannot create ", path, ": directory ", dir, ": ", std::strerror(errno));
  if (!S_ISDIR(st.st_mode)) fail("cannot create ", path, ": ", dir, " is not a directory");
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    fail("cannot create ", path, ": directory ", dir, ": ", std::strerror(errno));
}

void check_output_not_input(const std::string& out, const std::vector<std::string>& inputs) {
  struct stat so {};
  // Not there yet (or unreachable: the write reports it), or a device or pipe: nothing to lose.
  if (::stat(out.c_str(), &so) != 0 || !S_ISREG(so.st_mode)) return;
  for (const std::string& in : inputs) {
    struct stat si {};
    if (in.empty() || ::stat(in.c_str(), &si) != 0) continue;
    if (si.st_dev == so.st_dev && si.st_ino == so.st_ino)
      fail("the output ", out, " is the input file ", in, ": write the result to another file");
  }
}

std::string make_scratch_file(const std::string& out, const std::string& tag) {
  namespace fs = std::filesystem;
  fs::path dir = fs::path(out).parent_path();
  if (dir.empty()) dir = ".";
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    std::error_code ec;
    dir = fs::temp_directory_path(ec);
    if (ec) fail("no writable directory for scratch files beside ", out);
  }
  std::string name = (dir / (fs::path(out).filename().string() + "." + tag + ".XXXXXX")).string();
  const int fd = ::mkstemp(name.data());
  if (fd < 0) fail("cannot create a scratch file in ", dir.string(), ": ", std::strerror(errno));
  ::close(fd);
  return name;
}

}  // namespace tern

#include "core/file_read_rate.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "core/error.h"

namespace tern {

namespace {

constexpr int64_t kChunk = int64_t(1) << 20;  // bytes a read (a multiple of any block size)
constexpr uint64_t kAlign = 4096;             // O_DIRECT's buffer, offset and length alignment

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Seconds to read [off, off + n) with 1 MiB preads into buf.
double timed_reads(int fd, uint8_t* buf, uint64_t off, int64_t n, const std::string& path) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t done = 0; done < n;) {
    const ssize_t r = ::pread(fd, buf, size_t(std::min(kChunk, n - done)), off_t(off + uint64_t(done)));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) fail("reading ", path, ": ", std::strerror(errno));
    if (r == 0) break;
    done += r;
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

FileReadRate measure_file_read_rate(const std::string& path, uint64_t offset, int64_t max_bytes) {
  Fd plain;
  plain.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (plain.fd < 0) fail("cannot open ", path, ": ", std::strerror(errno));
  struct stat st {};
  if (::fstat(plain.fd, &st) != 0) fail("cannot stat ", path, ": ", std::strerror(errno));
  const uint64_t size = uint64_t(st.st_size);
  const uint64_t off = std::min(offset, size) / kAlign * kAlign;
  // Whole aligned chunks inside the file.
  const int64_t n = std::max<int64_t>(0, std::min<int64_t>(max_bytes, int64_t(size - off)) / int64_t(kAlign) * int64_t(kAlign));
  FileReadRate rate;
  rate.bytes = n;
  if (n == 0) return rate;
  std::unique_ptr<uint8_t, decltype(&std::free)> buf(static_cast<uint8_t*>(std::aligned_alloc(kAlign, size_t(kChunk))),
                                                    &std::free);
  if (!buf) fail("measuring the read rate of ", path, ": out of memory");
  Fd direct;
  direct.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
  double cold = 0;
  if (direct.fd >= 0) {
    // A file system may accept O_DIRECT at open and refuse the reads (EINVAL): then the fallback.
    try {
      cold = timed_reads(direct.fd, buf.get(), off, n, path);
      rate.direct = true;
    } catch (const Error&) {
      rate.direct = false;
    }
  }
  if (!rate.direct) {
    ::posix_fadvise(plain.fd, off_t(off), off_t(n), POSIX_FADV_DONTNEED);
    cold = timed_reads(plain.fd, buf.get(), off, n, path);
  }
  (void)timed_reads(plain.fd, buf.get(), off, n, path);  // into the cache, if the cold pass bypassed it
  const double warm = timed_reads(plain.fd, buf.get(), off, n, path);
  rate.cold_bytes_per_s = cold > 0 ? double(n) / cold : 0;
  rate.warm_bytes_per_s = warm > 0 ? double(n) / warm : 0;
  return rate;
}

}  // namespace tern

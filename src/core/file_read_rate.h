#pragma once
// How fast a file's bytes come off its storage, for --ram-budget's report (tok/s against the
// disk: docs/sparsity.md "Models larger than memory"). Cold: with O_DIRECT, which bypasses the
// page cache, where the file system allows it; else after posix_fadvise(DONTNEED) drops the
// range's cached pages (clean pages only: a page another process keeps mapped may stay, so that
// figure can be the cache's). Warm: the same range again through the page cache.
#include <cstdint>
#include <string>

namespace tern {

struct FileReadRate {
  double cold_bytes_per_s = 0;
  double warm_bytes_per_s = 0;
  int64_t bytes = 0;       // bytes each pass read
  bool direct = false;     // the cold pass used O_DIRECT
};

// Reads up to max_bytes of `path` from byte `offset` (1 MiB reads) once cold and once warm.
// Throws tern::Error naming the file when it cannot be read.
FileReadRate measure_file_read_rate(const std::string& path, uint64_t offset, int64_t max_bytes);

}  // namespace tern

#pragma once
// Read-only memory mapping of a whole file. Weights stay in the page cache and are never
// copied: tensors are views into this mapping. Movable, not copyable; thread-safe to read.
#include <cstddef>
#include <cstdint>
#include <string>

namespace tern {

class MappedFile {
 public:
  // Throws tern::Error("cannot open PATH: reason") when the file is missing or unreadable.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Gives the whole pages inside [p, p + n) of a read-only file mapping back to the kernel
// (madvise MADV_DONTNEED): nothing is lost, a later read faults them in from the file again, and
// until then they do not count in the process's resident memory. Only for read-only mappings of
// files (MappedFile): an anonymous or written page would read back as zeros.
void release_mapped_range(const void* p, size_t n);

}  // namespace tern

#include "core/huge_buffer.h"

#include <sys/mman.h>

#include <cstdlib>
#include <new>

namespace tern {

void FreeHugeBuffer::operator()(uint8_t* p) const { std::free(p); }

HugeBuffer alloc_huge_buffer(size_t bytes) {
  constexpr size_t kHuge = size_t(2) << 20;
  // Whole 2 MiB pages, aligned: a huge page never straddles another allocation.
  const size_t cap = bytes > kHuge ? (bytes + kHuge - 1) / kHuge * kHuge : kHuge;
  void* mem = std::aligned_alloc(kHuge, cap);
  if (!mem) throw std::bad_alloc();
  // A hint: without THP support (or with it off) the buffer is ordinary pages.
  ::madvise(mem, cap, MADV_HUGEPAGE);
  return HugeBuffer(static_cast<uint8_t*>(mem));
}

}  // namespace tern

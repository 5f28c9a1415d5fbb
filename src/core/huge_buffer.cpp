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
  // 2 MiB pages only on request (TERN_HUGEPAGES=1; a hint: without THP support the buffer is
  // ordinary pages). See huge_buffer.h for why not by default.
  static const bool want_huge = [] {
    const char* e = std::getenv("TERN_HUGEPAGES");
    return e && e[0] == '1' && e[1] == '\0';
  }();
  if (want_huge) ::madvise(mem, cap, MADV_HUGEPAGE);
  return HugeBuffer(static_cast<uint8_t*>(mem));
}

}  // namespace tern

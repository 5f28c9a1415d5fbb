// Replacing the global operator new/delete is allowed by the standard and compatible with
// AddressSanitizer (it still sees the malloc/free underneath). Kept in its own file so that
// no caller inlines these bodies (GCC's -Wmismatched-new-delete would flag new vs free).
#include "alloc_watch.h"

#include <atomic>
#include <cstdlib>
#include <new>

namespace {
std::atomic<size_t> g_largest{0};

void* watched_alloc(size_t n) {
  size_t cur = g_largest.load(std::memory_order_relaxed);
  while (n > cur && !g_largest.compare_exchange_weak(cur, n, std::memory_order_relaxed)) {
  }
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
}  // namespace

namespace tern::test {
void reset_largest_alloc() { g_largest = 0; }
size_t largest_alloc() { return g_largest.load(); }
}  // namespace tern::test

void* operator new(size_t n) { return watched_alloc(n); }
void* operator new[](size_t n) { return watched_alloc(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }
// Nothrow forms too (std::stable_sort's buffer uses them); otherwise ASan reports a mismatch.
void* operator new(size_t n, const std::nothrow_t&) noexcept {
  try {
    return watched_alloc(n);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](size_t n, const std::nothrow_t& tag) noexcept { return ::operator new(n, tag); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

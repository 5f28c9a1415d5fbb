// sample() must not allocate in the per-token path (architecture principle 8). This binary
// replaces the global operator new with a counting one to check it.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <random>
#include <vector>

#include "sampling/sampler.h"

namespace {
std::atomic<long> g_allocs{0};
}

// GCC flags free() in a replaced operator delete as "mismatched" even though the matching
// operator new above it uses malloc; the pairing is correct by construction.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

void* operator new(std::size_t size) {
  g_allocs.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t size) { return ::operator new(size); }
// The nothrow forms must be replaced too: std::stable_sort's temporary buffer uses them, and
// mixing the sanitizer's nothrow new with this file's delete is an alloc-dealloc mismatch.
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  g_allocs.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(size == 0 ? 1 : size);
}
void* operator new[](std::size_t size, const std::nothrow_t& tag) noexcept { return ::operator new(size, tag); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

namespace tern {
namespace {

TEST(SamplerAlloc, SampleDoesNotAllocate) {
  const int32_t n_vocab = 32000;
  std::mt19937 gen(9);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::vector<float> l(n_vocab);
  for (float& x : l) x = nd(gen);
  std::vector<int32_t> history;
  history.reserve(512);

  SamplingParams configs[3];
  configs[0].repeat_penalty = 1.1f;  // defaults: top-k, top-p, min-p all on
  configs[1].top_k = 0;              // chunked top-p over the whole vocab
  configs[1].min_p = 0.0f;
  configs[1].frequency_penalty = 0.5f;
  configs[1].penalty_last_n = -1;
  configs[2].temperature = 0.0f;     // greedy
  configs[2].presence_penalty = 0.5f;
  for (const SamplingParams& p : configs) {
    Sampler s(p, n_vocab);
    history.clear();
    const long before = g_allocs.load();
    for (int i = 0; i < 200; ++i) history.push_back(s.sample(l.data(), history));
    EXPECT_EQ(g_allocs.load() - before, 0);
  }
}

}  // namespace
}  // namespace tern

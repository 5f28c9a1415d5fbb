#include "tools/bandwidth_probe.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "core/stats.h"

namespace tern {

namespace {
// Eight independent accumulators so the loop is bound by loads, not by an add chain.
uint64_t sum_words(const uint64_t* p, size_t n) {
  uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    a0 += p[i]; a1 += p[i + 1]; a2 += p[i + 2]; a3 += p[i + 3];
    a4 += p[i + 4]; a5 += p[i + 5]; a6 += p[i + 6]; a7 += p[i + 7];
  }
  for (; i < n; ++i) a0 += p[i];
  return a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
}
}  // namespace

ReadBandwidthProbe::ReadBandwidthProbe(ThreadPool& pool, size_t bytes)
    : pool_(pool), own_(static_cast<uint64_t*>(std::aligned_alloc(4096, (bytes / 4096 + 1) * 4096)), &std::free) {
  if (!own_) return;
  const size_t n_words = bytes / sizeof(uint64_t);
  // First touch from the pool, so pages are spread the way the kernels will read them.
  uint64_t* buf = own_.get();
  pool_.parallel_for(int64_t(n_words), [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) buf[i] = uint64_t(i);
  });
  regions_.emplace_back(reinterpret_cast<const uint8_t*>(buf), n_words * sizeof(uint64_t));
}

ReadBandwidthProbe::ReadBandwidthProbe(ThreadPool& pool, std::vector<std::span<const uint8_t>> regions)
    : pool_(pool), own_(nullptr, &std::free) {
  // Whole aligned 8-byte words of each span (GGUF aligns tensors to 32 bytes, so this drops
  // nothing there).
  for (const auto& r : regions) {
    const auto a = reinterpret_cast<uintptr_t>(r.data());
    const size_t skip = std::min(r.size(), size_t((8 - a % 8) % 8));
    regions_.push_back(r.subspan(skip));
  }
}

size_t ReadBandwidthProbe::bytes() const {
  size_t n = 0;
  for (const auto& r : regions_) n += r.size() / sizeof(uint64_t) * sizeof(uint64_t);
  return n;
}

double ReadBandwidthProbe::measure(int passes) {
  const size_t total_words = bytes() / sizeof(uint64_t);
  if (total_words == 0) return 0.0;
  double best = 0.0;
  volatile uint64_t sink = 0;
  std::vector<uint64_t> partial(size_t(pool_.size()) * 8, 0);
  for (int r = 0; r < passes; ++r) {
    const int64_t t0 = now_ns();
    // Words [b, e) of the regions laid end to end: each thread one contiguous share.
    pool_.parallel_for(int64_t(total_words), [&](int64_t b, int64_t e, int chunk) {
      uint64_t sum = 0;
      int64_t at = 0;  // first word of the current region
      for (const auto& reg : regions_) {
        const int64_t n = int64_t(reg.size() / sizeof(uint64_t));
        const int64_t lo = std::max(b, at), hi = std::min(e, at + n);
        if (lo < hi) {
          const auto* p = reinterpret_cast<const uint64_t*>(reg.data()) + (lo - at);
          sum += sum_words(p, size_t(hi - lo));
        }
        at += n;
        if (at >= e) break;
      }
      partial[size_t(chunk) * 8] = sum;
    });
    const int64_t t1 = now_ns();
    for (uint64_t v : partial) sink = sink + v;
    best = std::max(best, double(total_words * sizeof(uint64_t)) / double(t1 - t0));
  }
  (void)sink;
  return best;  // bytes per ns == GB/s
}

}  // namespace tern

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
    : pool_(pool), buf_(static_cast<uint64_t*>(std::aligned_alloc(4096, (bytes / 4096 + 1) * 4096)), &std::free) {
  if (!buf_) return;
  n_words_ = bytes / sizeof(uint64_t);
  // First touch from the pool, so pages are spread the way the kernels will read them.
  uint64_t* buf = buf_.get();
  pool_.parallel_for(int64_t(n_words_), [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) buf[i] = uint64_t(i);
  });
}

double ReadBandwidthProbe::measure(int passes) {
  if (!buf_ || n_words_ == 0) return 0.0;
  double best = 0.0;
  volatile uint64_t sink = 0;
  std::vector<uint64_t> partial(size_t(pool_.size()) * 8, 0);
  for (int r = 0; r < passes; ++r) {
    const int64_t t0 = now_ns();
    pool_.parallel_for(int64_t(n_words_), [&](int64_t b, int64_t e, int chunk) {
      partial[size_t(chunk) * 8] = sum_words(buf_.get() + b, size_t(e - b));
    });
    const int64_t t1 = now_ns();
    for (uint64_t v : partial) sink = sink + v;
    best = std::max(best, double(n_words_ * sizeof(uint64_t)) / double(t1 - t0));
  }
  (void)sink;
  return best;  // bytes per ns == GB/s
}

double measure_read_bandwidth_gb_s(ThreadPool& pool, int reps, size_t bytes) {
  ReadBandwidthProbe probe(pool, bytes);
  return probe.measure(reps);
}

}  // namespace tern

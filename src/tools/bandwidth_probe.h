#pragma once
// Measured memory read bandwidth of this machine, the denominator of the decode roofline:
// decode streams every weight once per token, so tg_max = bandwidth / bytes read per token.
#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/thread_pool.h"

namespace tern {

// A buffer much larger than the caches, read by every thread of the pool. Kept between
// measurements, so that a benchmark can take one next to each of its runs: on a shared
// machine the bandwidth moves from minute to minute, and a roofline share is only meaningful
// against the bandwidth of the same minute.
class ReadBandwidthProbe {
 public:
  ReadBandwidthProbe(ThreadPool& pool, size_t bytes);
  // The best of `passes` reads of the whole buffer, in GB/s (1e9 bytes/s); 0 if the buffer
  // could not be allocated.
  double measure(int passes);
  size_t bytes() const { return n_words_ * sizeof(uint64_t); }

 private:
  ThreadPool& pool_;
  size_t n_words_ = 0;
  std::unique_ptr<uint64_t, void (*)(void*)> buf_;
};

// One-off: the best of `reps` passes over `bytes`.
double measure_read_bandwidth_gb_s(ThreadPool& pool, int reps = 5, size_t bytes = size_t(1) << 30);

}  // namespace tern

#pragma once
// Measured memory read bandwidth of this machine, the denominator of the decode roofline:
// decode streams every weight once per token, so tg_max = bandwidth / bytes read per token.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/thread_pool.h"

namespace tern {

// Reads memory with every thread of the pool, each its share of the bytes as one contiguous
// walk, and reports the best of a few passes in GB/s (1e9 bytes/s). Kept between measurements,
// so that a benchmark can take one next to each of its runs: on a shared machine the bandwidth
// moves from minute to minute, and a roofline share is only meaningful against the bandwidth
// of the same minute.
//
// Which memory matters as much as when: on this project's VM, two buffers allocated one after
// the other read at rates 10-20% apart, and which one is faster follows the allocation order
// (guest pages backed differently by the host), so a buffer of the probe's own can sit on
// faster or slower memory than the weights. Given the weights' spans, the probe reads those
// very bytes where they are (their file mapping or interleaved copies): the rate at which a
// decode step could stream them.
class ReadBandwidthProbe {
 public:
  // A buffer of `bytes` of its own.
  ReadBandwidthProbe(ThreadPool& pool, size_t bytes);
  // The given memory (not owned; must outlive the probe); only whole aligned 8-byte words of
  // each span are read.
  ReadBandwidthProbe(ThreadPool& pool, std::vector<std::span<const uint8_t>> regions);
  // The best of `passes` reads of all the memory; 0 if there is none (allocation failed).
  double measure(int passes);
  size_t bytes() const;

 private:
  ThreadPool& pool_;
  std::unique_ptr<uint64_t, void (*)(void*)> own_;
  std::vector<std::span<const uint8_t>> regions_;
};

}  // namespace tern

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
//
// Two ways of reading, both reported: one contiguous walk per thread (what the hardware
// prefetcher streams best on some CPUs), and kStreams walks per thread interleaved a cache line
// at a time with software prefetch, as the decode tiles read their row groups: on an Intel Xeon
// VM (2 vCPUs, 2026-12-07) one walk read 20-23 GB/s and eight 28-32, and the Q8_0 decode moved
// 28, "137% of the roofline" against the one walk. The roofline takes the faster of the two.
struct ReadRates {
  double one_stream = 0.0;  // GB/s, one walk per thread
  double streams = 0.0;     // GB/s, kStreams walks per thread with prefetch
  // The sums of the words each way read (wrapping): equal, and the words' own sum, when each
  // reads every word once (tested).
  uint64_t one_stream_sum = 0, streams_sum = 0;
  double best() const { return one_stream > streams ? one_stream : streams; }
};

class ReadBandwidthProbe {
 public:
  static constexpr int kStreams = 8;
  // A buffer of `bytes` of its own.
  ReadBandwidthProbe(ThreadPool& pool, size_t bytes);
  // The given memory (not owned; must outlive the probe); only whole aligned 8-byte words of
  // each span are read.
  ReadBandwidthProbe(ThreadPool& pool, std::vector<std::span<const uint8_t>> regions);
  // The best of `passes` reads of all the memory in each way (the two alternating); 0 if there
  // is none (allocation failed).
  ReadRates measure(int passes);
  size_t bytes() const;

 private:
  // GB/s of one pass; `sum` receives the sum of the words read.
  double one_stream_pass(uint64_t& sum);
  double streams_pass(uint64_t& sum);

  ThreadPool& pool_;
  std::unique_ptr<uint64_t, void (*)(void*)> own_;
  std::vector<std::span<const uint8_t>> regions_;
  // The regions cut into pieces of at most kPieceBytes (whole words): the multi-stream pass
  // reads kStreams consecutive pieces at once.
  std::vector<std::span<const uint64_t>> pieces_;
};

}  // namespace tern

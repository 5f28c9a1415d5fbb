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
// kStreams pieces read at once, a 64-byte line of each in turn, each stream prefetched
// kPrefetchLines ahead (8: the best of 0 / 8 / 16 in a loop of 1-16 streams on the Xeon of
// bandwidth_probe.h); the rest of the longer pieces one after another. Pieces of 256 KiB: over
// TinyLlama's Q8_0 weights (the file's 4 KiB pages and interleaved copies) 1 and 4 MiB pieces read
// 15-25% slower; bench/read_peak's own 8 walks a thread (AVX2) read the same buffer 3-13% faster
// or slower from run to run, the machine's own spread (docs/performance.md).
constexpr size_t kPieceBytes = size_t(256) << 10;
constexpr size_t kPrefetchLines = 8;

// Two words at a time (SSE2 / NEON registers on every build): four loads a line instead of eight,
// nearer the vector loads of the decode tiles.
using Words2 = uint64_t __attribute__((vector_size(16)));

uint64_t sum_interleaved(const std::span<const uint64_t>* piece, int n) {
  size_t lines = SIZE_MAX;
  for (int s = 0; s < n; ++s) lines = std::min(lines, piece[s].size() / 8);
  Words2 a0 = {0, 0}, a1 = {0, 0}, a2 = {0, 0}, a3 = {0, 0};
  for (size_t l = 0; l < lines; ++l) {
    for (int s = 0; s < n; ++s) {
      const uint64_t* q = piece[s].data() + 8 * l;
      if (l + kPrefetchLines < lines) __builtin_prefetch(q + 8 * kPrefetchLines);
      Words2 w[4];
      std::memcpy(w, q, sizeof w);
      a0 += w[0]; a1 += w[1]; a2 += w[2]; a3 += w[3];
    }
  }
  const Words2 t = a0 + a1 + a2 + a3;
  uint64_t sum = t[0] + t[1];
  for (int s = 0; s < n; ++s) sum += sum_words(piece[s].data() + 8 * lines, piece[s].size() - 8 * lines);
  return sum;
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
  for (size_t at = 0; at < n_words; at += kPieceBytes / 8)
    pieces_.emplace_back(buf + at, std::min(kPieceBytes / 8, n_words - at));
}

ReadBandwidthProbe::ReadBandwidthProbe(ThreadPool& pool, std::vector<std::span<const uint8_t>> regions)
    : pool_(pool), own_(nullptr, &std::free) {
  // Whole aligned 8-byte words of each span (GGUF aligns tensors to 32 bytes, so this drops
  // nothing there).
  for (const auto& r : regions) {
    const auto a = reinterpret_cast<uintptr_t>(r.data());
    const size_t skip = std::min(r.size(), size_t((8 - a % 8) % 8));
    regions_.push_back(r.subspan(skip));
    const auto* words = reinterpret_cast<const uint64_t*>(regions_.back().data());
    const size_t n_words = regions_.back().size() / 8;
    for (size_t at = 0; at < n_words; at += kPieceBytes / 8)
      pieces_.emplace_back(words + at, std::min(kPieceBytes / 8, n_words - at));
  }
}

size_t ReadBandwidthProbe::bytes() const {
  size_t n = 0;
  for (const auto& r : regions_) n += r.size() / sizeof(uint64_t) * sizeof(uint64_t);
  return n;
}

ReadRates ReadBandwidthProbe::measure(int passes) {
  ReadRates best;
  if (bytes() < sizeof(uint64_t)) return best;
  for (int r = 0; r < passes; ++r) {
    best.one_stream = std::max(best.one_stream, one_stream_pass(best.one_stream_sum));
    best.streams = std::max(best.streams, streams_pass(best.streams_sum));
  }
  return best;
}

double ReadBandwidthProbe::one_stream_pass(uint64_t& sum_out) {
  const size_t total_words = bytes() / sizeof(uint64_t);
  std::vector<uint64_t> partial(size_t(pool_.size()) * 8, 0);
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
  sum_out = 0;
  for (uint64_t v : partial) sum_out += v;
  return double(total_words * sizeof(uint64_t)) / double(t1 - t0);  // bytes per ns == GB/s
}

double ReadBandwidthProbe::streams_pass(uint64_t& sum_out) {
  const size_t total_words = bytes() / sizeof(uint64_t);
  std::vector<uint64_t> partial(size_t(pool_.size()) * 8, 0);
  const int64_t n_groups = (int64_t(pieces_.size()) + kStreams - 1) / kStreams;
  const int64_t t0 = now_ns();
  // Each thread a contiguous run of groups of kStreams consecutive pieces.
  pool_.parallel_for(n_groups, [&](int64_t g0, int64_t g1, int chunk) {
    uint64_t sum = 0;
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t first = g * kStreams;
      const int n = int(std::min<int64_t>(kStreams, int64_t(pieces_.size()) - first));
      sum += sum_interleaved(pieces_.data() + first, n);
    }
    partial[size_t(chunk) * 8] = sum;
  });
  const int64_t t1 = now_ns();
  sum_out = 0;
  for (uint64_t v : partial) sum_out += v;
  return double(total_words * sizeof(uint64_t)) / double(t1 - t0);
}

}  // namespace tern

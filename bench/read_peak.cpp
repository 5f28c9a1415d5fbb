// Memory read bandwidth of this machine by a loop of its own, the independent check of the
// probe behind tern bench's decode roofline (src/tools/bandwidth_probe.h): std::thread instead of
// tern's pool, 256-bit AVX2 loads instead of 8-byte words, its own buffer (first touched by the
// thread that reads it). Each thread reads its share of the buffer with S walks interleaved a
// cache line at a time, each walk prefetched P lines ahead (S = 1, P = 0 is one plain walk); the
// best of a few passes is reported in GB/s (1e9 bytes/s). Beside it, in the same passes, tern's
// probe (ReadBandwidthProbe) over the same buffer (two buffers can read 10-20% apart on a VM:
// bandwidth_probe.h): its two ways should come within 10% of this loop's one walk and 8
// prefetched walks.
// Usage: read_peak [--threads 2] [--mib 1024] [--passes 3] [--json]
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "core/thread_pool.h"
#include "tools/bandwidth_probe.h"

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// n_lines 64-byte lines at p as `walks` equal ranges, read a line of each in turn.
__attribute__((target("avx2"), noinline)) uint64_t read_lines(const uint64_t* p, size_t n_lines, int walks,
                                                              int prefetch_lines) {
  __m256i acc0 = _mm256_setzero_si256(), acc1 = _mm256_setzero_si256();
  const size_t per = n_lines / size_t(walks);
  for (size_t l = 0; l < per; ++l) {
    for (int w = 0; w < walks; ++w) {
      const uint64_t* q = p + (size_t(w) * per + l) * 8;
      if (prefetch_lines > 0) _mm_prefetch(reinterpret_cast<const char*>(q + 8 * prefetch_lines), _MM_HINT_T0);
      acc0 = _mm256_add_epi64(acc0, _mm256_load_si256(reinterpret_cast<const __m256i*>(q)));
      acc1 = _mm256_add_epi64(acc1, _mm256_load_si256(reinterpret_cast<const __m256i*>(q + 4)));
    }
  }
  alignas(32) uint64_t o[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(o), _mm256_add_epi64(acc0, acc1));
  return o[0] + o[1] + o[2] + o[3];
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, passes = 3;
  size_t mib = 1024;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) threads = std::atoi(argv[++i]);
    else if (a == "--mib" && i + 1 < argc) mib = size_t(std::atol(argv[++i]));
    else if (a == "--passes" && i + 1 < argc) passes = std::atoi(argv[++i]);
    else if (a == "--json") json = true;
    else {
      std::fprintf(stderr, "usage: read_peak [--threads 2] [--mib 1024] [--passes 3] [--json]\n");
      return 2;
    }
  }
  if (threads < 1 || passes < 1 || mib < 1) {
    std::fprintf(stderr, "read_peak: --threads, --passes and --mib must be positive\n");
    return 2;
  }
  if (!__builtin_cpu_supports("avx2")) {
    std::fprintf(stderr, "read_peak: this CPU has no AVX2\n");
    return 1;
  }
  const size_t bytes = mib << 20, lines_per_thread = bytes / 64 / size_t(threads);
  auto* buf = static_cast<uint64_t*>(std::aligned_alloc(4096, bytes));
  if (!buf) {
    std::fprintf(stderr, "read_peak: cannot allocate %zu MiB\n", mib);
    return 1;
  }
  const auto on_threads = [&](auto&& fn) {
    std::vector<std::thread> th;
    for (int t = 0; t < threads; ++t) th.emplace_back([&, t] { fn(t, buf + size_t(t) * lines_per_thread * 8); });
    for (auto& x : th) x.join();
  };
  on_threads([&](int, uint64_t* p) {
    for (size_t i = 0; i < lines_per_thread * 8; ++i) p[i] = i;
  });
  struct Way {
    int walks, prefetch;
    double best = 0;
  };
  std::vector<Way> ways = {{1, 0}, {1, 8}, {4, 0}, {8, 0}, {8, 8}, {16, 8}};
  volatile uint64_t sink = 0;
  tern::ThreadPool pool(threads);
  tern::ReadBandwidthProbe probe(pool, {std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(buf), bytes)});
  tern::ReadRates tern_best;
  for (int pass = 0; pass < passes; ++pass) {
    const tern::ReadRates r = probe.measure(1);
    tern_best.one_stream = std::max(tern_best.one_stream, r.one_stream);
    tern_best.streams = std::max(tern_best.streams, r.streams);
    for (Way& w : ways) {
      std::vector<uint64_t> sums(static_cast<size_t>(threads));
      const double t0 = now_s();
      on_threads([&](int t, uint64_t* p) { sums[size_t(t)] = read_lines(p, lines_per_thread, w.walks, w.prefetch); });
      const double s = now_s() - t0;
      for (const uint64_t v : sums) sink = sink + v;
      w.best = std::max(w.best, double(lines_per_thread * 64 * size_t(threads)) / s / 1e9);
    }
  }
  if (json) {
    std::printf("{\"threads\": %d, \"mib\": %zu, \"ways\": [", threads, mib);
    for (size_t i = 0; i < ways.size(); ++i)
      std::printf("%s{\"walks\": %d, \"prefetch_lines\": %d, \"gb_s\": %.2f}", i ? ", " : "", ways[i].walks,
                  ways[i].prefetch, ways[i].best);
    std::printf("], \"tern_probe\": {\"one_stream_gb_s\": %.2f, \"streams_gb_s\": %.2f}}\n", tern_best.one_stream,
                tern_best.streams);
  } else {
    std::printf("| reader | walks a thread | prefetch lines | GB/s (best of %d, %d threads, %zu MiB) |\n"
                "|---|--:|--:|--:|\n",
                passes, threads, mib);
    for (const Way& w : ways) std::printf("| this loop | %d | %d | %.1f |\n", w.walks, w.prefetch, w.best);
    std::printf("| tern's probe | 1 | 0 | %.1f |\n| tern's probe | %d | 8 | %.1f |\n", tern_best.one_stream,
                tern::ReadBandwidthProbe::kStreams, tern_best.streams);
  }
  std::free(buf);
  return 0;
}

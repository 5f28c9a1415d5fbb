// Peak f32 FMA throughput of this CPU: independent chains of vector FMAs (enough accumulators to
// hide the FMA latency on every pipe), in AVX-512 (16 chains of 16 lanes) and AVX2+FMA (12 chains
// of 8 lanes), on 1 thread and on N threads (default 1 and 2), each thread its own registers.
// GFLOP/s = 2 * lanes * chains * iterations * threads / seconds (an FMA counts as 2 flops). The
// best of a few repetitions is reported: this is the ceiling a matmul kernel can approach, the
// denominator of "% of peak" in bench/train_compare.sh.
// Usage: fma_peak [--threads 1,2] [--seconds 0.3] [--json]
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Each returns a value derived from every accumulator so the compiler cannot drop the chains.
__attribute__((target("avx512f"))) float chains_avx512(int64_t iters, float seed) {
  __m512 a0 = _mm512_set1_ps(seed), a1 = _mm512_set1_ps(seed + 1), a2 = _mm512_set1_ps(seed + 2),
         a3 = _mm512_set1_ps(seed + 3), a4 = _mm512_set1_ps(seed + 4), a5 = _mm512_set1_ps(seed + 5),
         a6 = _mm512_set1_ps(seed + 6), a7 = _mm512_set1_ps(seed + 7), a8 = _mm512_set1_ps(seed + 8),
         a9 = _mm512_set1_ps(seed + 9), a10 = _mm512_set1_ps(seed + 10), a11 = _mm512_set1_ps(seed + 11),
         a12 = _mm512_set1_ps(seed + 12), a13 = _mm512_set1_ps(seed + 13), a14 = _mm512_set1_ps(seed + 14),
         a15 = _mm512_set1_ps(seed + 15);
  const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; ++i) {
    a0 = _mm512_fmadd_ps(a0, m, c);
    a1 = _mm512_fmadd_ps(a1, m, c);
    a2 = _mm512_fmadd_ps(a2, m, c);
    a3 = _mm512_fmadd_ps(a3, m, c);
    a4 = _mm512_fmadd_ps(a4, m, c);
    a5 = _mm512_fmadd_ps(a5, m, c);
    a6 = _mm512_fmadd_ps(a6, m, c);
    a7 = _mm512_fmadd_ps(a7, m, c);
    a8 = _mm512_fmadd_ps(a8, m, c);
    a9 = _mm512_fmadd_ps(a9, m, c);
    a10 = _mm512_fmadd_ps(a10, m, c);
    a11 = _mm512_fmadd_ps(a11, m, c);
    a12 = _mm512_fmadd_ps(a12, m, c);
    a13 = _mm512_fmadd_ps(a13, m, c);
    a14 = _mm512_fmadd_ps(a14, m, c);
    a15 = _mm512_fmadd_ps(a15, m, c);
  }
  __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                           _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
  s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)),
                                     _mm512_add_ps(_mm512_add_ps(a12, a13), _mm512_add_ps(a14, a15))));
  alignas(64) float v[16];
  _mm512_store_ps(v, s);
  float r = 0;
  for (float x : v) r += x;
  return r;
}

__attribute__((target("avx2,fma"))) float chains_avx2(int64_t iters, float seed) {
  __m256 a0 = _mm256_set1_ps(seed), a1 = _mm256_set1_ps(seed + 1), a2 = _mm256_set1_ps(seed + 2),
         a3 = _mm256_set1_ps(seed + 3), a4 = _mm256_set1_ps(seed + 4), a5 = _mm256_set1_ps(seed + 5),
         a6 = _mm256_set1_ps(seed + 6), a7 = _mm256_set1_ps(seed + 7), a8 = _mm256_set1_ps(seed + 8),
         a9 = _mm256_set1_ps(seed + 9), a10 = _mm256_set1_ps(seed + 10), a11 = _mm256_set1_ps(seed + 11);
  const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; ++i) {
    a0 = _mm256_fmadd_ps(a0, m, c);
    a1 = _mm256_fmadd_ps(a1, m, c);
    a2 = _mm256_fmadd_ps(a2, m, c);
    a3 = _mm256_fmadd_ps(a3, m, c);
    a4 = _mm256_fmadd_ps(a4, m, c);
    a5 = _mm256_fmadd_ps(a5, m, c);
    a6 = _mm256_fmadd_ps(a6, m, c);
    a7 = _mm256_fmadd_ps(a7, m, c);
    a8 = _mm256_fmadd_ps(a8, m, c);
    a9 = _mm256_fmadd_ps(a9, m, c);
    a10 = _mm256_fmadd_ps(a10, m, c);
    a11 = _mm256_fmadd_ps(a11, m, c);
  }
  __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                           _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
  s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
  alignas(32) float v[8];
  _mm256_store_ps(v, s);
  float r = 0;
  for (float x : v) r += x;
  return r;
}

struct Isa {
  const char* name;
  float (*fn)(int64_t, float);
  double flops_per_iter;  // 2 * lanes * chains
  bool ok;
};

std::atomic<float> g_sink{0};

// Runs `threads` copies of fn for `iters` iterations each, all started together; returns seconds.
double run_once(const Isa& isa, int threads, int64_t iters) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> ts;
  std::vector<double> secs(threads);
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) {
      }
      const double t0 = now_s();
      const float r = isa.fn(iters, 1.0f + static_cast<float>(t));
      secs[t] = now_s() - t0;
      g_sink.store(g_sink.load() + r);
    });
  }
  while (ready.load() < threads) {
  }
  go.store(true, std::memory_order_release);
  for (auto& th : ts) th.join();
  return *std::max_element(secs.begin(), secs.end());
}

double measure(const Isa& isa, int threads, double min_seconds) {
  int64_t iters = 1 << 16;
  while (run_once(isa, threads, iters) < 0.05) iters *= 2;  // calibrate
  const double t1 = run_once(isa, threads, iters);
  iters = std::max<int64_t>(iters, static_cast<int64_t>(iters * (min_seconds / 4) / t1));
  double best = 0;
  for (int rep = 0; rep < 4; ++rep) {
    const double s = run_once(isa, threads, iters);
    best = std::max(best, isa.flops_per_iter * static_cast<double>(iters) * threads / s / 1e9);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> threads = {1, 2};
  double seconds = 0.3;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json") {
      json = true;
    } else if (a == "--threads" && i + 1 < argc) {
      threads.clear();
      std::string s = argv[++i];
      size_t p = 0;
      while (p < s.size()) {
        size_t q = s.find(',', p);
        if (q == std::string::npos) q = s.size();
        threads.push_back(std::max(1, std::atoi(s.substr(p, q - p).c_str())));
        p = q + 1;
      }
    } else if (a == "--seconds" && i + 1 < argc) {
      seconds = std::atof(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: fma_peak [--threads 1,2] [--seconds 0.3] [--json]\n");
      return 2;
    }
  }
  __builtin_cpu_init();
  const Isa isas[] = {
      {"avx512", chains_avx512, 2.0 * 16 * 16, static_cast<bool>(__builtin_cpu_supports("avx512f"))},
      {"avx2", chains_avx2, 2.0 * 8 * 12,
       __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")},
  };
  std::string out = "{";
  bool first_isa = true;
  for (const Isa& isa : isas) {
    if (!isa.ok) continue;
    if (!json) std::printf("%-7s", isa.name);
    out += std::string(first_isa ? "" : ", ") + "\"" + isa.name + "\": {";
    first_isa = false;
    bool first = true;
    for (int t : threads) {
      const double g = measure(isa, t, seconds);
      if (!json) std::printf("  %d thread%s %8.1f GFLOP/s", t, t == 1 ? " " : "s", g);
      char buf[64];
      std::snprintf(buf, sizeof buf, "%s\"%d\": %.2f", first ? "" : ", ", t, g);
      out += buf;
      first = false;
    }
    out += "}";
    if (!json) std::printf("\n");
  }
  out += "}";
  if (json) std::printf("%s\n", out.c_str());
  return g_sink.load() == 12345.0f ? 1 : 0;  // never true; keeps the results observable
}

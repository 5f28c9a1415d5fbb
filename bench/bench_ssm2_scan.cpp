// Microbenchmark of Mamba-2's scan, the recurrent form (ops.h ssm2_scan) against the chunked
// ("SSD") form (ssm2_scan_chunked) at several chunk lengths, on mamba2-130m's layer shape by
// default (24 heads of 64 channels, 128 states, one B/C group), heads split over the threads as
// models/ssm2_block.cpp splits them, inputs strided as the block hands them over. For each
// token count n (one sequence's step): microseconds per call (median of the repetitions) and
// the chunked form's speed-up; the state starts nonzero and carries over repetitions.
// Usage: bench_ssm2_scan [--threads 2] [--heads 24] [--head-dim 64] [--state 128] [--groups 1]
//                        [--tokens 1,2,4,8,16,32,64,128,512] [--chunks 32,64,128] [--reps 15]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "ops/ops.h"

using namespace tern;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::vector<int64_t> parse_list(const char* s) {
  std::vector<int64_t> v;
  for (const char* p = s; *p;) {
    v.push_back(std::strtoll(p, const_cast<char**>(&p), 10));
    if (*p == ',') ++p;
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2;
  int64_t H = 24, P = 64, S = 128, G = 1, reps = 15;
  std::vector<int64_t> tokens = {1, 2, 4, 8, 16, 32, 64, 128, 512}, chunks = {32, 64, 128};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--threads") threads = std::atoi(argv[i + 1]);
    else if (k == "--heads") H = std::atoll(argv[i + 1]);
    else if (k == "--head-dim") P = std::atoll(argv[i + 1]);
    else if (k == "--state") S = std::atoll(argv[i + 1]);
    else if (k == "--groups") G = std::atoll(argv[i + 1]);
    else if (k == "--tokens") tokens = parse_list(argv[i + 1]);
    else if (k == "--chunks") chunks = parse_list(argv[i + 1]);
    else if (k == "--reps") reps = std::atoll(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  const int64_t DI = H * P, CC = DI + 2 * G * S, NIN = DI + CC + H;
  const int64_t n_max = *std::max_element(tokens.begin(), tokens.end());
  std::mt19937 rng(1);
  std::normal_distribution<float> g(0.0f, 1.0f);
  auto zeros = [](int64_t n) { return std::vector<float>(static_cast<size_t>(n)); };
  std::vector<float> xbc = zeros(n_max * CC), proj = zeros(n_max * NIN), dt = zeros(n_max * H), a = zeros(H),
                     d = zeros(H), y = zeros(n_max * DI), h = zeros(DI * S);
  for (auto& v : xbc) v = g(rng);
  for (auto& v : proj) v = g(rng);
  for (auto& v : dt) v = g(rng) - 2.0f;
  for (int64_t i = 0; i < H; ++i) a[size_t(i)] = -float(i + 1) * 0.3f;
  for (auto& v : d) v = 1.0f;
  for (auto& v : h) v = 0.1f * g(rng);
  ThreadPool pool(threads);
  std::printf("ssm2 scan: %lld heads of %lld, %lld states, %lld groups, %d threads (%s)\n", (long long)H,
              (long long)P, (long long)S, (long long)G, threads, isa_name(selected_isa()));
  std::printf("| tokens | recurrent us/call |");
  for (int64_t c : chunks) std::printf(" chunked L=%lld us/call (speed-up) |", (long long)c);
  std::printf("\n|---|---|");
  for (size_t i = 0; i < chunks.size(); ++i) std::printf("---|");
  std::printf("\n");
  for (int64_t n : tokens) {
    const Ssm2ScanArgs args{xbc.data(), CC, dt.data(), H, xbc.data() + DI, xbc.data() + DI + G * S, CC, proj.data(),
                            NIN, a.data(), d.data(), h.data(), y.data(), DI, n, S, P, H / G};
    auto time = [&](int64_t chunk) {
      std::vector<double> ts;
      for (int64_t r = 0; r < reps + 2; ++r) {
        const double t0 = now_s();
        pool.parallel_for(H, [&](int64_t h0, int64_t h1, int) {
          if (chunk > 0) ssm2_scan_chunked(args, h0, h1, chunk);
          else ssm2_scan(args, h0, h1);
        });
        if (r >= 2) ts.push_back(now_s() - t0);  // two warm-up calls
      }
      std::nth_element(ts.begin(), ts.begin() + ts.size() / 2, ts.end());
      return ts[ts.size() / 2] * 1e6;
    };
    const double rec = time(0);
    std::printf("| %lld | %.1f |", (long long)n, rec);
    for (int64_t c : chunks) {
      const double t = time(c);
      std::printf(" %.1f (%.2fx) |", t, rec / t);
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  return 0;
}

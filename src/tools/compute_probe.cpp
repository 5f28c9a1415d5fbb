#include "tools/compute_probe.h"

#include <algorithm>
#include <atomic>
#include <chrono>

namespace tern {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Probe {
  const char* name;
  const char* instruction;
  float (*chains)(long iters, float seed);
  double ops_per_iter;  // per thread: chains x lanes x ops per lane
};

// The best of 3 passes of `iters` iterations on every thread, in 1e9 ops per second.
double time_probe(ThreadPool& pool, const Probe& p, long iters) {
  std::atomic<float> sink{0.0f};
  double best = 0;
  for (int pass = 0; pass < 3; ++pass) {
    const double t0 = now_s();
    pool.run([&](int ith, int) {
      const float r = p.chains(iters, float(ith + pass));
      float cur = sink.load();
      while (!sink.compare_exchange_weak(cur, cur + r)) {
      }
    });
    const double dt = now_s() - t0;
    if (dt > 0) best = std::max(best, p.ops_per_iter * double(iters) * pool.size() / dt / 1e9);
  }
  return best;
}

}  // namespace

std::vector<ComputePeak> measure_compute_peaks(ThreadPool& pool, double seconds) {
#if defined(__x86_64__) || defined(__i386__)
  const bool avx512 = __builtin_cpu_supports("avx512f");
  const bool fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const bool bf16 = avx512 && __builtin_cpu_supports("avx512bf16");
  const bool vnni512 = avx512 && __builtin_cpu_supports("avx512vnni");
  const bool avxvnni = __builtin_cpu_supports("avxvnni");
#else
  // The probes are x86 instruction chains: elsewhere each is reported as not measured.
  const bool avx512 = false, fma = false, bf16 = false, vnni512 = false, avxvnni = false;
#endif
  using namespace detail;
  std::vector<std::pair<ComputePeak, Probe>> probes;
  const auto add = [&](const char* name, bool have, const Probe& p, const char* missing) {
    ComputePeak c{name, have ? p.instruction : "", 0.0, have ? "" : missing};
    probes.push_back({c, p});
  };
  if (avx512) add("fp32_fma", true, {"fp32_fma", "vfmadd231ps zmm", fma_chains_avx512, 16.0 * 16 * 2}, "");
  else add("fp32_fma", fma, {"fp32_fma", "vfmadd231ps ymm", fma_chains_avx2, 12.0 * 8 * 2}, "this CPU has no FMA (AVX2 + FMA)");
  add("bf16_dot", bf16, {"bf16_dot", "vdpbf16ps zmm", bf16_chains_avx512, 16.0 * 16 * 4},
      "this CPU has no AVX512-BF16 (vdpbf16ps)");
  if (vnni512) add("int8_dot", true, {"int8_dot", "vpdpbusd zmm", vnni_chains_avx512, 16.0 * 16 * 8}, "");
  else if (avxvnni) add("int8_dot", true, {"int8_dot", "vpdpbusd ymm (AVX-VNNI)", vnni_chains_avxvnni, 12.0 * 8 * 8}, "");
  else add("int8_dot", fma, {"int8_dot", "vpmaddubsw + vpmaddwd + vpaddd ymm", maddubs_chains_avx2, 6.0 * 8 * 8},
           "this CPU has no AVX2");
  std::vector<ComputePeak> out;
  for (auto& [c, p] : probes) {
    if (c.missing.empty()) {
      // Calibrate the iterations to about `seconds` a pass on one thread's rate.
      long iters = 1 << 16;
      for (;;) {
        const double t0 = now_s();
        volatile float r = p.chains(iters, 1.0f);
        (void)r;
        const double dt = now_s() - t0;
        if (dt > seconds / 8 || iters > (1L << 40)) {
          iters = long(double(iters) * seconds / std::max(dt, 1e-9));
          break;
        }
        iters *= 4;
      }
      c.gops = time_probe(pool, p, std::max(iters, 1L << 16));
    }
    out.push_back(c);
  }
  return out;
}

}  // namespace tern

#pragma once
// Measured compute peaks of this CPU, the denominators of the prefill (compute) roofline, as
// the bandwidth probe is decode's: independent chains of one vector instruction on every
// thread of the pool, long enough to hide the instruction's latency on every pipe.
//   fp32 FMA   vfmadd (zmm with AVX-512, else ymm with FMA)          2 flops per lane
//   bf16 dot   vdpbf16ps zmm (AVX512-BF16)                           4 flops per 32-bit lane
//   int8 dot   vpdpbusd (zmm with AVX512-VNNI, ymm with AVX-VNNI),   8 ops per 32-bit lane
//              else AVX2's vpmaddubsw + vpmaddwd + vpaddd
// Each figure is the best of a few passes (GFLOP/s or GOP/s, 1e9 per second). A probe whose
// instruction this CPU lacks is reported as such, not measured.
#include <string>
#include <vector>

#include "core/thread_pool.h"

namespace tern {

struct ComputePeak {
  std::string name;         // "fp32_fma", "bf16_dot", "int8_dot"
  std::string instruction;  // what was timed, e.g. "vfmadd231ps zmm"
  double gops = 0;          // 0 when not measured
  std::string missing;      // non-empty: why not measured (the CPU lacks the instruction)
};

// All three probes on every thread of `pool`, about `seconds` each.
std::vector<ComputePeak> measure_compute_peaks(ThreadPool& pool, double seconds = 0.25);

namespace detail {
// The timed chains, one call = `iters` iterations of 16 independent instructions; the result
// depends on every chain (so none is optimised away). Defined in compute_probe_avx2.cpp /
// _avx512.cpp; callers check the CPU first.
float fma_chains_avx512(long iters, float seed);
float bf16_chains_avx512(long iters, float seed);
float vnni_chains_avx512(long iters, float seed);
float fma_chains_avx2(long iters, float seed);
float vnni_chains_avxvnni(long iters, float seed);
float maddubs_chains_avx2(long iters, float seed);
}  // namespace detail

}  // namespace tern

#pragma once
// Measured memory read bandwidth of this machine, the denominator of the decode roofline:
// decode streams every weight once per token, so tg_max = bandwidth / bytes read per token.
#include "core/thread_pool.h"

namespace tern {

// Reads a buffer much larger than the caches with every thread of the pool and returns the
// best of `reps` passes in GB/s (1e9 bytes/s).
double measure_read_bandwidth_gb_s(ThreadPool& pool, int reps = 5, size_t bytes = size_t(1) << 30);

}  // namespace tern

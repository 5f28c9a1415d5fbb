#pragma once
// Row-wise normalisation shared by ops/ (rms_norm over a batch) and kernels/ (the RMSNorm
// prologue of matmul_shared_input): one compiled copy, so both give the same bits.
#include <cstdint>

namespace tern {

// out = x / sqrt(mean(x^2) + eps) * weight over one row of n floats (out may be x).
// The sum of squares runs in index order in f32, and x is multiplied by the scale before the
// weight: callers that must agree bit for bit call this, never a copy of it.
void rms_norm_row(const float* x, const float* weight, float* out, int64_t n, float eps);

}  // namespace tern

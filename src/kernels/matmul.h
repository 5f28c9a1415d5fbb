#pragma once
// Matrix multiplication of a stored weight by f32 activations, the hot loop of every model.
//
//   W: [n_out rows][n_in] in `type` (ggml layout: a row is n_in contiguous elements)
//   x: [n_tokens][n_in]  f32, rows ldx floats apart
//   y: [n_tokens][n_out] f32, rows ldy floats apart       y[t][o] = sum_i W[o][i] * x[t][i]
//
// n_tokens == 1 is the decode GEMV; larger n_tokens is the prefill GEMM. The implementation
// (kernels/dispatch) picks the variant once per process from the CPU's features
// (TERN_FORCE_ISA=ref|avx2|avx512 overrides); every variant is tested against kernels/ref.
// Must be called from the thread that owns `pool`; work is split across the pool.
#include <cstdint>

#include "core/dtype.h"
#include "core/thread_pool.h"

namespace tern {

struct WeightView {
  DType type = DType::F32;
  int64_t n_in = 0;    // ne[0]
  int64_t n_out = 0;   // ne[1]
  const void* data = nullptr;
  int64_t row_bytes() const { return dtype_row_bytes(type, n_in); }
};

void matmul(const WeightView& w, const float* x, int64_t ldx, int64_t n_tokens, float* y,
            int64_t ldy, ThreadPool& pool);

// Reference implementation (dequantize a row, f32 dot products): the oracle for tests.
void matmul_ref(const WeightView& w, const float* x, int64_t ldx, int64_t n_tokens, float* y,
                int64_t ldy, ThreadPool& pool);

// Copies row `row` of w into dst[0..n_in) as f32 (embedding lookup).
void dequantize_row(const WeightView& w, int64_t row, float* dst);

// Name of the ISA variant in use ("ref", "avx2", "avx512").
const char* active_isa();

}  // namespace tern

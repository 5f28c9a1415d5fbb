#pragma once
// Activation quantizers of the x86 tables: f32 activations into the Q8_0Rows / Q8_KRows layouts
// (kernels/kernel_iface.h), a block at a time (q8_0_block, q8_k_block, which the AVX-512
// token-lane layouts reuse: lanes_avx512.cpp) or whole token rows (quantize_rows).
//
// Include only from *_avx2.cpp / *_avx512.cpp, and only where quantize_rows is used (it is not
// inline). Everything is in an unnamed namespace so each ISA's translation unit has its own copy
// (no ODR mixing of differently compiled code).
#include <cstdint>
#include <cstring>

#include "kernels/kernel_iface.h"
#include "kernels/x86/simd.h"
#include "quant/quant_traits.h"

namespace tern::kern {
namespace {

// --- activation quantizers, bit-identical to quantize_row_ref (ref/kernels_ref.cpp) --------
// Float -> int conversion rounds to nearest even (MXCSR default), as nearest_int does.

// One block of 32: q = 32 int8 in element order; returns d, stores -sum(q) in *nsum.
inline float q8_0_block(const float* xb, __m256i* q_out, int32_t* nsum) {
  __m256 v[4];
  for (int k = 0; k < 4; ++k) v[k] = _mm256_loadu_ps(xb + 8 * k);
  const __m256 m = _mm256_max_ps(_mm256_max_ps(abs256(v[0]), abs256(v[1])),
                                 _mm256_max_ps(abs256(v[2]), abs256(v[3])));
  const float amax = hmax256(m);
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const __m256 vid = _mm256_set1_ps(id);
  __m256i q[4];
  for (int k = 0; k < 4; ++k) q[k] = _mm256_cvtps_epi32(_mm256_mul_ps(v[k], vid));
  *q_out = pack_i32x4_to_i8(q[0], q[1], q[2], q[3]);
  *nsum = -hsum256_epi32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
  return d;
}

// One super-block of 256: qs[256], bsums[16] (sums of 16); returns d.
inline float q8_k_block(const float* xb, int8_t* qs, int16_t* bsums) {
  __m256 m = _mm256_setzero_ps();
  for (int k = 0; k < 32; ++k) m = _mm256_max_ps(m, abs256(_mm256_loadu_ps(xb + 8 * k)));
  const float amax = hmax256(m);
  if (amax == 0.0f) {
    std::memset(qs, 0, kQK_K);
    std::memset(bsums, 0, 32);
    return 0.0f;
  }
  // The sign of the grid comes from the first element of largest magnitude (the reference
  // scans in order and keeps the first).
  float max = 0.0f;
  const __m256 vamax = _mm256_set1_ps(amax);
  for (int k = 0; k < 32; ++k) {
    const int mask = _mm256_movemask_ps(_mm256_cmp_ps(abs256(_mm256_loadu_ps(xb + 8 * k)), vamax, _CMP_EQ_OQ));
    if (mask) {
      max = xb[8 * k + __builtin_ctz(unsigned(mask))];
      break;
    }
  }
  const float iscale = -127.0f / max;
  const __m256 vis = _mm256_set1_ps(iscale);
  for (int g = 0; g < 8; ++g) {  // 32 elements = two bsums groups
    __m256i q[4];
    for (int k = 0; k < 4; ++k) q[k] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + 32 * g + 8 * k), vis));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs + 32 * g), pack_i32x4_to_i8(q[0], q[1], q[2], q[3]));
    // |q| <= 127 by construction, so packing's saturation never clips and sums are exact.
    bsums[2 * g] = static_cast<int16_t>(hsum256_epi32(_mm256_add_epi32(q[0], q[1])));
    bsums[2 * g + 1] = static_cast<int16_t>(hsum256_epi32(_mm256_add_epi32(q[2], q[3])));
  }
  return 1 / iscale;
}

void quantize_q8_0_rows(const ActLayout& lay, const float* x, int64_t n_in, uint8_t* row) {
  auto* qs = reinterpret_cast<int8_t*>(row);
  auto* d = reinterpret_cast<float*>(row + lay.off_d);
  auto* nsum = reinterpret_cast<int32_t*>(row + lay.off_sum);
  for (int64_t b = 0; b < n_in / 32; ++b) {
    __m256i q;
    d[b] = q8_0_block(x + 32 * b, &q, &nsum[b]);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs + 32 * b), q);
  }
}

void quantize_q8_k_rows(const ActLayout& lay, const float* x, int64_t n_in, uint8_t* row) {
  auto* qs = reinterpret_cast<int8_t*>(row);
  auto* d = reinterpret_cast<float*>(row + lay.off_d);
  auto* bsums = reinterpret_cast<int16_t*>(row + lay.off_sum);
  for (int64_t b = 0; b < n_in / kQK_K; ++b)
    d[b] = q8_k_block(x + kQK_K * b, qs + kQK_K * b, bsums + 16 * b);
}

void quantize_rows(const ActLayout& lay, const float* x, int64_t ldx, int64_t n_in, int64_t t0,
                   int64_t t1, uint8_t* act) {
  for (int64_t t = t0; t < t1; ++t) {
    if (lay.kind == ActKind::Q8_0Rows)
      quantize_q8_0_rows(lay, x + t * ldx, n_in, act + t * lay.stride);
    else
      quantize_q8_k_rows(lay, x + t * ldx, n_in, act + t * lay.stride);
  }
}

}  // namespace
}  // namespace tern::kern

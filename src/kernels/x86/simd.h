#pragma once
// Small SIMD helpers of the x86 kernels (AVX2 and AVX-512 tables): horizontal sums and maxima of
// 256-bit vectors, f16 -> f32, int32 -> int8 packing; and <immintrin.h> itself, included once
// here for every x86 kernel header.
//
// Include only from *_avx2.cpp / *_avx512.cpp. Everything is in an unnamed namespace so each
// ISA's translation unit has its own copy (no ODR mixing of differently compiled code).
//
// GCC 12's AVX-512 headers build _mm512_undefined_*() as a self-initialised variable, which
// -Wuninitialized reports inside intrinsics such as _mm512_cvtph_ps; the diagnostic belongs to
// the header, so it is silenced for the header's lines only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstdint>

namespace tern::kern {
namespace {

inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline int32_t hsum256_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

inline float hmax256(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

inline float f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }

inline __m256 abs256(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }

// Four vectors of 8 int32 (elements 0..31 in order) -> 32 int8, saturating.
inline __m256i pack_i32x4_to_i8(__m256i a, __m256i b, __m256i c, __m256i d) {
  // packs work per 128-bit lane, leaving dword groups in the order 0 2 4 6 1 3 5 7.
  const __m256i ab = _mm256_packs_epi32(a, b);
  const __m256i cd = _mm256_packs_epi32(c, d);
  const __m256i abcd = _mm256_packs_epi16(ab, cd);
  return _mm256_permutevar8x32_epi32(abcd, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

}  // namespace
}  // namespace tern::kern

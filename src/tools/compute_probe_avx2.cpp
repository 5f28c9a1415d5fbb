// AVX2 / AVX-VNNI chains of the compute probe (compute_probe.h).
#include <immintrin.h>

#include "tools/compute_probe.h"

namespace tern::detail {

#define TERN_R16(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15)
#define TERN_R12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

static float hsum_ps(__m256 v) {
  alignas(32) float f[8];
  _mm256_store_ps(f, v);
  float r = 0;
  for (float x : f) r += x;
  return r;
}
static long hsum_epi32(__m256i v) {
  alignas(32) int32_t f[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(f), v);
  long r = 0;
  for (int32_t x : f) r += x;
  return r;
}

// 12 chains: 16 ymm registers hold them and the two operands.
float fma_chains_avx2(long iters, float seed) {
#define TERN_DECL(i) __m256 a##i = _mm256_set1_ps(seed + float(i));
  TERN_R12(TERN_DECL)
  const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
  for (long it = 0; it < iters; ++it) {
#define TERN_STEP(i) a##i = _mm256_fmadd_ps(a##i, m, c);
    TERN_R12(TERN_STEP)
  }
  float r = 0;
#define TERN_SUM(i) r += hsum_ps(a##i);
  TERN_R12(TERN_SUM)
  return r;
}

__attribute__((target("avxvnni"))) float vnni_chains_avxvnni(long iters, float seed) {
#define TERN_DECLI(i) __m256i a##i = _mm256_set1_epi32(int(seed) + i);
  TERN_R12(TERN_DECLI)
  const __m256i u = _mm256_set1_epi8(1), s = _mm256_set1_epi8(-1);
  for (long it = 0; it < iters; ++it) {
#define TERN_VN(i) a##i = _mm256_dpbusd_avx_epi32(a##i, u, s);
    TERN_R12(TERN_VN)
  }
  long r = 0;
#define TERN_SUMI(i) r += hsum_epi32(a##i);
  TERN_R12(TERN_SUMI)
  return float(r);
}

// Without VNNI an int8 dot of 4 pairs per 32-bit lane is three instructions (what the AVX2
// kernels run): u8 x s8 pairs to s16 (vpmaddubsw), pairs of s16 to s32 (vpmaddwd by ones),
// accumulate (vpaddd). 6 chains, each with an operand of its own that an empty asm statement
// "changes" every step, so the multiplies can be neither hoisted nor shared (14 registers).
float maddubs_chains_avx2(long iters, float seed) {
#define TERN_R6(X) X(0) X(1) X(2) X(3) X(4) X(5)
#define TERN_DECLJ(i) __m256i a##i = _mm256_set1_epi32(int(seed) + i); __m256i u##i = _mm256_set1_epi8(char(1 + i));
  TERN_R6(TERN_DECLJ)
  const __m256i s = _mm256_set1_epi8(-1), ones = _mm256_set1_epi16(1);
  for (long it = 0; it < iters; ++it) {
#define TERN_MD(i) __asm__ volatile("" : "+x"(u##i)); a##i = _mm256_add_epi32(a##i, _mm256_madd_epi16(_mm256_maddubs_epi16(u##i, s), ones));
    TERN_R6(TERN_MD)
  }
  long r = 0;
#define TERN_SUMJ(i) r += hsum_epi32(a##i);
  TERN_R6(TERN_SUMJ)
  return float(r);
}

}  // namespace tern::detail

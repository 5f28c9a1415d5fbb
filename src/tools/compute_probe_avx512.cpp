// AVX-512 chains of the compute probe (compute_probe.h).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include "tools/compute_probe.h"

namespace tern::detail {

#define TERN_R16(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15)

float fma_chains_avx512(long iters, float seed) {
#define TERN_DECL(i) __m512 a##i = _mm512_set1_ps(seed + float(i));
  TERN_R16(TERN_DECL)
  const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
  for (long it = 0; it < iters; ++it) {
#define TERN_STEP(i) a##i = _mm512_fmadd_ps(a##i, m, c);
    TERN_R16(TERN_STEP)
  }
  float r = 0;
#define TERN_SUM(i) r += _mm512_reduce_add_ps(a##i);
  TERN_R16(TERN_SUM)
  return r;
}

float bf16_chains_avx512(long iters, float seed) {
  TERN_R16(TERN_DECL)
  const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80);  // 1.0
  const __m512bh y = (__m512bh)_mm512_set1_epi16(0x0080);  // the smallest normal: sums stay finite
  for (long it = 0; it < iters; ++it) {
#define TERN_BF(i) a##i = _mm512_dpbf16_ps(a##i, x, y);
    TERN_R16(TERN_BF)
  }
  float r = 0;
  TERN_R16(TERN_SUM)
  return r;
}

float vnni_chains_avx512(long iters, float seed) {
#define TERN_DECLI(i) __m512i a##i = _mm512_set1_epi32(int(seed) + i);
  TERN_R16(TERN_DECLI)
  const __m512i u = _mm512_set1_epi8(1), s = _mm512_set1_epi8(-1);  // sums go down by 4 a step
  for (long it = 0; it < iters; ++it) {
#define TERN_VN(i) a##i = _mm512_dpbusd_epi32(a##i, u, s);
    TERN_R16(TERN_VN)
  }
  long r = 0;
#define TERN_SUMI(i) r += _mm512_reduce_add_epi32(a##i);
  TERN_R16(TERN_SUMI)
  return float(r);
}

}  // namespace tern::detail

// AVX2 row kernels of tern's integer formats (see tern_int.h for the maths). Compiled with
// -mavx2 -mfma -mf16c (file name); calls only intrinsics, its own static functions and the
// out-of-line tq_unpack_group. AVX2 has no u8 x s8 dot with 32-bit sums (VNNI), so the integer
// sums go through pmaddubsw with the operands' ranges kept inside its 16-bit pairs, then pmaddwd:
// exact, as in the other variants.
#include <immintrin.h>

#include <cstring>

#include "kernels/tern_int.h"
#include "quant/quant_tern.h"

namespace tern::kern {
namespace {

inline int32_t hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}
inline float hsum_ps(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// 8 lanes of 4 products each: sum_j w[j] * x[j] for 32 signed bytes w and x, |x| <= 127 (the
// sign trick: pmaddubsw(|w|, sign(x, w)), each 16-bit pair <= 2 * 128 * 127).
inline __m256i dot_s8s8(__m256i w, __m256i x) {
  const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
  return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}
// The same for unsigned q <= 15 (pairs <= 2 * 15 * 127: pmaddubsw's u8 x s8 directly).
inline __m256i dot_u4s8(__m256i q, __m256i x) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(q, x), _mm256_set1_epi16(1));
}
// And for unsigned q <= 255, in 16 bits (pmaddwd: products <= 255 * 127).
inline __m256i dot_u8s8(__m256i q, __m256i x) {
  const __m256i q_lo = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(q));
  const __m256i q_hi = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(q, 1));
  const __m256i x_lo = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(x));
  const __m256i x_hi = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(x, 1));
  return _mm256_add_epi32(_mm256_madd_epi16(q_lo, x_lo), _mm256_madd_epi16(q_hi, x_hi));
}

// TI8: sum_j w[j] * (xu[j] - 128); xu - 128 is the quantized activation (|q| <= 127; outlier
// columns hold 0), recovered by flipping the top bit.
template <int NT>
void i8_dots_nt(const int8_t* w, int64_t n_in, const uint8_t* xu, int64_t stride, int32_t* out) {
  const __m256i flip = _mm256_set1_epi8(char(0x80));
  __m256i acc[NT];
  for (int i = 0; i < NT; ++i) acc[i] = _mm256_setzero_si256();
  for (int64_t j = 0; j < n_in; j += 32) {  // rows are a multiple of 32
    const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + j));
    for (int i = 0; i < NT; ++i) {
      const __m256i x = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xu + i * stride + j)), flip);
      acc[i] = _mm256_add_epi32(acc[i], dot_s8s8(wv, x));
    }
  }
  for (int i = 0; i < NT; ++i) out[i] = hsum_epi32(acc[i]);
}

void i8_dots(const int8_t* w, int64_t n_in, const uint8_t* xu, int64_t stride, int64_t n_tok, int32_t* out) {
  for (int64_t t = 0; t < n_tok; t += 4) {
    const uint8_t* x = xu + t * stride;
    switch (n_tok - t >= 4 ? 4 : n_tok - t) {
      case 4: i8_dots_nt<4>(w, n_in, x, stride, out + t); break;
      case 3: i8_dots_nt<3>(w, n_in, x, stride, out + t); break;
      case 2: i8_dots_nt<2>(w, n_in, x, stride, out + t); break;
      default: i8_dots_nt<1>(w, n_in, x, stride, out + t); break;
    }
  }
}

// One TQ group's quants as G/32 vectors of 32 u8 values (element order).
template <int BITS, int G>
inline void decode_group(const uint8_t* qs, __m256i* q) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  if constexpr (BITS == 4) {
    // G = 64: byte j holds q[j] (low) and q[j + 32] (high); G = 128: q[j] and q[j + 64].
    for (int c = 0; c < G / 64; ++c) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * c));
      q[c] = _mm256_and_si256(v, low4);
      q[c + G / 64] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
    }
  } else if constexpr (BITS == 8) {
    for (int c = 0; c < G / 32; ++c) q[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * c));
  } else {  // 3 bits: the format's own unpacking (an out-of-line function)
    alignas(32) uint8_t buf[G];
    float d;
    int z;
    tq_unpack_group(TqFormat{BITS, G}, qs - 3, buf, &d, &z);
    for (int c = 0; c < G / 32; ++c) q[c] = _mm256_load_si256(reinterpret_cast<const __m256i*>(buf + 32 * c));
  }
}

template <int BITS, int G, int NT>
void tq_dots_nt(const uint8_t* w, int64_t n_in, const uint8_t* act, int64_t stride, int64_t off_dxv,
                int64_t off_xs, float* out) {
  constexpr int64_t kBlockBytes = 3 + BITS * G / 8;
  __m256 acc[NT];
  float corr[NT];
  for (int i = 0; i < NT; ++i) {
    acc[i] = _mm256_setzero_ps();
    corr[i] = 0.0f;
  }
  for (int64_t g = 0; g < n_in / G; ++g) {
    const uint8_t* blk = w + g * kBlockBytes;
    uint16_t dh;
    std::memcpy(&dh, blk, 2);
    const float d = _cvtsh_ss(dh);
    const float z = float(blk[2]);
    __m256i q[G / 32];
    decode_group<BITS, G>(blk + 3, q);
    const __m256 dv = _mm256_set1_ps(d);
    for (int i = 0; i < NT; ++i) {
      const uint8_t* a = act + i * stride;
      const float* dxv = reinterpret_cast<const float*>(a + off_dxv);
      const float* xs = reinterpret_cast<const float*>(a + off_xs) + g * G / 32;
      // Within the group: sum over its 32-blocks of d_x[b] * (q . q_x) per lane; d once at the end.
      __m256 grp = _mm256_setzero_ps();
      for (int c = 0; c < G / 32; ++c) {
        const int64_t b = g * G / 32 + c;  // 32-block index within the row
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 32 * b));
        const __m256i isum = BITS == 8 ? dot_u8s8(q[c], x) : dot_u4s8(q[c], x);
        grp = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(dxv[(b / 2) * 16 + (b % 2) * 8]), grp);
      }
      acc[i] = _mm256_fmadd_ps(dv, grp, acc[i]);
      float xsum = 0.0f;
      for (int c = 0; c < G / 32; ++c) xsum += xs[c];
      corr[i] += d * z * xsum;
    }
  }
  for (int i = 0; i < NT; ++i) out[i] = hsum_ps(acc[i]) - corr[i];
}

template <int BITS, int G>
void tq_dots_bg(const uint8_t* w, int64_t n_in, const uint8_t* act, int64_t stride, int64_t off_dxv, int64_t off_xs,
                int64_t n_tok, float* out) {
  for (int64_t t = 0; t < n_tok; t += 4) {
    const uint8_t* a = act + t * stride;
    switch (n_tok - t >= 4 ? 4 : n_tok - t) {
      case 4: tq_dots_nt<BITS, G, 4>(w, n_in, a, stride, off_dxv, off_xs, out + t); break;
      case 3: tq_dots_nt<BITS, G, 3>(w, n_in, a, stride, off_dxv, off_xs, out + t); break;
      case 2: tq_dots_nt<BITS, G, 2>(w, n_in, a, stride, off_dxv, off_xs, out + t); break;
      default: tq_dots_nt<BITS, G, 1>(w, n_in, a, stride, off_dxv, off_xs, out + t); break;
    }
  }
}

void tq_dots(const uint8_t* w, int bits, int group, int64_t n_in, const uint8_t* act, int64_t stride,
             int64_t off_dxv, int64_t off_xs, int64_t n_tok, float* out) {
  const bool g64 = group == 64;
  switch (bits) {
    case 4:
      (g64 ? tq_dots_bg<4, 64> : tq_dots_bg<4, 128>)(w, n_in, act, stride, off_dxv, off_xs, n_tok, out);
      break;
    case 3:
      (g64 ? tq_dots_bg<3, 64> : tq_dots_bg<3, 128>)(w, n_in, act, stride, off_dxv, off_xs, n_tok, out);
      break;
    default:
      (g64 ? tq_dots_bg<8, 64> : tq_dots_bg<8, 128>)(w, n_in, act, stride, off_dxv, off_xs, n_tok, out);
      break;
  }
}

}  // namespace

const TernIntRows& tern_int_rows_avx2() {
  static const TernIntRows t{i8_dots, tq_dots};
  return t;
}

}  // namespace tern::kern

// AVX2 row kernels of tern's integer formats (see tern_int.h for the maths). Compiled with
// -mavx2 -mfma -mf16c (file name); calls only intrinsics, its own static functions and the
// out-of-line tq_unpack_group. AVX2 has no u8 x s8 dot with 32-bit sums (VNNI), so the integer
// sums go through pmaddubsw with the operands' ranges kept inside its 16-bit pairs, then pmaddwd:
// exact, as in the other variants.
#include <immintrin.h>

#include <cstring>

#include "kernels/tern_int.h"
#include "kernels/tern_int_rows.h"
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
  by_four_tokens(n_tok, [&](auto nt, int64_t t) {
    i8_dots_nt<decltype(nt)::value>(w, n_in, xu + t * stride, stride, out + t);
  });
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
  by_four_tokens(n_tok, [&](auto nt, int64_t t) {
    tq_dots_nt<BITS, G, decltype(nt)::value>(w, n_in, act + t * stride, stride, off_dxv, off_xs, out + t);
  });
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

// ---- BiLLM -----------------------------------------------------------------------------------

// 32 plane bits (bit j of the little-endian word: column j) as 32 bytes, 0xFF where set: each
// 128-bit lane gathers its two source bytes eight times, then tests one bit per byte.
inline __m256i bits_to_bytes(uint32_t bits) {
  const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,  //
                                          2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i bit = _mm256_set1_epi64x(0x8040201008040201ll);
  const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32(int(bits)), spread);
  return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
}

// Sum of each 4 consecutive signed bytes (|v| <= 127) into 8 int32 lanes.
inline __m256i sum_s8(__m256i v) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), v), _mm256_set1_epi16(1));
}

inline float f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }

template <int G, int NT>
void billm_dots_nt(const uint8_t* w, int64_t n_in, const uint8_t* act, int64_t stride, int64_t off_dxv, float* out) {
  __m256 acc[NT];
  for (int i = 0; i < NT; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t g = 0; g < n_in / G; ++g) {
    const auto bw = billm_words<G, uint32_t>(w + g * kBillmBlockBytes<G>, f16_to_f32);
    __m256i neg[G / 32], sel[G / 32], sal[G / 32];
    for (int c = 0; c < G / 32; ++c) {
      neg[c] = bits_to_bytes(bw.sgn[c]);
      sel[c] = bits_to_bytes(bw.sel[c]);
      sal[c] = bits_to_bytes(bw.sal[c]);
    }
    const __m256 vc = _mm256_set1_ps(bw.a_c), ve = _mm256_set1_ps(bw.a_s - bw.a_c);
    const __m256 v1 = _mm256_set1_ps(bw.a_1), v2 = _mm256_set1_ps(bw.a_2);
    for (int i = 0; i < NT; ++i) {
      const uint8_t* a = act + i * stride;
      const float* dxv = reinterpret_cast<const float*>(a + off_dxv);
      __m256 pc = _mm256_setzero_ps(), pe = _mm256_setzero_ps(), p1 = _mm256_setzero_ps(), p2 = _mm256_setzero_ps();
      for (int c = 0; c < G / 32; ++c) {
        const int64_t b = g * G / 32 + c;
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 32 * b));
        const __m256 dx = _mm256_set1_ps(dxv[(b / 2) * 16 + (b % 2) * 8]);
        // s_j q_x[j]: negated where the sign bit is set ((x ^ m) - m; |q_x| <= 127).
        const __m256i sx = _mm256_sub_epi8(_mm256_xor_si256(x, neg[c]), neg[c]);
        const __m256i ns = _mm256_andnot_si256(sal[c], sx);
        pc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum_s8(ns)), dx, pc);
        pe = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum_s8(_mm256_and_si256(ns, sel[c]))), dx, pe);
        if (bw.any_salient) {  // most rows' blocks list some; the branch is per block, not per column
          const __m256i rx = _mm256_sub_epi8(_mm256_xor_si256(x, sel[c]), sel[c]);
          p1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum_s8(_mm256_and_si256(sx, sal[c]))), dx, p1);
          p2 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum_s8(_mm256_and_si256(rx, sal[c]))), dx, p2);
        }
      }
      acc[i] = _mm256_fmadd_ps(vc, pc, _mm256_fmadd_ps(ve, pe, acc[i]));
      acc[i] = _mm256_fmadd_ps(v1, p1, _mm256_fmadd_ps(v2, p2, acc[i]));
    }
  }
  for (int i = 0; i < NT; ++i) out[i] = hsum_ps(acc[i]);
}

}  // namespace

const TernIntRows& tern_int_rows_avx2() {
  static const TernIntRows t{i8_dots, tq_dots, billm_dots, tq_rows8_avx2, nullptr};
  return t;
}

}  // namespace tern::kern

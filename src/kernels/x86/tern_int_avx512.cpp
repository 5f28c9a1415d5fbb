// AVX-512 VNNI row kernels of tern's integer formats (see tern_int.h for the maths). Compiled
// with -mavx512f/bw/vl/vnni (file name); calls only intrinsics and its own static functions.
// GCC 12's AVX-512 headers trip -Wuninitialized on their own undefined-vector helpers
// (reduce_add, cvtepi32_ps); the warnings are about the headers, not this code.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstring>

#include "kernels/tern_int.h"
#include "kernels/tern_int_rows.h"

namespace tern::kern {
namespace {

// TI8: sum_j w[j] * (xu[j] - 128) = dot(xu, w) - 128 * sum(w). VNNI's vpdpbusd multiplies
// unsigned by signed bytes, hence activations shifted into u8 and the row sum (via a u8 vector
// of ones) subtracted once per row.
template <int NT>
void i8_dots_nt(const int8_t* w, int64_t n_in, const uint8_t* xu, int64_t stride, int32_t* out) {
  const __m512i ones = _mm512_set1_epi8(1);
  __m512i acc[NT];
  for (int i = 0; i < NT; ++i) acc[i] = _mm512_setzero_si512();
  __m512i rs = _mm512_setzero_si512();
  int64_t j = 0;
  for (; j + 64 <= n_in; j += 64) {
    const __m512i wv = _mm512_loadu_si512(w + j);
    rs = _mm512_dpbusd_epi32(rs, ones, wv);
    for (int i = 0; i < NT; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], _mm512_loadu_si512(xu + i * stride + j), wv);
  }
  if (j < n_in) {  // rows are a multiple of 32: one half vector left
    const __mmask64 m = 0xFFFFFFFFull;
    const __m512i wv = _mm512_maskz_loadu_epi8(m, w + j);
    rs = _mm512_dpbusd_epi32(rs, ones, wv);
    for (int i = 0; i < NT; ++i)
      acc[i] = _mm512_dpbusd_epi32(acc[i], _mm512_maskz_loadu_epi8(m, xu + i * stride + j), wv);
  }
  const int32_t row_sum = _mm512_reduce_add_epi32(rs);
  for (int i = 0; i < NT; ++i) out[i] = _mm512_reduce_add_epi32(acc[i]) - 128 * row_sum;
}

void i8_dots(const int8_t* w, int64_t n_in, const uint8_t* xu, int64_t stride, int64_t n_tok, int32_t* out) {
  by_four_tokens(n_tok, [&](auto nt, int64_t t) {
    i8_dots_nt<decltype(nt)::value>(w, n_in, xu + t * stride, stride, out + t);
  });
}

// Unpacks one TQ group into G/64 vectors of u8 values (element order).
template <int BITS, int G>
inline void decode_group(const uint8_t* qs, __m512i* q) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  if constexpr (BITS == 4 && G == 64) {
    // byte j: q[j] low, q[j + 32] high -> [q0..q31 | q32..q63]
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs));
    const __m256i lo = _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F));
    q[0] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
  } else if constexpr (BITS == 4 && G == 128) {
    // byte j: q[j] low, q[j + 64] high
    const __m512i v = _mm512_loadu_si512(qs);
    q[0] = _mm512_and_si512(v, low4);
    q[1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
  } else if constexpr (BITS == 8) {
    for (int c = 0; c < G / 64; ++c) q[c] = _mm512_loadu_si512(qs + 64 * c);
  } else {
    // 3 bits: each 8 values in 3 bytes (value i at bits 3i..3i+2); scalar unpack.
    alignas(64) uint8_t buf[G];
    for (int r = 0; r < G / 8; ++r) {
      const uint32_t word = uint32_t(qs[3 * r]) | uint32_t(qs[3 * r + 1]) << 8 | uint32_t(qs[3 * r + 2]) << 16;
      for (int i = 0; i < 8; ++i) buf[8 * r + i] = uint8_t((word >> (3 * i)) & 7);
    }
    for (int c = 0; c < G / 64; ++c) q[c] = _mm512_load_si512(buf + 64 * c);
  }
}

template <int BITS, int G, int NT>
void tq_dots_nt(const uint8_t* w, int64_t n_in, const uint8_t* act, int64_t stride, int64_t off_dxv,
                int64_t off_xs, float* out) {
  constexpr int64_t kBlockBytes = 3 + BITS * G / 8;
  __m512 acc[NT];
  float corr[NT];
  for (int i = 0; i < NT; ++i) {
    acc[i] = _mm512_setzero_ps();
    corr[i] = 0.0f;
  }
  for (int64_t g = 0; g < n_in / G; ++g) {
    const uint8_t* blk = w + g * kBlockBytes;
    uint16_t dh;
    std::memcpy(&dh, blk, 2);
    const float d = _cvtsh_ss(dh);
    const float z = float(blk[2]);
    __m512i q[G / 64];
    decode_group<BITS, G>(blk + 3, q);
    const __m512 dv = _mm512_set1_ps(d);
    for (int i = 0; i < NT; ++i) {
      const uint8_t* a = act + i * stride;
      const float* dxv = reinterpret_cast<const float*>(a + off_dxv) + (g * G / 64) * 16;
      const float* xs = reinterpret_cast<const float*>(a + off_xs) + g * G / 32;
      // Within the group: sum of d_x[b] * (q . q_x) per lane; the group scale d once at the end.
      __m512 grp = _mm512_mul_ps(
          _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), q[0], _mm512_loadu_si512(a + g * G))),
          _mm512_load_ps(dxv));
      for (int c = 1; c < G / 64; ++c) {
        const __m512i isum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[c], _mm512_loadu_si512(a + g * G + 64 * c));
        grp = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_load_ps(dxv + 16 * c), grp);
      }
      acc[i] = _mm512_fmadd_ps(dv, grp, acc[i]);
      float xsum = 0.0f;
      for (int b = 0; b < G / 32; ++b) xsum += xs[b];
      corr[i] += d * z * xsum;
    }
  }
  for (int i = 0; i < NT; ++i) out[i] = _mm512_reduce_add_ps(acc[i]) - corr[i];
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

inline float f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }

// 64 columns per step: the plane bits are AVX-512BW's byte masks directly (negate where the sign
// bit is set, keep where a flag is), and vpdpbusd with a u8 vector of ones sums each 32-block into
// lanes 0-7 / 8-15, the lanes dxv scales. Four sums (tern_int.h): non-salient, its sparse group,
// and the salient columns' two signs.
template <int G, int NT>
void billm_dots_nt(const uint8_t* w, int64_t n_in, const uint8_t* act, int64_t stride, int64_t off_dxv, float* out) {
  const __m512i ones = _mm512_set1_epi8(1);
  const __m512i zero = _mm512_setzero_si512();
  __m512 acc[NT];
  for (int i = 0; i < NT; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t g = 0; g < n_in / G; ++g) {
    const auto bw = billm_words<G, uint64_t>(w + g * kBillmBlockBytes<G>, f16_to_f32);
    __mmask64 neg[G / 64], sel[G / 64], sal[G / 64], ns[G / 64], nse[G / 64];
    for (int c = 0; c < G / 64; ++c) {
      neg[c] = _cvtu64_mask64(bw.sgn[c]);
      sel[c] = _cvtu64_mask64(bw.sel[c]);
      sal[c] = _cvtu64_mask64(bw.sal[c]);
      ns[c] = _cvtu64_mask64(~bw.sal[c]);
      nse[c] = _cvtu64_mask64(bw.sel[c] & ~bw.sal[c]);
    }
    const __m512 vc = _mm512_set1_ps(bw.a_c), ve = _mm512_set1_ps(bw.a_s - bw.a_c);
    const __m512 v1 = _mm512_set1_ps(bw.a_1), v2 = _mm512_set1_ps(bw.a_2);
    for (int i = 0; i < NT; ++i) {
      const uint8_t* a = act + i * stride;
      const float* dxv = reinterpret_cast<const float*>(a + off_dxv);
      __m512 pc = _mm512_setzero_ps(), pe = _mm512_setzero_ps(), p1 = _mm512_setzero_ps(), p2 = _mm512_setzero_ps();
      for (int c = 0; c < G / 64; ++c) {
        const __m512i x = _mm512_loadu_si512(a + g * G + 64 * c);
        const __m512 dx = _mm512_loadu_ps(dxv + (g * G / 64 + c) * 16);
        const __m512i sx = _mm512_mask_sub_epi8(x, neg[c], zero, x);
        pc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(zero, ones, _mm512_maskz_mov_epi8(ns[c], sx))), dx, pc);
        pe = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(zero, ones, _mm512_maskz_mov_epi8(nse[c], sx))), dx, pe);
        if (bw.any_salient) {
          const __m512i rx = _mm512_mask_sub_epi8(x, sel[c], zero, x);
          p1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(zero, ones, _mm512_maskz_mov_epi8(sal[c], sx))), dx, p1);
          p2 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(zero, ones, _mm512_maskz_mov_epi8(sal[c], rx))), dx, p2);
        }
      }
      acc[i] = _mm512_fmadd_ps(vc, pc, _mm512_fmadd_ps(ve, pe, acc[i]));
      acc[i] = _mm512_fmadd_ps(v1, p1, _mm512_fmadd_ps(v2, p2, acc[i]));
    }
  }
  for (int i = 0; i < NT; ++i) out[i] = _mm512_reduce_add_ps(acc[i]);
}

}  // namespace

const TernIntRows& tern_int_rows_avx512() {
  static const TernIntRows t{i8_dots, tq_dots, billm_dots, tq_rows16_avx512, i8_rows16_avx512};
  return t;
}

}  // namespace tern::kern

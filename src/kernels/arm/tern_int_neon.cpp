// ARM64 NEON row kernels of tern's integer formats (see tern_int.h for the maths), for all three
// ARM variants (baseline NEON: widening multiplies, exact integer sums as in every variant).
// Calls only intrinsics, its own static functions and the out-of-line tq_unpack_group.
#include <arm_neon.h>

#include <cstring>

#include "kernels/tern_int.h"
#include "kernels/tern_int_rows.h"
#include "quant/quant_tern.h"

namespace tern::kern {
namespace {

// acc + the products of 16 signed bytes (one of them |.| <= 127: each 16-bit product fits).
inline int32x4_t dot16_s8(int32x4_t acc, int8x16_t a, int8x16_t b) {
  acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b)));
  return vpadalq_s16(acc, vmull_high_s8(a, b));
}
// acc + the products of 16 unsigned bytes q (<= 255) and signed bytes x, in 16 then 32 bits.
inline int32x4_t dot16_u8s8(int32x4_t acc, uint8x16_t q, int8x16_t x) {
  const int16x8_t q_lo = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(q)));
  const int16x8_t q_hi = vreinterpretq_s16_u16(vmovl_high_u8(q));
  const int16x8_t x_lo = vmovl_s8(vget_low_s8(x)), x_hi = vmovl_high_s8(x);
  acc = vmlal_s16(acc, vget_low_s16(q_lo), vget_low_s16(x_lo));
  acc = vmlal_high_s16(acc, q_lo, x_lo);
  acc = vmlal_s16(acc, vget_low_s16(q_hi), vget_low_s16(x_hi));
  return vmlal_high_s16(acc, q_hi, x_hi);
}

// TI8: sum_j w[j] * (xu[j] - 128); xu - 128 (|q| <= 127, 0 in outlier columns) by flipping the
// top bit.
template <int NT>
void i8_dots_nt(const int8_t* w, int64_t n_in, const uint8_t* xu, int64_t stride, int32_t* out) {
  const uint8x16_t flip = vdupq_n_u8(0x80);
  int32x4_t acc[NT];
  for (int i = 0; i < NT; ++i) acc[i] = vdupq_n_s32(0);
  for (int64_t j = 0; j < n_in; j += 16) {  // rows are a multiple of 32
    const int8x16_t wv = vld1q_s8(w + j);
    for (int i = 0; i < NT; ++i)
      acc[i] = dot16_s8(acc[i], wv, vreinterpretq_s8_u8(veorq_u8(vld1q_u8(xu + i * stride + j), flip)));
  }
  for (int i = 0; i < NT; ++i) out[i] = vaddvq_s32(acc[i]);
}

void i8_dots(const int8_t* w, int64_t n_in, const uint8_t* xu, int64_t stride, int64_t n_tok, int32_t* out) {
  by_four_tokens(n_tok, [&](auto nt, int64_t t) {
    i8_dots_nt<decltype(nt)::value>(w, n_in, xu + t * stride, stride, out + t);
  });
}

// One TQ group's quants as G/16 vectors of 16 u8 values (element order).
template <int BITS, int G>
inline void decode_group(const uint8_t* qs, uint8x16_t* q) {
  if constexpr (BITS == 4) {
    // byte j holds q[j] (low nibble) and q[j + G / 2] (high)
    for (int c = 0; c < G / 32; ++c) {
      const uint8x16_t v = vld1q_u8(qs + 16 * c);
      q[c] = vandq_u8(v, vdupq_n_u8(0x0F));
      q[c + G / 32] = vshrq_n_u8(v, 4);
    }
  } else if constexpr (BITS == 8) {
    for (int c = 0; c < G / 16; ++c) q[c] = vld1q_u8(qs + 16 * c);
  } else {  // 3 bits: the format's own unpacking (an out-of-line function)
    uint8_t buf[G];
    float d;
    int z;
    tq_unpack_group(TqFormat{BITS, G}, qs - 3, buf, &d, &z);
    for (int c = 0; c < G / 16; ++c) q[c] = vld1q_u8(buf + 16 * c);
  }
}

template <int BITS, int G, int NT>
void tq_dots_nt(const uint8_t* w, int64_t n_in, const uint8_t* act, int64_t stride, int64_t off_dxv,
                int64_t off_xs, float* out) {
  constexpr int64_t kBlockBytes = 3 + BITS * G / 8;
  float32x4_t acc[NT];
  float corr[NT];
  for (int i = 0; i < NT; ++i) {
    acc[i] = vdupq_n_f32(0.0f);
    corr[i] = 0.0f;
  }
  for (int64_t g = 0; g < n_in / G; ++g) {
    const uint8_t* blk = w + g * kBlockBytes;
    __fp16 dh;
    std::memcpy(&dh, blk, 2);
    const float d = float(dh);
    const float z = float(blk[2]);
    uint8x16_t q[G / 16];
    decode_group<BITS, G>(blk + 3, q);
    for (int i = 0; i < NT; ++i) {
      const uint8_t* a = act + i * stride;
      const float* dxv = reinterpret_cast<const float*>(a + off_dxv);
      const float* xs = reinterpret_cast<const float*>(a + off_xs) + g * G / 32;
      // Within the group: sum over its 32-blocks of d_x[b] * (q . q_x) per lane; d once at the end.
      float32x4_t grp = vdupq_n_f32(0.0f);
      for (int c = 0; c < G / 32; ++c) {
        const int64_t b = g * G / 32 + c;  // 32-block index within the row
        const int8_t* x = reinterpret_cast<const int8_t*>(a) + 32 * b;
        int32x4_t isum = vdupq_n_s32(0);
        for (int h = 0; h < 2; ++h) {
          const int8x16_t xv = vld1q_s8(x + 16 * h);
          isum = BITS == 8 ? dot16_u8s8(isum, q[2 * c + h], xv) : dot16_s8(isum, vreinterpretq_s8_u8(q[2 * c + h]), xv);
        }
        grp = vfmaq_n_f32(grp, vcvtq_f32_s32(isum), dxv[(b / 2) * 16 + (b % 2) * 8]);
      }
      acc[i] = vfmaq_n_f32(acc[i], grp, d);
      float xsum = 0.0f;
      for (int c = 0; c < G / 32; ++c) xsum += xs[c];
      corr[i] += d * z * xsum;
    }
  }
  for (int i = 0; i < NT; ++i) out[i] = vaddvq_f32(acc[i]) - corr[i];
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

inline float f16_bits_to_f32(uint16_t h) {
  return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
}

// 16 plane bits (two bytes, column j at bit j % 8 of byte j / 8) as 16 bytes, 0xFF where set.
inline uint8x16_t bits_to_bytes(const uint8_t* p) {
  static const uint8_t kBit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
  return vtstq_u8(vcombine_u8(vdup_n_u8(p[0]), vdup_n_u8(p[1])), vld1q_u8(kBit));
}

// Four sums per 32 columns (tern_int.h): non-salient s q_x, its sparse group, and the salient
// columns' two signs; pairwise widening adds keep them exact.
template <int G, int NT>
void billm_dots_nt(const uint8_t* w, int64_t n_in, const uint8_t* act, int64_t stride, int64_t off_dxv, float* out) {
  float acc[NT];
  for (int i = 0; i < NT; ++i) acc[i] = 0.0f;
  for (int64_t g = 0; g < n_in / G; ++g) {
    const auto bw = billm_words<G, uint8_t>(w + g * kBillmBlockBytes<G>, f16_bits_to_f32);
    uint8x16_t neg[G / 16], sel[G / 16], sal[G / 16];
    for (int c = 0; c < G / 16; ++c) {
      neg[c] = bits_to_bytes(bw.sgn + 2 * c);
      sel[c] = bits_to_bytes(bw.sel + 2 * c);
      sal[c] = bits_to_bytes(bw.sal + 2 * c);
    }
    for (int i = 0; i < NT; ++i) {
      const uint8_t* a = act + i * stride;
      const auto* xq = reinterpret_cast<const int8_t*>(a) + g * G;
      const float* dxv = reinterpret_cast<const float*>(a + off_dxv);
      float pc = 0.0f, pe = 0.0f, p1 = 0.0f, p2 = 0.0f;
      for (int b = 0; b < G / 32; ++b) {
        int32x4_t ic = vdupq_n_s32(0), ie = vdupq_n_s32(0), is = vdupq_n_s32(0), ir = vdupq_n_s32(0);
        for (int c = 2 * b; c < 2 * b + 2; ++c) {
          const int8x16_t x = vld1q_s8(xq + 16 * c);
          const int8x16_t nx = vnegq_s8(x);  // |q_x| <= 127: no overflow
          const int8x16_t sx = vbslq_s8(neg[c], nx, x);
          const int8x16_t rx = vbslq_s8(sel[c], nx, x);
          const int8x16_t sal8 = vreinterpretq_s8_u8(sal[c]);
          const int8x16_t ns = vbicq_s8(sx, sal8);
          ic = vpadalq_s16(ic, vpaddlq_s8(ns));
          ie = vpadalq_s16(ie, vpaddlq_s8(vandq_s8(ns, vreinterpretq_s8_u8(sel[c]))));
          is = vpadalq_s16(is, vpaddlq_s8(vandq_s8(sx, sal8)));
          ir = vpadalq_s16(ir, vpaddlq_s8(vandq_s8(rx, sal8)));
        }
        const int64_t bi = g * G / 32 + b;
        const float dx = dxv[(bi / 2) * 16 + (bi % 2) * 8];
        pc += dx * float(vaddvq_s32(ic));
        pe += dx * float(vaddvq_s32(ie));
        p1 += dx * float(vaddvq_s32(is));
        p2 += dx * float(vaddvq_s32(ir));
      }
      acc[i] += bw.a_c * pc + (bw.a_s - bw.a_c) * pe + bw.a_1 * p1 + bw.a_2 * p2;
    }
  }
  for (int i = 0; i < NT; ++i) out[i] = acc[i];
}

}  // namespace

const TernIntRows& tern_int_rows_neon() {
  static const TernIntRows t{i8_dots, tq_dots, billm_dots, nullptr, nullptr};
  return t;
}

}  // namespace tern::kern

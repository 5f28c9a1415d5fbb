#pragma once
// The ARM64 kernel table, one body for three levels: matmul_neon.cpp (Armv8-A NEON, what every
// ARM64 CPU has), matmul_dotprod.cpp (+dotprod: sdot) and matmul_i8mm.cpp (+i8mm: smmla) define
// TERN_ARM_LEVEL 0 / 1 / 2, include this file and name the table. Each is compiled with its own
// -march; everything here has internal linkage (an anonymous namespace), so no function built
// for one level can be the copy another level's caller runs (the rule of kernel_iface.h), and
// none of it calls an inline function of a shared header.
//
// The arithmetic is the reference table's (kernels/ref), so every level gives its bits exactly
// (tests/kernels holds them to that):
//   float weights: acc = fma(w[o][k], x[t][k], acc) in k order, one chain per output;
//   quantized weights: exact integer sums per block or sub-block (in any lane order), then the
//   reference's float steps per (row, token), in its order and unfused (the ARM64 build compiles
//   with -ffp-contract=off, see CMakeLists.txt). A level changes how the integer sums are formed
//   (widening multiplies, sdot, smmla), never their value.
//
// Layouts: quantized weights as stored, one row after another (the Rows activation layouts of
// kernel_iface.h); float weights interleaved by 16 rows (matmul.h), the rows after the last whole
// group as stored.
#include <arm_neon.h>

#include <cstdint>
#include <cstring>

#include "kernels/kernel_iface.h"
#include "quant/quant_traits.h"

#ifndef TERN_ARM_LEVEL
#error "define TERN_ARM_LEVEL (0 NEON, 1 dotprod, 2 i8mm) before including neon_kernels.h"
#endif

namespace tern::kern {
namespace {

constexpr int64_t kRowTile = 4;  // output rows per tile (matmul_rows' bit-equality needs r0 % 4 == 0)

inline float half_to_f32(const uint8_t* p) {
  __fp16 h;
  std::memcpy(&h, p, 2);
  return float(h);
}

// acc + the products of a and b, summed into four lanes (which products go to which lane
// differs between levels; the total does not).
inline int32x4_t dot16(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if TERN_ARM_LEVEL >= 1
  return vdotq_s32(acc, a, b);
#else
  // Each int16 lane holds one product (|w| <= 128, |x| <= 127: no overflow), then pairs widen.
  acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b)));
  return vpadalq_s16(acc, vmull_high_s8(a, b));
#endif
}
inline int32x4_t dot32(int8x16_t w0, int8x16_t w1, int8x16_t x0, int8x16_t x1) {
  return dot16(dot16(vdupq_n_s32(0), w0, x0), w1, x1);
}

// [sum(a0), sum(a1), sum(a2), sum(a3)]
inline int32x4_t sum_each(int32x4_t a0, int32x4_t a1, int32x4_t a2, int32x4_t a3) {
  return vpaddq_s32(vpaddq_s32(a0, a1), vpaddq_s32(a2, a3));
}

#if TERN_ARM_LEVEL >= 2
// smmla multiplies a 2 x 8 block of int8 by an 8 x 2 one: with rows a, b as the left operand and
// tokens t0, t1 as the right one, its four lanes are [a.t0, a.t1, b.t0, b.t1]. The operands are
// 64-bit halves of two vectors side by side.
inline int8x16_t zip_lo64(int8x16_t p, int8x16_t q) {
  return vreinterpretq_s8_s64(vzip1q_s64(vreinterpretq_s64_s8(p), vreinterpretq_s64_s8(q)));
}
inline int8x16_t zip_hi64(int8x16_t p, int8x16_t q) {
  return vreinterpretq_s8_s64(vzip2q_s64(vreinterpretq_s64_s8(p), vreinterpretq_s64_s8(q)));
}
// A token pair's 16 activations (at t0 and t1), zipped for mm16.
struct XPair16 {
  int8x16_t lo, hi;
};
inline XPair16 x_pair16(const int8_t* t0, const int8_t* t1) {
  const int8x16_t a = vld1q_s8(t0), b = vld1q_s8(t1);
  return {zip_lo64(a, b), zip_hi64(a, b)};
}
// acc + [a.t0, a.t1, b.t0, b.t1] over 16 elements (a, b: two rows' quants).
inline int32x4_t mm16(int32x4_t acc, int8x16_t a, int8x16_t b, const XPair16& x) {
  return vmmlaq_s32(vmmlaq_s32(acc, zip_lo64(a, b), x.lo), zip_hi64(a, b), x.hi);
}
// Per-row factors for the lanes of an mm16 result.
inline int32x4_t pair_lanes(int32_t a, int32_t b) {
  const int32_t v[4] = {a, a, b, b};
  return vld1q_s32(v);
}
#endif

// Byte j of the result = `value` where bit j of `bits` (16 bits) is set, else 0.
constexpr uint8_t kBitOfByte[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
inline uint8x16_t bits_to_bytes(uint32_t bits16, uint8_t value) {
  const uint8x16_t spread = vcombine_u8(vdup_n_u8(uint8_t(bits16)), vdup_n_u8(uint8_t(bits16 >> 8)));
  return vandq_u8(vtstq_u8(spread, vld1q_u8(kBitOfByte)), vdupq_n_u8(value));
}

inline int8x16_t s8(uint8x16_t v) { return vreinterpretq_s8_u8(v); }

// One activation token row (the Rows layouts).
struct ActRow {
  const int8_t* qs;
  const float* d;
  const uint8_t* sums;  // nsum (int32 per 32) or bsums (int16 per 16)
};
inline ActRow act_row(const GemmArgs& a, int64_t t) {
  const uint8_t* row = a.act + t * a.act_layout.stride;
  return {reinterpret_cast<const int8_t*>(row), reinterpret_cast<const float*>(row + a.act_layout.off_d),
          row + a.act_layout.off_sum};
}
inline int32_t nsum_at(const ActRow& x, int64_t b) {
  int32_t v;
  std::memcpy(&v, x.sums + 4 * b, 4);
  return v;
}
inline int32_t bsum_at(const ActRow& x, int64_t j) {
  int16_t v;
  std::memcpy(&v, x.sums + 2 * j, 2);
  return v;
}

// --- blocks of 32: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, MXFP4 ---------------------------------------

// MXFP4's block scale 2^(e - 128) (quant_traits.h's e8m0_half, this translation unit's own copy).
inline float mxfp4_scale(uint8_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : uint32_t(e - 1) << 23;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// A block's 32 quants as stored (Q4: the nibble, Q5: nibble | fifth bit << 4; MXFP4: the E2M1
// value doubled that the nibble indexes, looked up with tbl), elements 0..15 in lo and 16..31 in hi.
template <DType kType>
inline void q32_quants(const uint8_t* blk, int8x16_t& lo, int8x16_t& hi) {
  if constexpr (kType == DType::Q8_0) {
    lo = vld1q_s8(reinterpret_cast<const int8_t*>(blk + 2));
    hi = vld1q_s8(reinterpret_cast<const int8_t*>(blk + 18));
  } else if constexpr (kType == DType::MXFP4) {
    const int8x16_t values = vld1q_s8(kMxfp4Values);
    const uint8x16_t v = vld1q_u8(blk + 1);
    lo = vqtbl1q_s8(values, vandq_u8(v, vdupq_n_u8(0x0F)));
    hi = vqtbl1q_s8(values, vshrq_n_u8(v, 4));
  } else {
    constexpr int64_t qs = kType == DType::Q4_0 ? 2 : kType == DType::Q4_1 ? 4 : kType == DType::Q5_0 ? 6 : 8;
    const uint8x16_t v = vld1q_u8(blk + qs);
    uint8x16_t l = vandq_u8(v, vdupq_n_u8(0x0F)), h = vshrq_n_u8(v, 4);
    if constexpr (kType == DType::Q5_0 || kType == DType::Q5_1) {
      uint32_t qh;
      std::memcpy(&qh, blk + (kType == DType::Q5_0 ? 2 : 4), 4);
      l = vorrq_u8(l, bits_to_bytes(qh & 0xFFFF, 0x10));
      h = vorrq_u8(h, bits_to_bytes(qh >> 16, 0x10));
    }
    lo = s8(l);
    hi = s8(h);
  }
}

template <DType kType>
constexpr int64_t q32_block_bytes() {
  return kType == DType::Q8_0    ? 34
         : kType == DType::MXFP4 ? 17
         : kType == DType::Q4_0  ? 18
         : kType == DType::Q4_1 ? 20
         : kType == DType::Q5_0 ? 22
                                : 24;
}

// Rows w[0..3] (a tile; rows past the range repeat the last one) times tokens x[0..T-1]:
// out[t][i] = row i . token t, as dot_q8_0 / dot_q4_0 / dot_q32x / dot_mxfp4 of kernels/ref.
template <DType kType, int T>
void q32_tile(const uint8_t* const w[kRowTile], int64_t nb, const ActRow x[T], float32x4_t out[T]) {
  constexpr bool kMin = kType == DType::Q4_1 || kType == DType::Q5_1;
  constexpr int32_t kOffset = kType == DType::Q4_0 ? 8 : kType == DType::Q5_0 ? 16 : 0;  // folded in through nsum
  constexpr int64_t kBytes = q32_block_bytes<kType>();
  float32x4_t s[T];
  for (int t = 0; t < T; ++t) s[t] = vdupq_n_f32(0.0f);
  for (int64_t b = 0; b < nb; ++b) {
    int8x16_t lo[kRowTile], hi[kRowTile];
    float d[kRowTile], m[kRowTile];
    for (int i = 0; i < kRowTile; ++i) {
      const uint8_t* blk = w[i] + b * kBytes;
      q32_quants<kType>(blk, lo[i], hi[i]);
      if constexpr (kType == DType::MXFP4) d[i] = mxfp4_scale(blk[0]);
      else d[i] = half_to_f32(blk);
      if constexpr (kMin) m[i] = half_to_f32(blk + 2);
    }
    const float32x4_t d4 = vld1q_f32(d);
    int32x4_t isum[T];
#if TERN_ARM_LEVEL >= 2
    if constexpr (T == 2) {  // lanes of pair[p]: rows 2p, 2p + 1 times tokens 0, 1
      const XPair16 xl = x_pair16(x[0].qs + 32 * b, x[1].qs + 32 * b);
      const XPair16 xh = x_pair16(x[0].qs + 32 * b + 16, x[1].qs + 32 * b + 16);
      int32x4_t pair[2];
      for (int p = 0; p < 2; ++p)
        pair[p] = mm16(mm16(vdupq_n_s32(0), lo[2 * p], lo[2 * p + 1], xl), hi[2 * p], hi[2 * p + 1], xh);
      isum[0] = vuzp1q_s32(pair[0], pair[1]);
      isum[1] = vuzp2q_s32(pair[0], pair[1]);
    } else
#endif
    {
      for (int t = 0; t < T; ++t) {
        const int8x16_t xl = vld1q_s8(x[t].qs + 32 * b), xh = vld1q_s8(x[t].qs + 32 * b + 16);
        isum[t] = sum_each(dot32(lo[0], hi[0], xl, xh), dot32(lo[1], hi[1], xl, xh), dot32(lo[2], hi[2], xl, xh),
                           dot32(lo[3], hi[3], xl, xh));
      }
    }
    for (int t = 0; t < T; ++t) {
      const float xd = x[t].d[b];
      const int32_t nsum = nsum_at(x[t], b);
      if constexpr (kOffset != 0) isum[t] = vaddq_s32(isum[t], vdupq_n_s32(kOffset * nsum));
      // s += float(isum) * (d * xd); Q4_1 / Q5_1: s -= float(nsum) * (m * xd)
      s[t] = vaddq_f32(s[t], vmulq_f32(vcvtq_f32_s32(isum[t]), vmulq_n_f32(d4, xd)));
      if constexpr (kMin) s[t] = vsubq_f32(s[t], vmulq_f32(vdupq_n_f32(float(nsum)), vmulq_n_f32(vld1q_f32(m), xd)));
    }
  }
  for (int t = 0; t < T; ++t) out[t] = s[t];
}

// The per-row integer sums of a tile, [row 0..3] per token: from the per-(token, row) lane
// accumulators, or at level i8mm with two tokens from the row-pair ones (which then hold it all).
template <int T>
inline void row_sums(const int32x4_t acc[T][kRowTile], const int32x4_t pair[2], int32x4_t out[T]) {
#if TERN_ARM_LEVEL >= 2
  if constexpr (T == 2) {
    out[0] = vuzp1q_s32(pair[0], pair[1]);
    out[1] = vuzp2q_s32(pair[0], pair[1]);
    return;
  }
#endif
  (void)pair;
  for (int t = 0; t < T; ++t) out[t] = sum_each(acc[t][0], acc[t][1], acc[t][2], acc[t][3]);
}

// Two sub-blocks of 16 (quants q0, q1 per row, scales sc0, sc1 per row; activations at element
// `at` and at + 16) into a tile's accumulators: acc per (token, row), or the row pairs' at level
// i8mm with two tokens.
template <int T>
inline void sub16_pairs(const int8x16_t q0[kRowTile], const int8x16_t q1[kRowTile], const int32_t sc0[kRowTile],
                        const int32_t sc1[kRowTile], const ActRow x[T], int64_t at, int32x4_t acc[T][kRowTile],
                        int32x4_t pair[2]) {
#if TERN_ARM_LEVEL >= 2
  if constexpr (T == 2) {
    const XPair16 xa = x_pair16(x[0].qs + at, x[1].qs + at), xb = x_pair16(x[0].qs + at + 16, x[1].qs + at + 16);
    for (int p = 0; p < 2; ++p) {
      const int32x4_t zero = vdupq_n_s32(0);
      pair[p] = vmlaq_s32(pair[p], mm16(zero, q0[2 * p], q0[2 * p + 1], xa), pair_lanes(sc0[2 * p], sc0[2 * p + 1]));
      pair[p] = vmlaq_s32(pair[p], mm16(zero, q1[2 * p], q1[2 * p + 1], xb), pair_lanes(sc1[2 * p], sc1[2 * p + 1]));
    }
    return;
  }
#endif
  (void)pair;
  for (int t = 0; t < T; ++t) {
    const int8x16_t x0 = vld1q_s8(x[t].qs + at), x1 = vld1q_s8(x[t].qs + at + 16);
    for (int i = 0; i < kRowTile; ++i) {
      acc[t][i] = vmlaq_n_s32(acc[t][i], dot16(vdupq_n_s32(0), q0[i], x0), sc0[i]);
      acc[t][i] = vmlaq_n_s32(acc[t][i], dot16(vdupq_n_s32(0), q1[i], x1), sc1[i]);
    }
  }
}

// --- Q4_K / Q5_K: 8 sub-blocks of 32 with 6-bit scales and mins -------------------------------

inline void q4_k_scales_mins(const uint8_t* s, uint8_t* sc, uint8_t* m) {  // quant_traits.h's packing
  for (int j = 0; j < 4; ++j) {
    sc[j] = s[j] & 63;
    m[j] = s[j + 4] & 63;
    sc[j + 4] = uint8_t((s[j + 8] & 0x0F) | (s[j] >> 6) << 4);
    m[j + 4] = uint8_t((s[j + 8] >> 4) | (s[j + 4] >> 6) << 4);
  }
}

// As dot_q4_k of kernels/ref (kQ5: Q5_K's fifth bit from qh).
template <bool kQ5, int T>
void q4_k_tile(const uint8_t* const w[kRowTile], int64_t nb, const ActRow x[T], float32x4_t out[T]) {
  constexpr int64_t kBytes = kQ5 ? int64_t(sizeof(BlockQ5_K)) : int64_t(sizeof(BlockQ4_K));
  constexpr int64_t kQs = kQ5 ? int64_t(offsetof(BlockQ5_K, qs)) : int64_t(offsetof(BlockQ4_K, qs));
  float32x4_t s[T];
  for (int t = 0; t < T; ++t) s[t] = vdupq_n_f32(0.0f);
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t sc[kRowTile][8], mn[kRowTile][8];
    float d[kRowTile], dmin[kRowTile];
    const uint8_t* qs[kRowTile];
    uint8x16_t h0[kRowTile], h1[kRowTile];
    for (int i = 0; i < kRowTile; ++i) {
      const uint8_t* blk = w[i] + b * kBytes;
      d[i] = half_to_f32(blk);
      dmin[i] = half_to_f32(blk + 2);
      q4_k_scales_mins(blk + 4, sc[i], mn[i]);
      qs[i] = blk + kQs;
      if constexpr (kQ5) {
        h0[i] = vld1q_u8(blk + offsetof(BlockQ5_K, qh));
        h1[i] = vld1q_u8(blk + offsetof(BlockQ5_K, qh) + 16);
      }
    }
    int32x4_t acc[T][kRowTile];  // per (token, row): sum_j sc_j dot_j, over lanes
    for (int t = 0; t < T; ++t)
      for (int i = 0; i < kRowTile; ++i) acc[t][i] = vdupq_n_s32(0);
    int32x4_t pair[2] = {vdupq_n_s32(0), vdupq_n_s32(0)};  // i8mm, two tokens: rows 2p, 2p + 1 x tokens
    for (int j = 0; j < 8; ++j) {
      int8x16_t q0[kRowTile], q1[kRowTile];
      for (int i = 0; i < kRowTile; ++i) {
        const uint8x16_t v0 = vld1q_u8(qs[i] + 32 * (j / 2)), v1 = vld1q_u8(qs[i] + 32 * (j / 2) + 16);
        uint8x16_t l0 = j % 2 ? vshrq_n_u8(v0, 4) : vandq_u8(v0, vdupq_n_u8(0x0F));
        uint8x16_t l1 = j % 2 ? vshrq_n_u8(v1, 4) : vandq_u8(v1, vdupq_n_u8(0x0F));
        if constexpr (kQ5) {
          const uint8x16_t bit = vdupq_n_u8(uint8_t(1u << j)), five = vdupq_n_u8(0x10);
          l0 = vorrq_u8(l0, vandq_u8(vtstq_u8(h0[i], bit), five));
          l1 = vorrq_u8(l1, vandq_u8(vtstq_u8(h1[i], bit), five));
        }
        q0[i] = s8(l0);
        q1[i] = s8(l1);
      }
#if TERN_ARM_LEVEL >= 2
      if constexpr (T == 2) {
        const XPair16 xl = x_pair16(x[0].qs + 256 * b + 32 * j, x[1].qs + 256 * b + 32 * j);
        const XPair16 xh = x_pair16(x[0].qs + 256 * b + 32 * j + 16, x[1].qs + 256 * b + 32 * j + 16);
        for (int p = 0; p < 2; ++p) {
          const int32x4_t mm = mm16(mm16(vdupq_n_s32(0), q0[2 * p], q0[2 * p + 1], xl), q1[2 * p], q1[2 * p + 1], xh);
          pair[p] = vmlaq_s32(pair[p], mm, pair_lanes(sc[2 * p][j], sc[2 * p + 1][j]));
        }
        continue;
      }
#endif
      for (int t = 0; t < T; ++t) {
        const int8x16_t x0 = vld1q_s8(x[t].qs + 256 * b + 32 * j), x1 = vld1q_s8(x[t].qs + 256 * b + 32 * j + 16);
        for (int i = 0; i < kRowTile; ++i) acc[t][i] = vmlaq_n_s32(acc[t][i], dot32(q0[i], q1[i], x0, x1), sc[i][j]);
      }
    }
    int32x4_t sums[T];
    row_sums<T>(acc, pair, sums);
    const float32x4_t d4 = vld1q_f32(d), dmin4 = vld1q_f32(dmin);
    for (int t = 0; t < T; ++t) {
      const int32x4_t sum_q = sums[t];
      int32_t sum_m[kRowTile];
      for (int i = 0; i < kRowTile; ++i) {
        sum_m[i] = 0;
        for (int j = 0; j < 8; ++j)
          sum_m[i] += mn[i][j] * (bsum_at(x[t], 16 * b + 2 * j) + bsum_at(x[t], 16 * b + 2 * j + 1));
      }
      // s += xd * (d * float(sum_q) - dmin * float(sum_m))
      const float32x4_t diff =
          vsubq_f32(vmulq_f32(d4, vcvtq_f32_s32(sum_q)), vmulq_f32(dmin4, vcvtq_f32_s32(vld1q_s32(sum_m))));
      s[t] = vaddq_f32(s[t], vmulq_n_f32(diff, x[t].d[b]));
    }
  }
  for (int t = 0; t < T; ++t) out[t] = s[t];
}

// --- Q6_K: 16 sub-blocks of 16, 6-bit quants, int8 scales --------------------------------------

// As dot_q6_k of kernels/ref: sum_j sc_j (dot_j - 32 bsum_j) = sum_j sc_j dot_j - 32 sum_j sc_j bsum_j.
template <int T>
void q6_k_tile(const uint8_t* const w[kRowTile], int64_t nb, const ActRow x[T], float32x4_t out[T]) {
  float32x4_t s[T];
  for (int t = 0; t < T; ++t) s[t] = vdupq_n_f32(0.0f);
  for (int64_t b = 0; b < nb; ++b) {
    const BlockQ6_K* blk[kRowTile];
    float d[kRowTile];
    for (int i = 0; i < kRowTile; ++i) {
      blk[i] = reinterpret_cast<const BlockQ6_K*>(w[i] + b * int64_t(sizeof(BlockQ6_K)));
      d[i] = half_to_f32(w[i] + b * int64_t(sizeof(BlockQ6_K)) + offsetof(BlockQ6_K, d));
    }
    int32x4_t acc[T][kRowTile];
    for (int t = 0; t < T; ++t)
      for (int i = 0; i < kRowTile; ++i) acc[t][i] = vdupq_n_s32(0);
    int32x4_t pair[2] = {vdupq_n_s32(0), vdupq_n_s32(0)};
    // Half h, group g: elements 128h + 32g + 0..31, sub-blocks 8h + 2g and 8h + 2g + 1. Group g's
    // low four bits are ql[l + 32 (g & 1)] (l = 0..31), its low nibble for g < 2, high nibble else;
    // its high two bits are bits 2g, 2g + 1 of qh[l].
    for (int h = 0; h < 2; ++h)
      for (int g = 0; g < 4; ++g) {
        int8x16_t q0[kRowTile], q1[kRowTile];
        for (int i = 0; i < kRowTile; ++i) {
          const uint8_t* ql = blk[i]->ql + 64 * h + 32 * (g & 1);
          const uint8_t* qh = blk[i]->qh + 32 * h;
          const uint8x16_t a0 = vld1q_u8(ql), a1 = vld1q_u8(ql + 16);
          const uint8x16_t n0 = g < 2 ? vandq_u8(a0, vdupq_n_u8(0x0F)) : vshrq_n_u8(a0, 4);
          const uint8x16_t n1 = g < 2 ? vandq_u8(a1, vdupq_n_u8(0x0F)) : vshrq_n_u8(a1, 4);
          const int8x16_t shift = vdupq_n_s8(int8_t(4 - 2 * g));  // bits 2g..2g+1 to bits 4..5
          const uint8x16_t three = vdupq_n_u8(0x30);
          const uint8x16_t b0 = vandq_u8(vshlq_u8(vld1q_u8(qh), shift), three);
          const uint8x16_t b1 = vandq_u8(vshlq_u8(vld1q_u8(qh + 16), shift), three);
          q0[i] = s8(vorrq_u8(n0, b0));
          q1[i] = s8(vorrq_u8(n1, b1));
        }
        const int j0 = 8 * h + 2 * g;
        int32_t sc0[kRowTile], sc1[kRowTile];
        for (int i = 0; i < kRowTile; ++i) {
          sc0[i] = blk[i]->scales[j0];
          sc1[i] = blk[i]->scales[j0 + 1];
        }
        sub16_pairs<T>(q0, q1, sc0, sc1, x, 256 * b + 16 * j0, acc, pair);
      }
    int32x4_t sums[T];
    row_sums<T>(acc, pair, sums);
    const float32x4_t d4 = vld1q_f32(d);
    for (int t = 0; t < T; ++t) {
      int32_t corr[kRowTile];
      for (int i = 0; i < kRowTile; ++i) {
        corr[i] = 0;
        for (int j = 0; j < 16; ++j) corr[i] += blk[i]->scales[j] * bsum_at(x[t], 16 * b + j);
        corr[i] *= 32;
      }
      const int32x4_t isum = vsubq_s32(sums[t], vld1q_s32(corr));
      // s += (d * xd) * float(isum)
      s[t] = vaddq_f32(s[t], vmulq_f32(vmulq_n_f32(d4, x[t].d[b]), vcvtq_f32_s32(isum)));
    }
  }
  for (int t = 0; t < T; ++t) out[t] = s[t];
}

// --- Q2_K / Q3_K: 16 sub-blocks of 16, 2-bit quants (+ the high bit of Q3_K) -------------------

inline void q3_k_scales16(const uint8_t* s, int32_t* sc) {  // quant_traits.h's q3_k_scales, minus 32
  for (int j = 0; j < 16; ++j) {
    const int low = j < 8 ? s[j] & 0x0F : s[j - 8] >> 4;
    const int high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    sc[j] = (low | high << 4) - 32;
  }
}

// As dot_q23_k of kernels/ref. Q2_K: d dx sum_j sc_j dot_j - dmin dx sum_j m_j bsum_j. Q3_K:
// d dx sum_j (sc_j - 32) (dot_j - 4 bsum_j), dot over q3 = q + 4h.
template <bool kQ3, int T>
void q23_k_tile(const uint8_t* const w[kRowTile], int64_t nb, const ActRow x[T], float32x4_t out[T]) {
  constexpr int64_t kBytes = kQ3 ? int64_t(sizeof(BlockQ3_K)) : int64_t(sizeof(BlockQ2_K));
  float32x4_t s[T];
  for (int t = 0; t < T; ++t) s[t] = vdupq_n_f32(0.0f);
  for (int64_t b = 0; b < nb; ++b) {
    int32_t sc[kRowTile][16], mn[kRowTile][16];
    float d[kRowTile], dmin[kRowTile];
    const uint8_t* qs[kRowTile];
    uint8x16_t hm0[kRowTile], hm1[kRowTile];
    for (int i = 0; i < kRowTile; ++i) {
      const uint8_t* blk = w[i] + b * kBytes;
      if constexpr (kQ3) {
        const auto* B = reinterpret_cast<const BlockQ3_K*>(blk);
        q3_k_scales16(B->scales, sc[i]);
        d[i] = half_to_f32(blk + offsetof(BlockQ3_K, d));
        qs[i] = B->qs;
        hm0[i] = vld1q_u8(B->hmask);
        hm1[i] = vld1q_u8(B->hmask + 16);
      } else {
        const auto* B = reinterpret_cast<const BlockQ2_K*>(blk);
        for (int j = 0; j < 16; ++j) {
          sc[i][j] = B->scales[j] & 0x0F;
          mn[i][j] = B->scales[j] >> 4;
        }
        d[i] = half_to_f32(blk + offsetof(BlockQ2_K, d));
        dmin[i] = half_to_f32(blk + offsetof(BlockQ2_K, dmin));
        qs[i] = B->qs;
      }
    }
    int32x4_t acc[T][kRowTile];
    for (int t = 0; t < T; ++t)
      for (int i = 0; i < kRowTile; ++i) acc[t][i] = vdupq_n_s32(0);
    int32x4_t pair[2] = {vdupq_n_s32(0), vdupq_n_s32(0)};
    for (int n = 0; n < 2; ++n)
      for (int g = 0; g < 4; ++g) {  // elements 128n + 32g + l: (qs[32n + l] >> 2g) & 3, sub-blocks 8n + 2g (+1)
        int8x16_t q0[kRowTile], q1[kRowTile];
        const int8x16_t shift = vdupq_n_s8(int8_t(-2 * g));
        for (int i = 0; i < kRowTile; ++i) {
          uint8x16_t a0 = vandq_u8(vshlq_u8(vld1q_u8(qs[i] + 32 * n), shift), vdupq_n_u8(3));
          uint8x16_t a1 = vandq_u8(vshlq_u8(vld1q_u8(qs[i] + 32 * n + 16), shift), vdupq_n_u8(3));
          if constexpr (kQ3) {
            const uint8x16_t bit = vdupq_n_u8(uint8_t(1u << (4 * n + g))), four = vdupq_n_u8(4);
            a0 = vorrq_u8(a0, vandq_u8(vtstq_u8(hm0[i], bit), four));
            a1 = vorrq_u8(a1, vandq_u8(vtstq_u8(hm1[i], bit), four));
          }
          q0[i] = s8(a0);
          q1[i] = s8(a1);
        }
        const int j0 = 8 * n + 2 * g;
        const int32_t sc0[kRowTile] = {sc[0][j0], sc[1][j0], sc[2][j0], sc[3][j0]};
        const int32_t sc1[kRowTile] = {sc[0][j0 + 1], sc[1][j0 + 1], sc[2][j0 + 1], sc[3][j0 + 1]};
        sub16_pairs<T>(q0, q1, sc0, sc1, x, 256 * b + 16 * j0, acc, pair);
      }
    int32x4_t sums[T];
    row_sums<T>(acc, pair, sums);
    const float32x4_t d4 = vld1q_f32(d);
    for (int t = 0; t < T; ++t) {
      int32_t side[kRowTile];  // Q2_K: sum_m; Q3_K: 4 sum_j sc_j bsum_j
      for (int i = 0; i < kRowTile; ++i) {
        side[i] = 0;
        for (int j = 0; j < 16; ++j) side[i] += (kQ3 ? sc[i][j] : mn[i][j]) * bsum_at(x[t], 16 * b + j);
        if constexpr (kQ3) side[i] *= 4;
      }
      const int32x4_t sum_q = sums[t];
      if constexpr (kQ3) {
        // s += (d * dx) * float(sum_q)
        s[t] = vaddq_f32(s[t], vmulq_f32(vmulq_n_f32(d4, x[t].d[b]), vcvtq_f32_s32(vsubq_s32(sum_q, vld1q_s32(side)))));
      } else {
        // s += xd * (d * float(sum_q) - dmin * float(sum_m))
        const float32x4_t diff = vsubq_f32(vmulq_f32(d4, vcvtq_f32_s32(sum_q)),
                                           vmulq_f32(vld1q_f32(dmin), vcvtq_f32_s32(vld1q_s32(side))));
        s[t] = vaddq_f32(s[t], vmulq_n_f32(diff, x[t].d[b]));
      }
    }
  }
  for (int t = 0; t < T; ++t) out[t] = s[t];
}

// --- TQ1_0 / TQ2_0: ternary super-blocks of 256 -----------------------------------------------

// A TQ1_0 byte's code n (quant_traits.h): q = byte 3^n mod 256 (a byte multiply), then
// (3q) >> 8, which is [q >= 86] + [q >= 171]; the compares give -1 each.
inline int8x16_t tq1_codes(uint8x16_t v, uint8x16_t pow3) {
  const uint8x16_t q = vmulq_u8(v, pow3);
  return s8(vsubq_u8(vsubq_u8(vdupq_n_u8(0), vcgeq_u8(q, vdupq_n_u8(86))), vcgeq_u8(q, vdupq_n_u8(171))));
}

// The codes (trit + 1) of a super-block in 16 vectors, vector k for elements 16k..16k+15.
// TQ1_0: qs[0..31]'s codes n (elements 32n + m), qs[32..47]'s (160 + 16n + m), then qh[0..3]
// four times over, repeat n at code n (240 + 4n + j). TQ2_0: Q2_K's 2-bit layout.
constexpr uint8_t kTq1QhPow3[16] = {1, 1, 1, 1, 3, 3, 3, 3, 9, 9, 9, 9, 27, 27, 27, 27};
template <bool kTq1>
inline void tq_codes(const uint8_t* blk, int8x16_t c[16]) {
  if constexpr (kTq1) {
    const uint8x16_t a0 = vld1q_u8(blk), a1 = vld1q_u8(blk + 16), a2 = vld1q_u8(blk + 32);
    for (int n = 0; n < 5; ++n) {
      const uint8x16_t p = vdupq_n_u8(kTq1Pow3[n]);
      c[2 * n] = tq1_codes(a0, p);
      c[2 * n + 1] = tq1_codes(a1, p);
      c[10 + n] = tq1_codes(a2, p);
    }
    uint32_t qh;
    std::memcpy(&qh, blk + offsetof(BlockTQ1_0, qh), 4);
    c[15] = tq1_codes(vreinterpretq_u8_u32(vdupq_n_u32(qh)), vld1q_u8(kTq1QhPow3));
  } else {
    for (int h = 0; h < 2; ++h) {
      const uint8x16_t a0 = vld1q_u8(blk + 32 * h), a1 = vld1q_u8(blk + 32 * h + 16);
      for (int l = 0; l < 4; ++l) {
        const int8x16_t shift = vdupq_n_s8(int8_t(-2 * l));
        c[8 * h + 2 * l] = s8(vandq_u8(vshlq_u8(a0, shift), vdupq_n_u8(3)));
        c[8 * h + 2 * l + 1] = s8(vandq_u8(vshlq_u8(a1, shift), vdupq_n_u8(3)));
      }
    }
  }
}

// As dot_tq1_0 / dot_tq2_0 of kernels/ref: sum code x - sum x (the block's bsums), exact, then
// s += float(isum) * (d * dx).
template <bool kTq1, int T>
void tq_tile(const uint8_t* const w[kRowTile], int64_t nb, const ActRow x[T], float32x4_t out[T]) {
  constexpr int64_t kBytes = kTq1 ? int64_t(sizeof(BlockTQ1_0)) : int64_t(sizeof(BlockTQ2_0));
  constexpr int64_t kD = kTq1 ? int64_t(offsetof(BlockTQ1_0, d)) : int64_t(offsetof(BlockTQ2_0, d));
  float32x4_t s[T];
  for (int t = 0; t < T; ++t) s[t] = vdupq_n_f32(0.0f);
  for (int64_t b = 0; b < nb; ++b) {
    int32x4_t acc[T][kRowTile];
    float d[kRowTile];
    for (int i = 0; i < kRowTile; ++i) {
      const uint8_t* blk = w[i] + b * kBytes;
      d[i] = half_to_f32(blk + kD);
      int8x16_t c[16];
      tq_codes<kTq1>(blk, c);
      for (int t = 0; t < T; ++t) {
        acc[t][i] = vdupq_n_s32(0);
        for (int k = 0; k < 16; ++k) acc[t][i] = dot16(acc[t][i], c[k], vld1q_s8(x[t].qs + 256 * b + 16 * k));
      }
    }
    const float32x4_t d4 = vld1q_f32(d);
    for (int t = 0; t < T; ++t) {
      int32_t sum_x = 0;
      for (int j = 0; j < 16; ++j) sum_x += bsum_at(x[t], 16 * b + j);
      const int32x4_t isum = vsubq_s32(sum_each(acc[t][0], acc[t][1], acc[t][2], acc[t][3]), vdupq_n_s32(sum_x));
      // s += (d * dx) * float(isum)
      s[t] = vaddq_f32(s[t], vmulq_f32(vmulq_n_f32(d4, x[t].d[b]), vcvtq_f32_s32(isum)));
    }
  }
  for (int t = 0; t < T; ++t) out[t] = s[t];
}

// --- the quantized driver: rows in tiles of 4, tokens in pairs ---------------------------------

// A tile function for T tokens (T = 1, 2: the arrays decay to the same pointer type).
using TileFn = void (*)(const uint8_t* const* w, int64_t nb, const ActRow* x, float32x4_t* out);

void quant_gemm(const GemmArgs& a, int64_t r0, int64_t r1, int64_t nb, TileFn tile1, TileFn tile2) {
  for (int64_t r = r0; r < r1; r += kRowTile) {
    const int64_t n_rows = r1 - r < kRowTile ? r1 - r : kRowTile;
    const uint8_t* w[kRowTile];
    for (int64_t i = 0; i < kRowTile; ++i) w[i] = a.w + (r + (i < n_rows ? i : n_rows - 1)) * a.row_bytes;
    for (int64_t t = 0; t < a.n_tokens;) {
      const int n_tok = a.n_tokens - t >= 2 ? 2 : 1;
      const ActRow x[2] = {act_row(a, t), act_row(a, n_tok == 2 ? t + 1 : t)};
      float32x4_t out[2];
      (n_tok == 2 ? tile2 : tile1)(w, nb, x, out);
      for (int k = 0; k < n_tok; ++k) {
        float lanes[kRowTile];
        vst1q_f32(lanes, out[k]);
        for (int64_t i = 0; i < n_rows; ++i) a.y[(t + k) * a.ldy + r + i] = lanes[i];
      }
      t += n_tok;
    }
  }
}

// --- float weights ----------------------------------------------------------------------------

// Element k of the 16 rows of an interleaved group (matmul.h) as four vectors of 4 rows.
template <DType kType, bool kPairs>
inline void group_weights(const uint8_t* group, int64_t k, float32x4_t wv[4]) {
  if constexpr (kType == DType::F32) {
    const float* p = reinterpret_cast<const float*>(group) + 16 * k;
    for (int v = 0; v < 4; ++v) wv[v] = vld1q_f32(p + 4 * v);
  } else if constexpr (kType == DType::F16) {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(group) + 16 * k;
    for (int v = 0; v < 4; ++v) wv[v] = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p + 4 * v)));
  } else if constexpr (kPairs) {  // BF16, n_in even: dword i of pair k / 2 = row i's 2p | 2p + 1 << 16
    const uint32_t* p = reinterpret_cast<const uint32_t*>(group) + 16 * (k / 2);
    for (int v = 0; v < 4; ++v) {
      const uint32x4_t u = vld1q_u32(p + 4 * v);
      wv[v] = vreinterpretq_f32_u32(k % 2 ? vandq_u32(u, vdupq_n_u32(0xFFFF0000u)) : vshlq_n_u32(u, 16));
    }
  } else {  // BF16, n_in odd: 16 halves per k
    const uint16_t* p = reinterpret_cast<const uint16_t*>(group) + 16 * k;
    for (int v = 0; v < 4; ++v) wv[v] = vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p + 4 * v), 16));
  }
}

// One interleaved group of 16 rows times tokens [t0, t0 + T): acc[t][v] lanes = rows 4v..4v+3.
template <DType kType, bool kPairs, int T>
void float_group_tile(const GemmArgs& a, const uint8_t* group, int64_t t0, float32x4_t acc[T][4]) {
  for (int t = 0; t < T; ++t)
    for (int v = 0; v < 4; ++v) acc[t][v] = vdupq_n_f32(0.0f);
  for (int64_t k = 0; k < a.n_in; ++k) {
    float32x4_t wv[4];
    group_weights<kType, kPairs>(group, k, wv);
    for (int t = 0; t < T; ++t) {
      const float32x4_t xk = vdupq_n_f32(a.x[(t0 + t) * a.ldx + k]);
      for (int v = 0; v < 4; ++v) acc[t][v] = vfmaq_f32(acc[t][v], wv[v], xk);
    }
  }
}

template <DType kType>
inline float float_element(const uint8_t* row, int64_t k) {
  if constexpr (kType == DType::F32) {
    float v;
    std::memcpy(&v, row + 4 * k, 4);
    return v;
  } else if constexpr (kType == DType::F16) {
    return half_to_f32(row + 2 * k);
  } else {
    uint16_t h;
    std::memcpy(&h, row + 2 * k, 2);
    const uint32_t u = uint32_t(h) << 16;
    float v;
    std::memcpy(&v, &u, 4);
    return v;
  }
}

template <DType kType, bool kPairs>
void float_gemm_typed(const GemmArgs& a, int64_t r0, int64_t r1) {
  const int64_t grouped = a.interleaved16 ? a.n_out / 16 * 16 : 0;
  for (int64_t g = r0 / 16 * 16; g < r1 && g < grouped; g += 16) {
    const uint8_t* group = a.w + g * a.row_bytes;
    const int64_t lo = r0 > g ? r0 - g : 0, hi = r1 - g < 16 ? r1 - g : 16;  // rows of the group in range
    for (int64_t t = 0; t < a.n_tokens;) {
      float32x4_t acc[4][4];
      const int64_t n_tok = a.n_tokens - t >= 4 ? 4 : a.n_tokens - t >= 2 ? 2 : 1;
      if (n_tok == 4) float_group_tile<kType, kPairs, 4>(a, group, t, acc);
      else if (n_tok == 2) float_group_tile<kType, kPairs, 2>(a, group, t, acc);
      else float_group_tile<kType, kPairs, 1>(a, group, t, acc);
      for (int64_t k = 0; k < n_tok; ++k) {
        float lanes[16];
        for (int v = 0; v < 4; ++v) vst1q_f32(lanes + 4 * v, acc[k][v]);
        for (int64_t i = lo; i < hi; ++i) a.y[(t + k) * a.ldy + g + i] = lanes[i];
      }
      t += n_tok;
    }
  }
  // Rows as stored (past the groups, or all rows of a weight that is not interleaved).
  for (int64_t r = r0 > grouped ? r0 : grouped; r < r1; ++r) {
    const uint8_t* row = a.w + r * a.row_bytes;
    for (int64_t t = 0; t < a.n_tokens; ++t) {
      const float* x = a.x + t * a.ldx;
      float s = 0.0f;
      for (int64_t k = 0; k < a.n_in; ++k) s = __builtin_fmaf(float_element<kType>(row, k), x[k], s);
      a.y[t * a.ldy + r] = s;
    }
  }
}

// --- the table's entries --------------------------------------------------------------------

// Every type the reference table has a kernel for (an out-of-line call into kernels_ref.cpp).
bool arm_has_kernel(DType t) { return table_ref().has_kernel(t); }

// The reference quantizer (an out-of-line function of kernels_ref.cpp): the activation rows
// are O(n_in) per token against the gemm's O(n_in n_out).
void arm_quantize(const ActLayout& lay, DType, const float* x, int64_t ldx, int64_t n_in, int64_t, int64_t t0,
                  int64_t t1, uint8_t* act) {
  for (int64_t t = t0; t < t1; ++t) quantize_row_ref(lay, x + t * ldx, n_in, act + t * lay.stride);
}

int64_t arm_scratch_bytes(DType, int64_t) { return 0; }

void arm_gemm(const GemmArgs& a, int64_t r0, int64_t r1, uint8_t*) {
  const int64_t nb32 = a.n_in / 32, nbk = a.n_in / kQK_K;
  switch (a.type) {
    case DType::F32: float_gemm_typed<DType::F32, false>(a, r0, r1); break;
    case DType::F16: float_gemm_typed<DType::F16, false>(a, r0, r1); break;
    case DType::BF16:
      if (a.n_in % 2 == 0) float_gemm_typed<DType::BF16, true>(a, r0, r1);
      else float_gemm_typed<DType::BF16, false>(a, r0, r1);
      break;
    case DType::Q8_0: quant_gemm(a, r0, r1, nb32, q32_tile<DType::Q8_0, 1>, q32_tile<DType::Q8_0, 2>); break;
    case DType::Q4_0: quant_gemm(a, r0, r1, nb32, q32_tile<DType::Q4_0, 1>, q32_tile<DType::Q4_0, 2>); break;
    case DType::Q4_1: quant_gemm(a, r0, r1, nb32, q32_tile<DType::Q4_1, 1>, q32_tile<DType::Q4_1, 2>); break;
    case DType::Q5_0: quant_gemm(a, r0, r1, nb32, q32_tile<DType::Q5_0, 1>, q32_tile<DType::Q5_0, 2>); break;
    case DType::Q5_1: quant_gemm(a, r0, r1, nb32, q32_tile<DType::Q5_1, 1>, q32_tile<DType::Q5_1, 2>); break;
    case DType::MXFP4: quant_gemm(a, r0, r1, nb32, q32_tile<DType::MXFP4, 1>, q32_tile<DType::MXFP4, 2>); break;
    case DType::Q2_K: quant_gemm(a, r0, r1, nbk, q23_k_tile<false, 1>, q23_k_tile<false, 2>); break;
    case DType::Q3_K: quant_gemm(a, r0, r1, nbk, q23_k_tile<true, 1>, q23_k_tile<true, 2>); break;
    case DType::Q4_K: quant_gemm(a, r0, r1, nbk, q4_k_tile<false, 1>, q4_k_tile<false, 2>); break;
    case DType::Q5_K: quant_gemm(a, r0, r1, nbk, q4_k_tile<true, 1>, q4_k_tile<true, 2>); break;
    case DType::Q6_K: quant_gemm(a, r0, r1, nbk, q6_k_tile<1>, q6_k_tile<2>); break;
    case DType::TQ1_0: quant_gemm(a, r0, r1, nbk, tq_tile<true, 1>, tq_tile<true, 2>); break;
    case DType::TQ2_0: quant_gemm(a, r0, r1, nbk, tq_tile<false, 1>, tq_tile<false, 2>); break;
    default: break;
  }
}

}  // namespace
}  // namespace tern::kern

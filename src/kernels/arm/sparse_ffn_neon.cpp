// ARM64 NEON row kernels of the sparse FFN, for all three ARM variants (baseline Armv8-A NEON:
// no sdot). See sparse_ffn.h for the arithmetic, which this file reproduces bit for bit (the
// reference is sparse_ffn.cpp). Calls only intrinsics, builtins and its own static functions
// (kernel_iface.h's rule); the FMAs are explicit (vfmaq_f32, __builtin_fmaf: fused, as
// std::fma), the separate multiplies stay separate (the ARM64 build has -ffp-contract=off).
//
// Dots: float rows in four 4-lane accumulators (p[0..4), p[4..8), p[8..12), p[12..16)),
// reduced (p[0..8) + p[8..16), then the halves, then the pairs, then the two lanes) as the
// reference's tree; the n % 16 tail by scalar fma. Q8_0 / Q4_0 rows four blocks at a time: each
// block's products by widening multiplies (vmull_s8, |w x| <= 128 * 127 fits int16) added in
// pairs into int32 lanes (exact, any order), the 4 blocks' sums gathered into one vector,
// scaled by d_w * d_x (a separate multiply) and fused into p[b % 8] (lanes 0-3 or 4-7).
// Axpy: 4 rows per pass over y's slice, each element updated by the rows' FMAs in index order.
#include <arm_neon.h>

#include <cstdint>
#include <cstring>

#include "kernels/sparse_ffn.h"

namespace tern::kern {
namespace {

constexpr int64_t kQ8Bytes = 34, kQ4Bytes = 18;  // BlockQ8_0, BlockQ4_0: fp16 d, then the quants

inline float half_at(const uint8_t* p) {
  __fp16 h;
  std::memcpy(&h, p, 2);
  return float(h);
}

// ---- dots ------------------------------------------------------------------------------------

template <bool kF16>
inline float32x4_t load4(const uint8_t* w, int64_t i) {
  if constexpr (kF16) return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(reinterpret_cast<const uint16_t*>(w + 2 * i))));
  else return vld1q_f32(reinterpret_cast<const float*>(w + 4 * i));
}

template <bool kF16>
inline float load1(const uint8_t* w, int64_t i) {
  if constexpr (kF16) {
    return half_at(w + 2 * i);
  } else {
    float v;
    std::memcpy(&v, w + 4 * i, 4);
    return v;
  }
}

// The reference's tree8 on p[0..8) = lo (lanes 0-3), hi (lanes 4-7).
inline float tree8(float32x4_t lo, float32x4_t hi) {
  const float32x4_t s4 = vaddq_f32(lo, hi);                              // p[l] + p[l + 4]
  const float32x2_t s2 = vadd_f32(vget_low_f32(s4), vget_high_f32(s4));  // s4[l] + s4[l + 2]
  return vget_lane_f32(s2, 0) + vget_lane_f32(s2, 1);
}

template <bool kF16>
float dot_float_row(const uint8_t* w, int64_t n, const float* x) {
  float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0;  // p[0..4), [4..8), [8..12), [12..16)
  const int64_t n16 = n / 16 * 16;
  for (int64_t i = 0; i < n16; i += 16) {
    a0 = vfmaq_f32(a0, load4<kF16>(w, i), vld1q_f32(x + i));
    a1 = vfmaq_f32(a1, load4<kF16>(w, i + 4), vld1q_f32(x + i + 4));
    a2 = vfmaq_f32(a2, load4<kF16>(w, i + 8), vld1q_f32(x + i + 8));
    a3 = vfmaq_f32(a3, load4<kF16>(w, i + 12), vld1q_f32(x + i + 12));
  }
  float s = tree8(vaddq_f32(a0, a2), vaddq_f32(a1, a3));  // p[l] + p[l + 8], then tree8
  for (int64_t i = n16; i < n; ++i) s = __builtin_fmaf(load1<kF16>(w, i), x[i], s);
  return s;
}

// One block's products with its 32 activations in 4 int32 lanes whose sum is the block's
// integer dot (Q4_0: the unsigned nibbles, without the 8 * nsum term).
template <bool kQ4>
inline int32x4_t block_isum(const uint8_t* blk, const int8_t* xq) {
  int8x16_t lo, hi;  // elements 0-15, 16-31
  if constexpr (kQ4) {
    const uint8x16_t q = vld1q_u8(blk + 2);
    lo = vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0F)));
    hi = vreinterpretq_s8_u8(vshrq_n_u8(q, 4));
  } else {
    lo = vld1q_s8(reinterpret_cast<const int8_t*>(blk + 2));
    hi = vld1q_s8(reinterpret_cast<const int8_t*>(blk + 18));
  }
  const int8x16_t x0 = vld1q_s8(xq), x1 = vld1q_s8(xq + 16);
  int32x4_t acc = vpaddlq_s16(vmull_s8(vget_low_s8(lo), vget_low_s8(x0)));
  acc = vpadalq_s16(acc, vmull_high_s8(lo, x0));
  acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(hi), vget_low_s8(x1)));
  return vpadalq_s16(acc, vmull_high_s8(hi, x1));
}

// p (4 lanes: p[b0 % 8 .. + 4)) updated by blocks b0 .. b0 + nb - 1 (nb <= 4); lanes past nb
// keep their value untouched.
template <bool kQ4>
inline float32x4_t quant_group4(const uint8_t* w, int64_t b0, int nb, const int8_t* xq, const float* xd,
                                const int32_t* nsum, float32x4_t p) {
  constexpr int64_t kB = kQ4 ? kQ4Bytes : kQ8Bytes;
  int32x4_t v[4];
  uint16_t dh[4] = {0, 0, 0, 0};
  for (int j = 0; j < 4; ++j) {
    if (j < nb) {
      const uint8_t* blk = w + (b0 + j) * kB;
      v[j] = block_isum<kQ4>(blk, xq + 32 * (b0 + j));
      std::memcpy(&dh[j], blk, 2);
    } else {
      v[j] = vdupq_n_s32(0);
    }
  }
  int32x4_t isum = vpaddq_s32(vpaddq_s32(v[0], v[1]), vpaddq_s32(v[2], v[3]));  // lane j: block b0 + j
  const float32x4_t dw = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(dh)));
  if (nb == 4) {
    if constexpr (kQ4) isum = vaddq_s32(isum, vshlq_n_s32(vld1q_s32(nsum + b0), 3));
    return vfmaq_f32(p, vcvtq_f32_s32(isum), vmulq_f32(dw, vld1q_f32(xd + b0)));
  }
  float dx[4] = {0, 0, 0, 0};
  int32_t ns[4] = {0, 0, 0, 0};
  uint32_t keep[4] = {0, 0, 0, 0};
  for (int j = 0; j < nb; ++j) {
    dx[j] = xd[b0 + j];
    if constexpr (kQ4) ns[j] = nsum[b0 + j];
    keep[j] = 0xFFFFFFFFu;
  }
  if constexpr (kQ4) isum = vaddq_s32(isum, vshlq_n_s32(vld1q_s32(ns), 3));
  const float32x4_t upd = vfmaq_f32(p, vcvtq_f32_s32(isum), vmulq_f32(dw, vld1q_f32(dx)));
  return vbslq_f32(vld1q_u32(keep), upd, p);
}

template <bool kQ4>
float dot_quant_row(const uint8_t* w, int64_t n_in, const int8_t* xq, const float* xd, const int32_t* nsum) {
  const int64_t n_blocks = n_in / 32;
  float32x4_t lo = vdupq_n_f32(0.0f), hi = lo;  // p[0..4), p[4..8)
  for (int64_t b0 = 0; b0 < n_blocks; b0 += 8) {
    const int64_t left = n_blocks - b0;
    lo = quant_group4<kQ4>(w, b0, left < 4 ? int(left) : 4, xq, xd, nsum, lo);
    if (left > 4) hi = quant_group4<kQ4>(w, b0 + 4, left - 4 < 4 ? int(left - 4) : 4, xq, xd, nsum, hi);
  }
  return tree8(lo, hi);
}

void dot(const SparseDotArgs& a) {
  for (int64_t k = 0; k < a.n_idx; ++k) {
    const uint8_t* w = a.rows + int64_t(a.idx[k]) * a.row_bytes;
    if (k + 1 < a.n_idx) __builtin_prefetch(a.rows + int64_t(a.idx[k + 1]) * a.row_bytes);
    switch (a.type) {
      case DType::F32: a.out[k] = dot_float_row<false>(w, a.n_in, a.x); break;
      case DType::F16: a.out[k] = dot_float_row<true>(w, a.n_in, a.x); break;
      case DType::Q8_0: a.out[k] = dot_quant_row<false>(w, a.n_in, a.xq, a.xd, a.nsum); break;
      default: a.out[k] = dot_quant_row<true>(w, a.n_in, a.xq, a.xd, a.nsum); break;
    }
  }
}

// ---- axpy ------------------------------------------------------------------------------------

// y[c0, c1) += sum_r c[r] * w[r][c0, c1) for NR float rows, each element's FMAs in row order.
template <bool kF16, int NR>
void axpy_float_rows(const uint8_t* const* w, const float* c, int64_t c0, int64_t c1, float* y) {
  float32x4_t cv[NR];
  for (int r = 0; r < NR; ++r) cv[r] = vdupq_n_f32(c[r]);
  int64_t i = c0;
  for (; i + 16 <= c1; i += 16) {
    float32x4_t acc[4];
    for (int g = 0; g < 4; ++g) acc[g] = vld1q_f32(y + i + 4 * g);
    for (int r = 0; r < NR; ++r)
      for (int g = 0; g < 4; ++g) acc[g] = vfmaq_f32(acc[g], cv[r], load4<kF16>(w[r], i + 4 * g));
    for (int g = 0; g < 4; ++g) vst1q_f32(y + i + 4 * g, acc[g]);
  }
  for (; i + 4 <= c1; i += 4) {
    float32x4_t acc = vld1q_f32(y + i);
    for (int r = 0; r < NR; ++r) acc = vfmaq_f32(acc, cv[r], load4<kF16>(w[r], i));
    vst1q_f32(y + i, acc);
  }
  for (; i < c1; ++i) {
    float v = y[i];
    for (int r = 0; r < NR; ++r) v = __builtin_fmaf(c[r], load1<kF16>(w[r], i), v);
    y[i] = v;
  }
}

// The 32 quants of a block as 8 x 4 f32 (Q4_0: nibble - 8, elements 0-15 the low nibbles).
template <bool kQ4>
inline void block_values(const uint8_t* blk, float32x4_t q[8]) {
  int8x16_t lo, hi;  // elements 0-15, 16-31
  if constexpr (kQ4) {
    const uint8x16_t b = vld1q_u8(blk + 2);
    const int8x16_t eight = vdupq_n_s8(8);
    lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(b, vdupq_n_u8(0x0F))), eight);
    hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(b, 4)), eight);
  } else {
    lo = vld1q_s8(reinterpret_cast<const int8_t*>(blk + 2));
    hi = vld1q_s8(reinterpret_cast<const int8_t*>(blk + 18));
  }
  const int16x8_t h[4] = {vmovl_s8(vget_low_s8(lo)), vmovl_high_s8(lo), vmovl_s8(vget_low_s8(hi)),
                          vmovl_high_s8(hi)};
  for (int g = 0; g < 4; ++g) {
    q[2 * g] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(h[g])));
    q[2 * g + 1] = vcvtq_f32_s32(vmovl_high_s16(h[g]));
  }
}

// y[c0, c1) += sum_r c[r] * w[r][c0, c1) for NR quantized rows, a block of 32 elements at a
// time, each element's FMAs in row order; the scale of each (row, block) c[r] * d as the
// reference's (a separate multiply).
template <bool kQ4, int NR>
void axpy_quant_rows(const uint8_t* const* w, const float* c, int64_t c0, int64_t c1, float* y) {
  constexpr int64_t kB = kQ4 ? kQ4Bytes : kQ8Bytes;
  for (int64_t b = c0 / 32; b < c1 / 32; ++b) {
    float* yb = y + 32 * b;
    float32x4_t acc[8];
    for (int g = 0; g < 8; ++g) acc[g] = vld1q_f32(yb + 4 * g);
    for (int r = 0; r < NR; ++r) {
      const uint8_t* blk = w[r] + b * kB;
      const float32x4_t s = vdupq_n_f32(c[r] * half_at(blk));
      float32x4_t q[8];
      block_values<kQ4>(blk, q);
      for (int g = 0; g < 8; ++g) acc[g] = vfmaq_f32(acc[g], s, q[g]);
    }
    for (int g = 0; g < 8; ++g) vst1q_f32(yb + 4 * g, acc[g]);
  }
}

template <int NR>
void axpy_rows(DType t, const uint8_t* const* w, const float* c, int64_t c0, int64_t c1, float* y) {
  switch (t) {
    case DType::F32: axpy_float_rows<false, NR>(w, c, c0, c1, y); break;
    case DType::F16: axpy_float_rows<true, NR>(w, c, c0, c1, y); break;
    case DType::Q8_0: axpy_quant_rows<false, NR>(w, c, c0, c1, y); break;
    default: axpy_quant_rows<true, NR>(w, c, c0, c1, y); break;
  }
}

void axpy(const SparseAxpyArgs& a) {
  constexpr int kRows = 4;
  int64_t k = 0;
  for (; k + kRows <= a.n_idx; k += kRows) {
    const uint8_t* w[kRows];
    for (int r = 0; r < kRows; ++r) w[r] = a.rows + int64_t(a.idx[k + r]) * a.row_bytes;
    axpy_rows<kRows>(a.type, w, a.coef + k, a.c0, a.c1, a.y);
  }
  for (; k < a.n_idx; ++k) {
    const uint8_t* w = a.rows + int64_t(a.idx[k]) * a.row_bytes;
    axpy_rows<1>(a.type, &w, a.coef + k, a.c0, a.c1, a.y);
  }
}

}  // namespace

const SparseFfnRows& sparse_ffn_rows_neon() {
  static const SparseFfnRows t{dot, axpy};
  return t;
}

}  // namespace tern::kern

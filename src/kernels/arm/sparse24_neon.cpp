// ARM64 NEON row kernels of the 2:4 sparse formats (see sparse24.h for the maths and
// quant/quant_sparse.h for the blocks), for all three ARM variants (baseline NEON). Calls only
// intrinsics and its own static functions.
//
// Per block, the 16 columns c_k = 4 * (k / 2) + p_k come out of the idx word in one vector:
// the word broadcast to every 32-bit lane puts byte k % 4 in lane byte k, and NEON's per-byte
// shift (vshlq_u8 by -2 * (k / 4)) plus an AND leaves p_k. ts24_q8: vqtbl2q gathers the 16 kept
// activations out of the block's 32, widening multiplies give the exact integer sum. ts24_f16:
// vqtbl4q gathers 4 floats (16 bytes) out of a 16-float half per lookup.
#include <arm_neon.h>

#include <cstring>

#include "kernels/sparse24.h"

namespace tern::kern {
namespace {

constexpr int64_t kQ8Bytes = 22, kQ8Idx = 18, kF16Bytes = 36, kF16Idx = 32;

// c_k - 16 * (k / 8) with half = true (the column within its 16-column half), else c_k.
inline uint8x16_t columns(uint32_t idx, bool half) {
  const int8_t sh[16] = {0, 0, 0, 0, -2, -2, -2, -2, -4, -4, -4, -4, -6, -6, -6, -6};
  const uint8_t off[16] = {0, 0, 4, 4, 8, 8, 12, 12, 16, 16, 20, 20, 24, 24, 28, 28};
  const uint8_t off_half[16] = {0, 0, 4, 4, 8, 8, 12, 12, 0, 0, 4, 4, 8, 8, 12, 12};
  const uint8x16_t bytes = vreinterpretq_u8_u32(vdupq_n_u32(idx));
  const uint8x16_t p = vandq_u8(vshlq_u8(bytes, vld1q_s8(sh)), vdupq_n_u8(3));
  return vaddq_u8(p, vld1q_u8(half ? off_half : off));
}

struct Q8Block {
  int8x16_t w;
  uint8x16_t cols;
  float dw;
};

inline Q8Block prep_q8_block(const uint8_t* blk) {
  Q8Block b;
  uint32_t idx;
  std::memcpy(&idx, blk + kQ8Idx, 4);
  __fp16 dh;
  std::memcpy(&dh, blk, 2);
  b.dw = float(dh);
  b.w = vld1q_s8(reinterpret_cast<const int8_t*>(blk + 2));
  b.cols = columns(idx, false);
  return b;
}

// The block's integer sum with one token's 32 activations (u8, q + 128).
inline int32_t q8_block_isum(const Q8Block& b, const uint8_t* xu) {
  const uint8x16x2_t tbl = {{vld1q_u8(xu), vld1q_u8(xu + 16)}};
  const int8x16_t x = vreinterpretq_s8_u8(veorq_u8(vqtbl2q_u8(tbl, b.cols), vdupq_n_u8(0x80)));
  int32x4_t acc = vpaddlq_s16(vmull_s8(vget_low_s8(b.w), vget_low_s8(x)));
  acc = vpadalq_s16(acc, vmull_high_s8(b.w, x));
  return vaddvq_s32(acc);
}

void q8_dots(const uint8_t* w, int64_t n_in, const uint8_t* act, int64_t stride, int64_t off_dxv, int64_t n_tok,
             float* out, uint8_t* scratch) {
  const int64_t n_blocks = n_in / 32;
  // Prepared once per row and call (48 bytes per block) when more than one token reads it.
  auto* bs = reinterpret_cast<Q8Block*>(scratch);
  if (n_tok > 1)
    for (int64_t b = 0; b < n_blocks; ++b) bs[b] = prep_q8_block(w + b * kQ8Bytes);
  for (int64_t t = 0; t < n_tok; ++t) {
    const uint8_t* xu = act + t * stride;
    const auto* dxv = reinterpret_cast<const float*>(xu + off_dxv);
    float s = 0.0f;
    for (int64_t b = 0; b < n_blocks; ++b) {
      const Q8Block blk = n_tok > 1 ? bs[b] : prep_q8_block(w + b * kQ8Bytes);
      const float dx = dxv[(b / 4) * 16 + (b % 2) * 8 + (b / 2 % 2) * 2];
      s += blk.dw * dx * float(q8_block_isum(blk, xu + 32 * b));
    }
    out[t] = s;
  }
}

struct F16Block {
  float32x4_t v[4];  // values 4m..4m+3
  uint8x16_t sel[4]; // vqtbl4q byte controls for them: 4 * column-in-half + byte
};

inline F16Block prep_f16_block(const uint8_t* blk) {
  uint32_t idx;
  std::memcpy(&idx, blk + kF16Idx, 4);
  const uint8x16_t cols = columns(idx, true);
  const uint8_t bytes_of[16] = {0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3};
  F16Block b;
  for (int m = 0; m < 4; ++m) {
    b.v[m] = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(reinterpret_cast<const uint16_t*>(blk) + 4 * m)));
    const uint8_t spread[16] = {uint8_t(4 * m),     uint8_t(4 * m),     uint8_t(4 * m),     uint8_t(4 * m),
                                uint8_t(4 * m + 1), uint8_t(4 * m + 1), uint8_t(4 * m + 1), uint8_t(4 * m + 1),
                                uint8_t(4 * m + 2), uint8_t(4 * m + 2), uint8_t(4 * m + 2), uint8_t(4 * m + 2),
                                uint8_t(4 * m + 3), uint8_t(4 * m + 3), uint8_t(4 * m + 3), uint8_t(4 * m + 3)};
    const uint8x16_t c = vqtbl1q_u8(cols, vld1q_u8(spread));
    b.sel[m] = vaddq_u8(vshlq_n_u8(c, 2), vld1q_u8(bytes_of));
  }
  return b;
}

inline float32x4_t f16_block_dot(const F16Block& b, const float* x, float32x4_t acc) {
  const auto* xb = reinterpret_cast<const uint8_t*>(x);
  const uint8x16x4_t lo = {{vld1q_u8(xb), vld1q_u8(xb + 16), vld1q_u8(xb + 32), vld1q_u8(xb + 48)}};
  const uint8x16x4_t hi = {{vld1q_u8(xb + 64), vld1q_u8(xb + 80), vld1q_u8(xb + 96), vld1q_u8(xb + 112)}};
  for (int m = 0; m < 4; ++m) {
    const float32x4_t g = vreinterpretq_f32_u8(vqtbl4q_u8(m < 2 ? lo : hi, b.sel[m]));
    acc = vfmaq_f32(acc, b.v[m], g);
  }
  return acc;
}

void f16_dots(const uint8_t* w, int64_t n_in, const float* x, int64_t ldx, int64_t n_tok, float* out,
              uint8_t* scratch) {
  const int64_t n_blocks = n_in / 32;
  auto* bs = reinterpret_cast<F16Block*>(scratch);  // 128 bytes per block
  if (n_tok > 1)
    for (int64_t b = 0; b < n_blocks; ++b) bs[b] = prep_f16_block(w + b * kF16Bytes);
  for (int64_t t = 0; t < n_tok; ++t) {
    const float* xt = x + t * ldx;
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < n_blocks; ++b)
      acc = f16_block_dot(n_tok > 1 ? bs[b] : prep_f16_block(w + b * kF16Bytes), xt + 32 * b, acc);
    out[t] = vaddvq_f32(acc);
  }
}

}  // namespace

const Sparse24Rows& sparse24_rows_neon() {
  static const Sparse24Rows t{q8_dots, f16_dots};
  return t;
}

}  // namespace tern::kern

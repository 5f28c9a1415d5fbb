// Q8_0 and Q4_0: one f16 scale per 32 elements. The quantizers follow llama.cpp's reference
// round-to-nearest rules exactly (same float operations in the same order), so quantizing the
// same f32 input reproduces llama-quantize's blocks byte for byte (tests/quant checks it).
#include <cmath>

#include "core/fp16.h"
#include "quant/quant_codecs.h"
#include "quant/quant_traits.h"

namespace tern::codec {

void q8_0_to_float(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ8_0*>(src);
  for (int64_t ib = 0; ib < n / 32; ++ib) {
    const float d = fp16_to_f32(b[ib].d);
    for (int j = 0; j < 32; ++j) dst[ib * 32 + j] = b[ib].qs[j] * d;
  }
}

namespace {
// roundf(v) as an integer, for |v| < 2^31: truncate, then step away from zero when the part cut
// off is at least a half. v - t is exact (t is v without its fraction), so this is roundf bit
// for bit; it compiles inline (and vectorizes) where roundf is a library call, which the K/V
// cache pays on every token it stores.
inline int round_half_away(float v) {
  const int t = int(v);
  const float cut = v - float(t);
  return t + int(cut >= 0.5f) - int(cut <= -0.5f);
}
}  // namespace

// d = amax / 127 (kept in f32 for the division, stored as f16), q = roundf(x / d): ties away
// from zero, as llama.cpp's roundf. |x * id| <= 127 (plus rounding), inside round_half_away's
// range. amax skips NaNs as fmax does (a NaN compares false).
void q8_0_from_float(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ8_0*>(dst);
  for (int64_t ib = 0; ib < n / 32; ++ib) {
    const float* x = src + ib * 32;
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) {
      const float a = std::fabs(x[j]);
      amax = a > amax ? a : amax;
    }
    const float d = amax / 127.0f;
    const float id = d ? 1.0f / d : 0.0f;
    b[ib].d = f32_to_fp16(d);
    for (int j = 0; j < 32; ++j) b[ib].qs[j] = static_cast<int8_t>(round_half_away(x[j] * id));
  }
}

void q4_0_to_float(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ4_0*>(src);
  for (int64_t ib = 0; ib < n / 32; ++ib) {
    const float d = fp16_to_f32(b[ib].d);
    for (int j = 0; j < 16; ++j) {
      dst[ib * 32 + j] = (int(b[ib].qs[j] & 0x0F) - 8) * d;
      dst[ib * 32 + j + 16] = (int(b[ib].qs[j] >> 4) - 8) * d;
    }
  }
}

// The signed value of largest magnitude maps to -8 (d = max / -8), so the full range -8..7 is
// used with the sign chosen by the block; q = trunc(x / d + 8.5) clamped to 15, i.e. round half
// up after the +8 offset (llama.cpp converts through int8 and takes MIN(15, q)).
void q4_0_from_float(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ4_0*>(dst);
  for (int64_t ib = 0; ib < n / 32; ++ib) {
    const float* x = src + ib * 32;
    float amax;
    const float d = signed_absmax(x, 32, &amax) / -8.0f;
    const float id = d ? 1.0f / d : 0.0f;
    b[ib].d = f32_to_fp16(d);
    for (int j = 0; j < 16; ++j) {
      const int q0 = static_cast<int8_t>(x[j] * id + 8.5f);
      const int q1 = static_cast<int8_t>(x[j + 16] * id + 8.5f);
      const uint8_t lo = static_cast<uint8_t>(q0 < 15 ? q0 : 15);
      const uint8_t hi = static_cast<uint8_t>(q1 < 15 ? q1 : 15);
      b[ib].qs[j] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

}  // namespace tern::codec

// Q4_1, Q5_0 and Q5_1: llama.cpp's other 32-element formats. Q5_0 is what llama-quantize stores
// a Q4_K tensor as when its rows are not a multiple of 256 (Qwen2-0.5B's 896, for one), Q5_1 the
// same for Q5_K; so these are in files users download. As with Q8_0 / Q4_0, the dequantizers
// evaluate ggml's expressions in its order and the quantizers follow its reference rules
// operation for operation: tests/py/test_quant_llamacpp.py compares both, block for block,
// with llama.cpp's own functions.
#include <cstring>

#include "core/fp16.h"
#include "quant/quant_codecs.h"
#include "quant/quant_traits.h"

namespace tern::codec {
namespace {

// The block's minimum and maximum (the asymmetric formats' range).
void min_max(const float* x, float* lo, float* hi) {
  float mn = 3.402823466e+38f, mx = -3.402823466e+38f;
  for (int j = 0; j < 32; ++j) {
    if (x[j] < mn) mn = x[j];
    if (x[j] > mx) mx = x[j];
  }
  *lo = mn;
  *hi = mx;
}

uint32_t load_qh(const uint8_t* qh) {
  uint32_t v;
  std::memcpy(&v, qh, 4);
  return v;
}

}  // namespace

void q4_1_to_float(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ4_1*>(src);
  for (int64_t ib = 0; ib < n / 32; ++ib) {
    const float d = fp16_to_f32(b[ib].d), m = fp16_to_f32(b[ib].m);
    for (int j = 0; j < 16; ++j) {
      dst[ib * 32 + j] = float(b[ib].qs[j] & 0x0F) * d + m;
      dst[ib * 32 + j + 16] = float(b[ib].qs[j] >> 4) * d + m;
    }
  }
}

// d = (max - min) / 15, m = min; q = trunc((x - min) / d + 0.5) clamped to 15.
void q4_1_from_float(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ4_1*>(dst);
  for (int64_t ib = 0; ib < n / 32; ++ib) {
    const float* x = src + ib * 32;
    float mn, mx;
    min_max(x, &mn, &mx);
    const float d = (mx - mn) / 15.0f;
    const float id = d ? 1.0f / d : 0.0f;
    b[ib].d = f32_to_fp16(d);
    b[ib].m = f32_to_fp16(mn);
    for (int j = 0; j < 16; ++j) {
      const int q0 = static_cast<int8_t>((x[j] - mn) * id + 0.5f);
      const int q1 = static_cast<int8_t>((x[j + 16] - mn) * id + 0.5f);
      b[ib].qs[j] = static_cast<uint8_t>((q0 < 15 ? q0 : 15) | (q1 < 15 ? q1 : 15) << 4);
    }
  }
}

void q5_0_to_float(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ5_0*>(src);
  for (int64_t ib = 0; ib < n / 32; ++ib) {
    const float d = fp16_to_f32(b[ib].d);
    const uint32_t qh = load_qh(b[ib].qh);
    for (int j = 0; j < 16; ++j) {
      const int h0 = int((qh >> j) << 4 & 0x10), h1 = int(qh >> (j + 12) & 0x10);
      dst[ib * 32 + j] = float(((b[ib].qs[j] & 0x0F) | h0) - 16) * d;
      dst[ib * 32 + j + 16] = float(((b[ib].qs[j] >> 4) | h1) - 16) * d;
    }
  }
}

// As Q4_0 with 5 bits: d = max / -16, q = trunc(x / d + 16.5) clamped to 31.
void q5_0_from_float(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ5_0*>(dst);
  for (int64_t ib = 0; ib < n / 32; ++ib) {
    const float* x = src + ib * 32;
    float amax;
    const float d = signed_absmax(x, 32, &amax) / -16.0f;
    const float id = d ? 1.0f / d : 0.0f;
    b[ib].d = f32_to_fp16(d);
    uint32_t qh = 0;
    for (int j = 0; j < 16; ++j) {
      int q0 = static_cast<int8_t>(x[j] * id + 16.5f);
      int q1 = static_cast<int8_t>(x[j + 16] * id + 16.5f);
      q0 = q0 < 31 ? q0 : 31;
      q1 = q1 < 31 ? q1 : 31;
      b[ib].qs[j] = static_cast<uint8_t>((q0 & 0x0F) | (q1 & 0x0F) << 4);
      qh |= uint32_t(q0 & 0x10) >> 4 << j;
      qh |= uint32_t(q1 & 0x10) >> 4 << (j + 16);
    }
    std::memcpy(b[ib].qh, &qh, 4);
  }
}

void q5_1_to_float(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ5_1*>(src);
  for (int64_t ib = 0; ib < n / 32; ++ib) {
    const float d = fp16_to_f32(b[ib].d), m = fp16_to_f32(b[ib].m);
    const uint32_t qh = load_qh(b[ib].qh);
    for (int j = 0; j < 16; ++j) {
      const int h0 = int((qh >> j) << 4 & 0x10), h1 = int(qh >> (j + 12) & 0x10);
      dst[ib * 32 + j] = float((b[ib].qs[j] & 0x0F) | h0) * d + m;
      dst[ib * 32 + j + 16] = float((b[ib].qs[j] >> 4) | h1) * d + m;
    }
  }
}

// As Q4_1 with 5 bits: d = (max - min) / 31; q = trunc((x - min) / d + 0.5) (no clamp in
// llama.cpp's rule: the largest value lands on 31 within rounding).
void q5_1_from_float(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ5_1*>(dst);
  for (int64_t ib = 0; ib < n / 32; ++ib) {
    const float* x = src + ib * 32;
    float mn, mx;
    min_max(x, &mn, &mx);
    const float d = (mx - mn) / 31.0f;
    const float id = d ? 1.0f / d : 0.0f;
    b[ib].d = f32_to_fp16(d);
    b[ib].m = f32_to_fp16(mn);
    uint32_t qh = 0;
    for (int j = 0; j < 16; ++j) {
      const unsigned q0 = static_cast<uint8_t>((x[j] - mn) * id + 0.5f);
      const unsigned q1 = static_cast<uint8_t>((x[j + 16] - mn) * id + 0.5f);
      b[ib].qs[j] = static_cast<uint8_t>((q0 & 0x0F) | (q1 & 0x0F) << 4);
      qh |= (q0 & 0x10u) >> 4 << j;
      qh |= (q1 & 0x10u) >> 4 << (j + 16);
    }
    std::memcpy(b[ib].qh, &qh, 4);
  }
}

}  // namespace tern::codec

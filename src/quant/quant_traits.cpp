#include "quant/quant_traits.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/fp16.h"

namespace tern {
namespace {

void f32_to_float(const void* src, float* dst, int64_t n) { std::memcpy(dst, src, size_t(n) * 4); }
void f32_from_float(const float* src, void* dst, int64_t n) { std::memcpy(dst, src, size_t(n) * 4); }

void f16_to_float(const void* src, float* dst, int64_t n) {
  const auto* s = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_f32(s[i]);
}
void f16_from_float(const float* src, void* dst, int64_t n) {
  auto* d = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) d[i] = f32_to_fp16(src[i]);
}
void bf16_to_float(const void* src, float* dst, int64_t n) {
  const auto* s = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
}
void bf16_from_float(const float* src, void* dst, int64_t n) {
  auto* d = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
}

void q8_0_to_float(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ8_0*>(src);
  for (int64_t ib = 0; ib < n / 32; ++ib) {
    const float d = fp16_to_f32(b[ib].d);
    for (int j = 0; j < 32; ++j) dst[ib * 32 + j] = b[ib].qs[j] * d;
  }
}
void q8_0_from_float(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ8_0*>(dst);
  for (int64_t ib = 0; ib < n / 32; ++ib) {
    const float* x = src + ib * 32;
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::fmax(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d ? 1.0f / d : 0.0f;
    b[ib].d = f32_to_fp16(d);
    for (int j = 0; j < 32; ++j) b[ib].qs[j] = static_cast<int8_t>(std::roundf(x[j] * id));
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
void q4_0_from_float(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ4_0*>(dst);
  for (int64_t ib = 0; ib < n / 32; ++ib) {
    const float* x = src + ib * 32;
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; ++j)
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    const float d = max / -8.0f;
    const float id = d ? 1.0f / d : 0.0f;
    b[ib].d = f32_to_fp16(d);
    for (int j = 0; j < 16; ++j) {
      const float x0 = x[j] * id, x1 = x[j + 16] * id;
      const uint8_t q0 = static_cast<uint8_t>(std::fmin(15.0f, x0 + 8.5f));
      const uint8_t q1 = static_cast<uint8_t>(std::fmin(15.0f, x1 + 8.5f));
      b[ib].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

const QuantTraits kTraits[] = {
    {DType::F32, "f32", 1, 4, f32_to_float, f32_from_float, DType::F32},
    {DType::F16, "f16", 1, 2, f16_to_float, f16_from_float, DType::F32},
    {DType::BF16, "bf16", 1, 2, bf16_to_float, bf16_from_float, DType::F32},
    {DType::Q8_0, "q8_0", 32, 34, q8_0_to_float, q8_0_from_float, DType::Q8_0},
    {DType::Q4_0, "q4_0", 32, 18, q4_0_to_float, q4_0_from_float, DType::Q8_0},
};

}  // namespace

const QuantTraits* quant_traits(DType t) {
  for (const auto& q : kTraits)
    if (q.type == t) return &q;
  return nullptr;
}

const QuantTraits& require_quant_traits(DType t, const char* tensor_name) {
  const QuantTraits* q = quant_traits(t);
  if (!q) {
    const auto info = dtype_size(static_cast<uint32_t>(t));
    fail("unsupported tensor type ", info ? info->name : "?", " in tensor ", tensor_name);
  }
  return *q;
}

}  // namespace tern

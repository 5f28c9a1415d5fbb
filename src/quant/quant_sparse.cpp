#include "quant/quant_sparse.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/fp16.h"

namespace tern {
namespace {

void check_row(DType t, int64_t n, const char* what) {
  if (n <= 0 || n % kTs24Block != 0)
    fail(what, ": ", dtype_name(t), " rows must be a positive multiple of ", kTs24Block, " columns, got n_in = ", n);
}

}  // namespace

bool is_ts24(DType t) { return t == DType::TS24_Q8 || t == DType::TS24_F16; }

uint32_t ts24_pack_idx(const uint8_t* pos16) {
  uint32_t idx = 0;
  for (int k = 0; k < 16; ++k) idx |= uint32_t(pos16[k] & 3) << (8 * (k % 4) + 2 * (k / 4));
  return idx;
}

void ts24_select(const float* w4, int* c0, int* c1) {
  // The largest |w| first (strict > keeps the lower column on ties), then the largest of the rest.
  int a = 0;
  for (int j = 1; j < 4; ++j)
    if (std::fabs(w4[j]) > std::fabs(w4[a])) a = j;
  int b = a == 0 ? 1 : 0;
  for (int j = 0; j < 4; ++j)
    if (j != a && std::fabs(w4[j]) > std::fabs(w4[b])) b = j;
  *c0 = std::min(a, b);
  *c1 = std::max(a, b);
}

void ts24_encode_row(DType t, const float* w, int64_t n, uint8_t* dst, const char* what) {
  check_row(t, n, what);
  TERN_ASSERT(is_ts24(t));
  const bool q8 = t == DType::TS24_Q8;
  const int64_t bb = q8 ? kTs24Q8Bytes : kTs24F16Bytes;
  for (int64_t b = 0; b < n / kTs24Block; ++b) {
    const float* wb = w + b * kTs24Block;
    uint8_t* blk = dst + b * bb;
    float v[16];    // kept values, value order
    uint8_t p[16];  // their positions within the group
    for (int g = 0; g < 8; ++g) {
      int c0, c1;
      ts24_select(wb + 4 * g, &c0, &c1);
      v[2 * g] = wb[4 * g + c0];
      v[2 * g + 1] = wb[4 * g + c1];
      p[2 * g] = uint8_t(c0);
      p[2 * g + 1] = uint8_t(c1);
    }
    const uint32_t idx = ts24_pack_idx(p);
    if (q8) {
      float amax = 0.0f;
      for (float x : v) amax = std::max(amax, std::fabs(x));
      // The stored (f16) scale is the one the quantizer divides by, so d * q reproduces the
      // rounding it chose.
      const float d = fp16_to_f32(f32_to_fp16(amax / 127.0f));
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      const uint16_t dh = f32_to_fp16(d);
      std::memcpy(blk, &dh, 2);
      for (int k = 0; k < 16; ++k) blk[2 + k] = uint8_t(int8_t(std::clamp(int(std::lround(v[k] * id)), -127, 127)));
      std::memcpy(blk + kTs24Q8IdxOff, &idx, 4);
    } else {
      for (int k = 0; k < 16; ++k) {
        const uint16_t h = f32_to_fp16(v[k]);
        std::memcpy(blk + 2 * k, &h, 2);
      }
      std::memcpy(blk + kTs24F16IdxOff, &idx, 4);
    }
  }
}

void ts24_decode_row(DType t, const uint8_t* src, float* dst, int64_t n, const char* what) {
  check_row(t, n, what);
  TERN_ASSERT(is_ts24(t));
  const bool q8 = t == DType::TS24_Q8;
  const int64_t bb = q8 ? kTs24Q8Bytes : kTs24F16Bytes;
  std::fill(dst, dst + n, 0.0f);
  for (int64_t b = 0; b < n / kTs24Block; ++b) {
    const uint8_t* blk = src + b * bb;
    float* db = dst + b * kTs24Block;
    uint32_t idx;
    std::memcpy(&idx, blk + (q8 ? kTs24Q8IdxOff : kTs24F16IdxOff), 4);
    uint16_t dh;
    std::memcpy(&dh, blk, 2);
    const float d = fp16_to_f32(dh);
    for (int k = 0; k < 16; ++k) {
      float v;
      if (q8) {
        v = d * float(int8_t(blk[2 + k]));
      } else {
        uint16_t h;
        std::memcpy(&h, blk + 2 * k, 2);
        v = fp16_to_f32(h);
      }
      db[4 * (k / 2) + ts24_pos(idx, k)] += v;
    }
  }
}

// Named apart from quant_tern.cpp's helpers of the same shape: a unity build (TERN_UNITY) compiles
// both files as one source, where two anonymous-namespace templates of one name collide.
namespace {

template <DType T>
void ts24_to_float_of(const void* src, float* dst, int64_t n) {
  ts24_decode_row(T, static_cast<const uint8_t*>(src), dst, n);
}
template <DType T>
void ts24_from_float_of(const float* src, void* dst, int64_t n) {
  ts24_encode_row(T, src, n, static_cast<uint8_t*>(dst));
}
template <DType T>
QuantTraits ts24_row(DType act) {
  const DTypeSize& s = dtype_info(T);
  return {T, s.name, s.block_size, s.block_bytes, ts24_to_float_of<T>, ts24_from_float_of<T>, act};
}

}  // namespace

const QuantTraits* sparse24_quant_traits(DType t) {
  // Activations: ts24_q8 pairs with int8 per 32 columns as Q8_0 (kernels/sparse24.h), ts24_f16
  // with f32 as the float types.
  static const QuantTraits kRows[] = {ts24_row<DType::TS24_Q8>(DType::Q8_0), ts24_row<DType::TS24_F16>(DType::F32)};
  for (const auto& r : kRows)
    if (r.type == t) return &r;
  return nullptr;
}

}  // namespace tern

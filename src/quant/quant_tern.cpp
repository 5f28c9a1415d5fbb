#include "quant/quant_tern.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/fp16.h"

namespace tern {
namespace {

constexpr DType kTi8Classes[] = {DType::TI8, DType::TI8_O9, DType::TI8_O10,
                                 DType::TI8_O12, DType::TI8_O16, DType::TI8_O24};

uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
void store_u16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }
float round_f16(float x) { return fp16_to_f32(f32_to_fp16(x)); }

}  // namespace

// ---- TI8 ----------------------------------------------------------------------------------

bool is_ti8(DType t) {
  for (DType c : kTi8Classes)
    if (c == t) return true;
  return false;
}

int ti8_tail(DType t) {
  switch (t) {
    case DType::TI8: return 2;
    case DType::TI8_O9: return 4;
    case DType::TI8_O10: return 8;
    case DType::TI8_O12: return 16;
    case DType::TI8_O16: return 32;
    case DType::TI8_O24: return 66;
    default: fail("ti8_tail: ", dtype_name(t), " is not a ti8 type");
  }
}

int64_t ti8_capacity(DType t, int64_t n_in) { return (n_in / 32 * ti8_tail(t) - 2) / 2; }

std::optional<DType> ti8_type_for(int64_t n_in, int64_t k) {
  if (n_in <= 0 || n_in % 32 != 0) return std::nullopt;
  for (DType c : kTi8Classes)
    if (ti8_capacity(c, n_in) >= k) return c;
  return std::nullopt;
}

void ti8_pack_row(DType t, const float* w, int64_t n_in, const int32_t* cols, int64_t k, uint8_t* dst) {
  TERN_ASSERT(k <= ti8_capacity(t, n_in));
  const int64_t row_bytes = n_in / 32 * (32 + ti8_tail(t));
  std::memset(dst, 0, size_t(row_bytes));
  auto* q = reinterpret_cast<int8_t*>(dst);
  uint8_t* tail = dst + n_in;
  // Outliers first: mark them, keep their weights in 16 bits.
  float amax = 0.0f;
  int64_t next = 0;
  for (int64_t j = 0; j < n_in; ++j) {
    if (next < k && cols[next] == j) {
      q[j] = kTi8Outlier;
      store_u16(tail + 2 + 2 * next, f32_to_fp16(w[j]));
      ++next;
    } else {
      amax = std::max(amax, std::fabs(w[j]));
    }
  }
  TERN_ASSERT(next == k);
  // The stored (f16) scale is the one the quantizer divides by, so d * q reproduces the
  // rounding it chose; |w/d| <= 127 * (1 + 2^-11) still rounds into [-127, 127].
  const float d = round_f16(amax / 127.0f);
  store_u16(tail, f32_to_fp16(d));
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  next = 0;
  for (int64_t j = 0; j < n_in; ++j) {
    if (next < k && cols[next] == j) {
      ++next;
      continue;
    }
    const int v = int(std::roundf(w[j] * id));
    q[j] = static_cast<int8_t>(std::clamp(v, -127, 127));
  }
}

int64_t ti8_outlier_cols(const uint8_t* row, int64_t n_in, int32_t* cols) {
  const auto* q = reinterpret_cast<const int8_t*>(row);
  int64_t k = 0;
  for (int64_t j = 0; j < n_in; ++j)
    if (q[j] == kTi8Outlier) cols[k++] = int32_t(j);
  return k;
}

void ti8_row_to_float(DType /*t*/, const uint8_t* row, float* dst, int64_t n_in) {
  const auto* q = reinterpret_cast<const int8_t*>(row);
  const uint8_t* tail = row + n_in;
  const float d = fp16_to_f32(load_u16(tail));
  int64_t next = 0;
  for (int64_t j = 0; j < n_in; ++j)
    dst[j] = q[j] == kTi8Outlier ? fp16_to_f32(load_u16(tail + 2 + 2 * next++)) : d * float(q[j]);
}

// ---- TQ -----------------------------------------------------------------------------------

bool is_tq(DType t) { return static_cast<uint32_t>(t) >= 1010 && static_cast<uint32_t>(t) <= 1015; }

TqFormat tq_format(DType t) {
  switch (t) {
    case DType::TQ4_G64: return {4, 64};
    case DType::TQ4_G128: return {4, 128};
    case DType::TQ3_G64: return {3, 64};
    case DType::TQ3_G128: return {3, 128};
    case DType::TQ8_G64: return {8, 64};
    case DType::TQ8_G128: return {8, 128};
    default: fail("tq_format: ", dtype_name(t), " is not a tq type");
  }
}

std::optional<DType> tq_type(int bits, int group) {
  if (group != 64 && group != 128) return std::nullopt;
  const bool g64 = group == 64;
  switch (bits) {
    case 4: return g64 ? DType::TQ4_G64 : DType::TQ4_G128;
    case 3: return g64 ? DType::TQ3_G64 : DType::TQ3_G128;
    case 8: return g64 ? DType::TQ8_G64 : DType::TQ8_G128;
    default: return std::nullopt;
  }
}

void tq_pack_group(TqFormat f, const uint8_t* q, float d, int z, uint8_t* dst) {
  store_u16(dst, f32_to_fp16(d));
  dst[2] = static_cast<uint8_t>(z);
  uint8_t* qs = dst + 3;
  const int g = f.group;
  switch (f.bits) {
    case 4:
      for (int j = 0; j < g / 2; ++j) qs[j] = static_cast<uint8_t>((q[j] & 15) | (q[j + g / 2] & 15) << 4);
      break;
    case 3:
      for (int r = 0; r < g / 8; ++r) {
        uint32_t word = 0;
        for (int i = 0; i < 8; ++i) word |= uint32_t(q[8 * r + i] & 7) << (3 * i);
        qs[3 * r] = uint8_t(word);
        qs[3 * r + 1] = uint8_t(word >> 8);
        qs[3 * r + 2] = uint8_t(word >> 16);
      }
      break;
    case 8: std::memcpy(qs, q, size_t(g)); break;
    default: TERN_ASSERT_MSG(false, "tq bits");
  }
}

void tq_unpack_group(TqFormat f, const uint8_t* src, uint8_t* q, float* d, int* z) {
  *d = fp16_to_f32(load_u16(src));
  *z = src[2];
  const uint8_t* qs = src + 3;
  const int g = f.group;
  switch (f.bits) {
    case 4:
      for (int j = 0; j < g / 2; ++j) {
        q[j] = qs[j] & 15;
        q[j + g / 2] = qs[j] >> 4;
      }
      break;
    case 3:
      for (int r = 0; r < g / 8; ++r) {
        const uint32_t word = uint32_t(qs[3 * r]) | uint32_t(qs[3 * r + 1]) << 8 | uint32_t(qs[3 * r + 2]) << 16;
        for (int i = 0; i < 8; ++i) q[8 * r + i] = uint8_t((word >> (3 * i)) & 7);
      }
      break;
    case 8: std::memcpy(q, qs, size_t(g)); break;
    default: TERN_ASSERT_MSG(false, "tq bits");
  }
}

void tq_params_range(TqFormat f, float lo, float hi, float* d, int* z) {
  lo = std::min(lo, 0.0f);
  hi = std::max(hi, 0.0f);
  if (lo == 0.0f && hi == 0.0f) {
    // An all-zero group: any scale works; GPTQ's quantizer uses the range [-1, 1].
    lo = -1.0f;
    hi = 1.0f;
  }
  const int maxq = f.maxq();
  float s = round_f16((hi - lo) / float(maxq));
  if (s == 0.0f) s = round_f16(std::max(std::fabs(lo), std::fabs(hi)));  // tiny range: f16 underflow
  *d = s;
  *z = s != 0.0f ? std::clamp(int(std::roundf(-lo / s)), 0, maxq) : 0;
}

void tq_params(TqFormat f, const float* w, int64_t n, float* d, int* z) {
  float lo = 0.0f, hi = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    lo = std::min(lo, w[i]);
    hi = std::max(hi, w[i]);
  }
  tq_params_range(f, lo, hi, d, z);
}

void tq_encode_rtn(TqFormat f, const float* w, int64_t n, uint8_t* dst) {
  uint8_t q[128];
  for (int64_t b = 0; b < n / f.group; ++b) {
    const float* wb = w + b * f.group;
    float d;
    int z;
    tq_params(f, wb, f.group, &d, &z);
    for (int j = 0; j < f.group; ++j) q[j] = uint8_t(tq_quantize_value(wb[j], d, z, f.maxq()));
    tq_pack_group(f, q, d, z, dst + b * f.block_bytes());
  }
}

void tq_decode(TqFormat f, const uint8_t* src, float* dst, int64_t n) {
  uint8_t q[128];
  for (int64_t b = 0; b < n / f.group; ++b) {
    float d;
    int z;
    tq_unpack_group(f, src + b * f.block_bytes(), q, &d, &z);
    for (int j = 0; j < f.group; ++j) dst[b * f.group + j] = d * float(int(q[j]) - z);
  }
}

void tern_type_to_float(DType t, const void* src, float* dst, int64_t n) {
  if (is_ti8(t)) ti8_row_to_float(t, static_cast<const uint8_t*>(src), dst, n);
  else tq_decode(tq_format(t), static_cast<const uint8_t*>(src), dst, n);
}

void tern_type_from_float(DType t, const float* src, void* dst, int64_t n) {
  if (is_ti8(t)) ti8_pack_row(t, src, n, nullptr, 0, static_cast<uint8_t*>(dst));
  else tq_encode_rtn(tq_format(t), src, n, static_cast<uint8_t*>(dst));
}

namespace {

template <DType T>
void to_float_of(const void* src, float* dst, int64_t n) {
  tern_type_to_float(T, src, dst, n);
}
template <DType T>
void from_float_of(const float* src, void* dst, int64_t n) {
  tern_type_from_float(T, src, dst, n);
}
template <DType T>
QuantTraits row(DType act) {
  const DTypeSize& s = dtype_info(T);
  return {T, s.name, s.block_size, s.block_bytes, to_float_of<T>, from_float_of<T>, act};
}

}  // namespace

const QuantTraits* tern_quant_traits(DType t) {
  // Activations: TI8 pairs with per-token int8 (no ggml type; I8 names it), TQ with int8 per 32
  // columns as Q8_0 (kernels/tern_int.h).
  static const QuantTraits kRows[] = {
      row<DType::TI8>(DType::I8),          row<DType::TI8_O9>(DType::I8),       row<DType::TI8_O10>(DType::I8),
      row<DType::TI8_O12>(DType::I8),      row<DType::TI8_O16>(DType::I8),      row<DType::TI8_O24>(DType::I8),
      row<DType::TQ4_G64>(DType::Q8_0),    row<DType::TQ4_G128>(DType::Q8_0),   row<DType::TQ3_G64>(DType::Q8_0),
      row<DType::TQ3_G128>(DType::Q8_0),   row<DType::TQ8_G64>(DType::Q8_0),    row<DType::TQ8_G128>(DType::Q8_0),
  };
  for (const auto& r : kRows)
    if (r.type == t) return &r;
  return nullptr;
}

}  // namespace tern

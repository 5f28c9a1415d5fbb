#pragma once
// tern's own weight formats (type ids 1000+, core/dtype.h): their byte layouts, packers and
// round-to-nearest quantizers. The compression methods (LLM.int8(), SmoothQuant, GPTQ, AWQ)
// choose the values; these functions only store them. docs/compression.md describes the
// layouts for readers of the files.
#include <cstdint>
#include <optional>

#include "core/dtype.h"
#include "quant/quant_traits.h"

namespace tern {

// ---- TI8*: int8 rows with a per-row scale and 16-bit outlier columns -------------------------
//
// A row of n_in weights (n_in a multiple of 32) is n_in/32 * (32 + tail) bytes:
//
//   | q[0] ... q[n_in-1] (int8) | d (f16) | o[0] ... o[k-1] (f16) | zero padding |
//
//   w[j] = d * q[j]  for ordinary columns (d = absmax of the row's ordinary weights / 127);
//   q[j] = -128      marks an outlier column j, whose weight is the next o[] (column order).
//
// Outlier columns are input features, so every row of a tensor marks the same ones; a kernel
// finds them by scanning one row. The classes TI8, TI8_O9 ... TI8_O24 differ only in the tail
// bytes per 32 columns (2, 4, 8, 16, 32, 66), i.e. in how many outlier columns fit:
// capacity = (n_in / 32 * tail - 2) / 2. TI8 (8.5 bits per weight, as Q8_0) holds n_in/32 - 1
// outliers; TI8_O24 holds every column. SmoothQuant's W8A8 rows are TI8 without outliers.
inline constexpr int8_t kTi8Outlier = -128;

bool is_ti8(DType t);
int ti8_tail(DType t);  // tail bytes per 32 columns
int64_t ti8_capacity(DType t, int64_t n_in);
// Smallest class whose rows of n_in hold k outlier columns; nullopt when n_in % 32 != 0.
std::optional<DType> ti8_type_for(int64_t n_in, int64_t k);
// Encodes one row. cols: the k outlier columns, ascending, k <= ti8_capacity(t, n_in).
void ti8_pack_row(DType t, const float* w, int64_t n_in, const int32_t* cols, int64_t k, uint8_t* dst);
// The outlier columns of a row (in order) into cols (room for ti8_capacity); returns k.
int64_t ti8_outlier_cols(const uint8_t* row, int64_t n_in, int32_t* cols);
// One row (n = n_in) to f32.
void ti8_row_to_float(DType t, const uint8_t* row, float* dst, int64_t n_in);

// ---- TQ*: b-bit group quantization with integer zero points (GPTQ, AWQ, RTN) ------------------
//
// A row is n_in / g blocks; a block of g weights is 3 + b*g/8 bytes:
//
//   | d (f16) | z (u8) | packed q (b*g/8 bytes) |        w = d * (q - z),  0 <= q, z < 2^b
//
//   b = 4: byte j (j < g/2) holds q[j] in its low nibble and q[j + g/2] in its high nibble
//   b = 3: each run of 8 values is 3 bytes, value i at bits 3i..3i+2 of the little-endian word
//   b = 8: byte j is q[j]
struct TqFormat {
  int bits = 4;
  int group = 64;
  int64_t block_bytes() const { return 3 + int64_t(bits) * group / 8; }
  int maxq() const { return (1 << bits) - 1; }
};

bool is_tq(DType t);
TqFormat tq_format(DType t);                    // t must be a TQ type
std::optional<DType> tq_type(int bits, int group);  // nullopt for combinations tern lacks
// Packs one group: q[group] values, scale d (stored as f16), zero z.
void tq_pack_group(TqFormat f, const uint8_t* q, float d, int z, uint8_t* dst);
// Unpacks one group: q[group], d (the f16 value), z.
void tq_unpack_group(TqFormat f, const uint8_t* src, uint8_t* q, float* d, int* z);
// GPTQ's min-max quantizer parameters for a group of n weights (the range always includes 0,
// so zero is exact): d rounded to f16 precision, z in [0, maxq].
void tq_params(TqFormat f, const float* w, int64_t n, float* d, int* z);
// Same, from a given range [lo, hi] (AWQ's clipping search shrinks it).
void tq_params_range(TqFormat f, float lo, float hi, float* d, int* z);
inline int tq_quantize_value(float w, float d, int z, int maxq) {
  const float v = d != 0.0f ? w / d : 0.0f;
  int q = int(__builtin_roundf(v)) + z;
  return q < 0 ? 0 : (q > maxq ? maxq : q);
}
// Round-to-nearest encoding of rows of n_in (n a multiple of the group) and decoding.
void tq_encode_rtn(TqFormat f, const float* w, int64_t n, uint8_t* dst);
void tq_decode(TqFormat f, const uint8_t* src, float* dst, int64_t n);

// Traits-table entries (quant_traits.cpp): to_float / from_float of every tern type. The TI8
// functions take exactly one row (n = n_in); from_float writes rows without outliers.
void tern_type_to_float(DType t, const void* src, float* dst, int64_t n);
void tern_type_from_float(DType t, const float* src, void* dst, int64_t n);
// The traits row of a tern type (nullptr for other types); quant_traits() falls back to it.
const QuantTraits* tern_quant_traits(DType t);

}  // namespace tern

#pragma once
// 2:4 semi-structured sparse weights (type ids 1020, 1021, core/dtype.h): of every 4 consecutive
// input columns at most 2 hold a weight, so a row stores 2 values and their 2 positions per 4
// columns. The matmul kernels (kernels/sparse24.h) read these bytes and no dense copy, which is
// the point: a bandwidth-bound decode reads 0.65x (q8) / 0.56x (f16) of the dense type's bytes.
//
// A row of n_in weights (n_in a multiple of 32) is n_in / 32 blocks of 32 columns. Block:
//
//   ts24_q8  (22 bytes): | d (f16) | q[0..15] (int8) | idx (u32, little-endian) |   w = d * q
//   ts24_f16 (36 bytes): | v[0..15] (f16)            | idx (u32, little-endian) |   w = v
//
// Value k (k = 0..15) belongs to group g = k / 2 (columns 4g..4g+3 of the block); its column is
//
//   c_k = 4 * (k / 2) + p_k,    p_k = (idx >> (8 * (k % 4) + 2 * (k / 4))) & 3
//
// i.e. byte j of idx holds the positions of values j, j+4, j+8, j+12 in bits 0-1, 2-3, 4-5, 6-7.
// Why this order: broadcast idx to every 32-bit lane, and a per-lane shift right by 2m
// (vpsrlvd, AVX2) leaves in byte j of the lane the position of value 4m + j: a lane's four
// control bytes come out of one shift and one AND, with no per-byte shifts (which x86 lacks).
// Each value adds to its column: a group whose 2 positions are equal holds v0 + v1 there (the
// encoder never writes that; the decoder and every kernel agree on it for any bytes).
//
// Encoding (from_float) keeps the 2 largest |w| of each group (ties: the lower column) and
// writes them in column order, so a row already pruned to 2:4 (<= 2 nonzeros per group) is
// stored exactly up to the value type's rounding; groups with fewer nonzeros store zeros at
// some of their positions. ts24_q8's d = absmax of the block's kept values / 127, rounded to
// f16 before dividing (as Q8_0 and TI8 do), q = round(w / d) clamped to [-127, 127].
#include <cstdint>

#include "core/dtype.h"
#include "quant/quant_traits.h"

namespace tern {

inline constexpr int64_t kTs24Block = 32;      // columns per block
inline constexpr int64_t kTs24Values = 16;     // kept values per block
inline constexpr int64_t kTs24Q8Bytes = 22;    // ts24_q8 block
inline constexpr int64_t kTs24F16Bytes = 36;   // ts24_f16 block
inline constexpr int64_t kTs24Q8IdxOff = 18;   // offset of idx in a ts24_q8 block
inline constexpr int64_t kTs24F16IdxOff = 32;  // offset of idx in a ts24_f16 block

bool is_ts24(DType t);

// Position p_k (0..3, within its group) of value k from a block's idx word.
inline int ts24_pos(uint32_t idx, int k) { return int(idx >> (8 * (k % 4) + 2 * (k / 4))) & 3; }
// The idx word for 16 positions (each 0..3).
uint32_t ts24_pack_idx(const uint8_t* pos16);

// The 2:4 selection of one group of 4: the columns (0..3, ascending) of the 2 largest |w|
// (ties: the lower column).
void ts24_select(const float* w4, int* c0, int* c1);

// One row of n weights (n a multiple of 32, else tern::Error naming `what` and n) encoded to /
// decoded from t's blocks. Decoding writes zeros in the columns no value names.
void ts24_encode_row(DType t, const float* w, int64_t n, uint8_t* dst, const char* what = "ts24 row");
void ts24_decode_row(DType t, const uint8_t* src, float* dst, int64_t n, const char* what = "ts24 row");

// The traits row of a ts24 type (nullptr for other types); quant_traits() falls back to it.
const QuantTraits* sparse24_quant_traits(DType t);

}  // namespace tern

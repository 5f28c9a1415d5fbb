#pragma once
// The quant-format traits table: one row per storage type, shared by the runtime (dequantize,
// pick the paired activation type) and `tern quantize` (quantize). A new format is one row in
// quant_traits.cpp plus its kernels and tests.
//
// Block layouts are llama.cpp's, byte for byte, so GGUF files interoperate both ways; the
// dequantizers evaluate the same float expressions in the same order as ggml's `to_float`, so
// they reproduce its values bit for bit (tests/quant checks this against llama.cpp's output).
#include <cstdint>

#include "core/dtype.h"

namespace tern {

struct QuantTraits {
  DType type;
  const char* name;
  int64_t block_size;   // elements per block
  int64_t block_bytes;  // bytes per block
  // dst[0..n) = values of the n elements at src; n is a multiple of block_size.
  void (*to_float)(const void* src, float* dst, int64_t n);
  // Reference round-to-nearest quantizer (llama.cpp's rule); nullptr when not quantizable.
  void (*from_float)(const float* src, void* dst, int64_t n);
  // Activation format the dot-product kernels pair with this weight type (F32 = none).
  DType vec_dot_type;
};

// nullptr when tern has no codec for the type.
const QuantTraits* quant_traits(DType t);
// Throws tern::Error("unsupported tensor type T in tensor NAME") when there is no codec.
const QuantTraits& require_quant_traits(DType t, const char* tensor_name);

// llama.cpp's general.file_type (llama_ftype) for a file whose 2-D weights are mostly `type`.
uint32_t llama_file_type(DType type);

// The type for rows of n_in elements: `want` when it fits, else llama-quantize's substitute
// (q4_k -> q5_0, q5_k -> q5_1, q6_k -> q8_0; q2_k / q3_k / tq1_0 / tq2_0 -> q4_0) when that fits,
// else f16. Always fits.
DType fit_row_type(DType want, int64_t n_in);

// Elements per K-quant super-block.
inline constexpr int kQK_K = 256;

// Block structs (llama.cpp layouts).
struct BlockQ8_0 {
  uint16_t d;  // fp16 scale
  int8_t qs[32];
};
struct BlockQ4_0 {
  uint16_t d;        // fp16 scale
  uint8_t qs[16];    // low nibbles: elements 0..15, high nibbles: 16..31
};

// Q4_1: x = d * q + m, q in 0..15 (nibbles as in Q4_0).
struct BlockQ4_1 {
  uint16_t d;        // fp16 scale
  uint16_t m;        // fp16 offset (the block's minimum)
  uint8_t qs[16];
};
// Q5_0: x = d * (q - 16), q in 0..31: its low 4 bits as Q4_0's nibbles, bit 4 of element j in
// bit j of qh (little-endian).
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[16];
};
// Q5_1: x = d * q + m, q in 0..31 split as in Q5_0.
struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[16];
};

// Q2_K: 16 sub-blocks of 16; x = d * (scales[j] & 15) * q - dmin * (scales[j] >> 4), q in 0..3.
// Element l (0..31) of group i (0..3) of half n (0, 1), i.e. element 128n + 32i + l of sub-block
// j = 8n + 2i + l / 16: q = (qs[32n + l] >> 2i) & 3.
struct BlockQ2_K {
  uint8_t scales[kQK_K / 16];  // low nibble: scale, high nibble: min
  uint8_t qs[kQK_K / 4];
  uint16_t d;     // fp16 scale of the scales
  uint16_t dmin;  // fp16 scale of the mins
};
// Q3_K: 16 sub-blocks of 16; x = d * (sc_j - 32) * (q - 4 * (1 - h)), q in 0..3 as Q2_K's, h = bit
// 4n + i of hmask[l] (element 128n + 32i + l); the sixteen 6-bit sc_j packed in scales[12]:
// low 4 bits of sc_j in nibble j of bytes 0..7 (j < 8: low nibble of byte j, else high nibble of
// byte j - 8), high 2 bits in bits 2(j / 4)..+1 of byte 8 + j % 4.
struct BlockQ3_K {
  uint8_t hmask[kQK_K / 8];
  uint8_t qs[kQK_K / 4];
  uint8_t scales[12];
  uint16_t d;
};
// Q3_K's sixteen 6-bit scales (0..63, the stored values: the scale is sc - 32).
void q3_k_scales(const uint8_t* scales12, uint8_t* sc16);

// Q4_K: 8 sub-blocks of 32; x = d * sc[j] * q - dmin * m[j], q in 0..15.
//   scales[12] packs eight 6-bit sc and eight 6-bit m:
//     j < 4 : sc = scales[j] & 63,                               m = scales[j+4] & 63
//     j >= 4: sc = (scales[j+4] & 15) | (scales[j-4] >> 6) << 4,  m = (scales[j+4] >> 4) | (scales[j] >> 6) << 4
//   qs: 4 groups of 32 bytes; group g holds sub-block 2g in low nibbles, 2g+1 in high nibbles.
struct BlockQ4_K {
  uint16_t d;            // fp16 scale of the sub-block scales
  uint16_t dmin;         // fp16 scale of the sub-block mins
  uint8_t scales[12];
  uint8_t qs[kQK_K / 2];
};
// Sub-block j's 6-bit scale and min, unpacked from scales[12]; and the packing of all eight
// (every bit of the 12 bytes holds one of the 16 values, so unpack then pack is the identity).
void q4_k_scale_min(int j, const uint8_t* scales, uint8_t* sc, uint8_t* m);
void q4_k_pack_scales(const uint8_t* sc, const uint8_t* m, uint8_t* scales);

// Q5_K: Q4_K with a fifth bit: x = d * sc[j] * q - dmin * m[j], q in 0..31; scales packed as
// Q4_K's; qs as Q4_K's (low 4 bits); bit 4 of element l of sub-block j in bit j of qh[l].
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[kQK_K / 8];
  uint8_t qs[kQK_K / 2];
};

// Q6_K: 16 sub-blocks of 16; x = d * scales[j] * (q - 32), q in 0..63 split into a low nibble
// (ql) and 2 high bits (qh). Per half of 128 elements, for l in 0..31:
//   element l      : ql[l]    & 15, qh[l] bits 0-1      element l + 64: ql[l]    >> 4, qh[l] bits 4-5
//   element l + 32 : ql[l+32] & 15, qh[l] bits 2-3      element l + 96: ql[l+32] >> 4, qh[l] bits 6-7
struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];
  uint8_t qh[kQK_K / 4];
  int8_t scales[kQK_K / 16];
  uint16_t d;  // fp16 super-block scale
};

// Q8_K: the activation format of the K-quants. f32 scale, and the sums of each 16 quants so
// that the K-quant kernels can apply per-sub-block mins/offsets without touching qs again.
struct BlockQ8_K {
  float d;
  int8_t qs[kQK_K];
  int16_t bsums[kQK_K / 16];
};

// MXFP4 (OCP microscaling, ggml's block_mxfp4): x = kMxfp4Values[q] * e8m0_half(e), q the 4-bit
// index of an FP4 E2M1 value; nibbles as in Q4_0 (low: elements 0..15, high: 16..31).
struct BlockMXFP4 {
  uint8_t e;        // E8M0 shared exponent: the block's scale is 2^(e - 127)
  uint8_t qs[16];
};
// The E2M1 values (0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives) doubled, so that they are
// integers; e8m0_half halves the scale to match. Index 8 is -0, stored as 0.
inline constexpr int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
// 2^(e - 127) / 2 = 2^(e - 128), exactly (e < 2: a denormal float), as ggml builds it from the
// bits. Baseline code only (the rule of kernels/kernel_iface.h): the ISA kernels have their own.
inline float e8m0_half(uint8_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : uint32_t(e - 1) << 23;
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}

// TQ1_0 and TQ2_0 (llama.cpp's ternary types for BitNet b1.58 / TriLM weights): 256 trits
// t in {-1, 0, 1} and one f16 scale, x = d * t; each trit is stored as t + 1 in {0, 1, 2}.
// The scale comes last in both blocks (unlike the K-quants').
//
// TQ1_0 (1.6875 bits per weight): five trits per byte as a base-3 number, most significant trit
// first, v = sum_n (t_n + 1) 3^(4 - n) in 0..242, stored as the byte ceil(v * 256 / 243), so
// that trit n is the top "digit" of the byte times 3^n: ((uint8_t(byte * 3^n) * 3) >> 8. Elements:
//   qs[m],      m < 32: trit n (0..4) is element 32n + m            (elements 0..159)
//   qs[32 + m], m < 16: trit n is element 160 + 16n + m             (elements 160..239)
//   qh[j],      j < 4 : trit n (0..3) is element 240 + 4n + j, the fifth trit 0 (elements 240..255)
// Of the 256 byte values only 243 are what the packing writes (81 in qh, whose fifth trit is 0);
// the others still decode to trits (every byte does), which weight_check refuses.
struct BlockTQ1_0 {
  uint8_t qs[48];
  uint8_t qh[4];
  uint16_t d;  // fp16 scale
};
// TQ2_0 (2.0625 bits per weight): Q2_K's 2-bit layout without sub-block scales: element
// 128n + 32l + m (n = 0, 1; l = 0..3; m = 0..31) is (qs[32n + m] >> 2l) & 3, minus 1. The code 3
// is no trit (weight_check refuses it; ggml would read it as 2).
struct BlockTQ2_0 {
  uint8_t qs[kQK_K / 4];
  uint16_t d;  // fp16 scale
};
// 3^n: the multiplier that brings trit n of a TQ1_0 byte to the top.
inline constexpr uint8_t kTq1Pow3[5] = {1, 3, 9, 27, 81};

static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockMXFP4) == 17);
static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ2_K) == 84);
static_assert(sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockQ8_K) == 292);
static_assert(sizeof(BlockTQ1_0) == 54);
static_assert(sizeof(BlockTQ2_0) == 66);

// Round to nearest, ties to even, for |x| < 2^22: the rounding every K-quant rule uses
// (adding 1.5 * 2^23 puts the integer in the low mantissa bits). Exposed so that kernels
// quantizing activations round exactly like the reference.
inline int nearest_int(float x) {
  float v = x + 12582912.0f;
  int32_t i;
  __builtin_memcpy(&i, &v, 4);
  return (i & 0x007fffff) - 0x00400000;
}

}  // namespace tern

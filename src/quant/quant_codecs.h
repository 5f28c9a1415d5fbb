#pragma once
// Per-format codecs behind the traits table (quant_traits.cpp). Internal to the quant layer;
// everyone else goes through quant_traits(). Each to_float/from_float takes n elements,
// n a multiple of the block size.
#include <cstdint>

namespace tern::codec {

// The value of largest magnitude among x[0..n) (the first on ties: llama.cpp's quantizers scan
// in order with a strict comparison), and that magnitude in *amax.
inline float signed_absmax(const float* x, int n, float* amax) {
  float max = 0, a = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = x[i] < 0 ? -x[i] : x[i];
    if (ax > a) {
      a = ax;
      max = x[i];
    }
  }
  *amax = a;
  return max;
}

void q8_0_to_float(const void* src, float* dst, int64_t n);
void q8_0_from_float(const float* src, void* dst, int64_t n);
void q4_0_to_float(const void* src, float* dst, int64_t n);
void q4_0_from_float(const float* src, void* dst, int64_t n);
void q4_1_to_float(const void* src, float* dst, int64_t n);
void q4_1_from_float(const float* src, void* dst, int64_t n);
void q5_0_to_float(const void* src, float* dst, int64_t n);
void q5_0_from_float(const float* src, void* dst, int64_t n);
void q5_1_to_float(const void* src, float* dst, int64_t n);
void q5_1_from_float(const float* src, void* dst, int64_t n);

void mxfp4_to_float(const void* src, float* dst, int64_t n);
void mxfp4_from_float(const float* src, void* dst, int64_t n);

// TQ1_0 / TQ2_0 (quant_traits.h): llama.cpp's ternary types.
void tq1_0_to_float(const void* src, float* dst, int64_t n);
void tq1_0_from_float(const float* src, void* dst, int64_t n);
void tq2_0_to_float(const void* src, float* dst, int64_t n);
void tq2_0_from_float(const float* src, void* dst, int64_t n);

// Block packers for quantization-aware training export: one block (54 / 66 bytes at dst) from
// 256 trits in {-1, 0, 1} (element order: the tensor's, as for every other type) and the scale
// d, stored as f16 (round to nearest even), so that element e decodes to float(trits[e]) * d'
// with d' = d rounded to f16. Byte for byte what tq1_0_from_float / tq2_0_from_float write for
// values whose llama.cpp trits and amax are those (the quantizers call the same packing). Throws
// tern::Error when a trit is outside {-1, 0, 1}. Trits of exactly zero for a whole block and any
// d are fine (llama.cpp writes d = 0 there).
void tq1_0_pack_block(const int8_t* trits, float d, void* dst);
void tq2_0_pack_block(const int8_t* trits, float d, void* dst);
// The inverse: the 256 trits of the block at src into trits[], and its scale (f16 widened).
// TQ2_0's code 3 (no trit) reads as 2, ggml's way; any TQ1_0 byte gives trits.
float tq1_0_unpack_block(const void* src, int8_t* trits);
float tq2_0_unpack_block(const void* src, int8_t* trits);
// Whether a TQ1_0 byte is one the packing writes (243 of the 256 values in qs, 81 in qh, whose
// fifth base-3 digit is 0); every other byte decodes to the same trits as one that is.
bool tq1_0_byte_is_canonical(uint8_t byte, bool qh);

void q2_k_to_float(const void* src, float* dst, int64_t n);
void q2_k_from_float(const float* src, void* dst, int64_t n);
void q3_k_to_float(const void* src, float* dst, int64_t n);
void q3_k_from_float(const float* src, void* dst, int64_t n);
void q4_k_to_float(const void* src, float* dst, int64_t n);
void q4_k_from_float(const float* src, void* dst, int64_t n);
void q5_k_to_float(const void* src, float* dst, int64_t n);
void q5_k_from_float(const float* src, void* dst, int64_t n);
void q6_k_to_float(const void* src, float* dst, int64_t n);
void q6_k_from_float(const float* src, void* dst, int64_t n);
void q8_k_to_float(const void* src, float* dst, int64_t n);
void q8_k_from_float(const float* src, void* dst, int64_t n);

}  // namespace tern::codec

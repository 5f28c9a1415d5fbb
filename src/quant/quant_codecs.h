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

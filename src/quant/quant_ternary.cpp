// TQ1_0 and TQ2_0 (ggml's ternary types, quant_traits.h): 256 trits and an f16 scale per block.
// The quantizers are llama.cpp's reference rules (quantize_row_tq1_0_ref / _tq2_0_ref): the
// scale is the block's largest magnitude, each trit lroundf(x / scale), ties away from zero;
// the same float operations in the same order, so the same bytes (tests/py/test_quant_llamacpp.py
// calls llama.cpp's own functions to check it). Both go through the block packers, which
// quantization-aware training also calls with trits and a scale of its own.
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/fp16.h"
#include "quant/quant_codecs.h"
#include "quant/quant_traits.h"

namespace tern::codec {
namespace {

// One TQ1_0 byte from up to five trit codes c[0..k) (t + 1, in 0..2), the first the most
// significant base-3 digit; k = 4 (qh) leaves the last digit 0. ceil(v * 256 / 243) makes the
// top "digit" of the byte times 3^n, (byte * 3^n mod 256) * 3 >> 8, equal to code n.
uint8_t tq1_pack_byte(const uint8_t* codes, int k) {
  unsigned v = 0;
  for (int n = 0; n < 5; ++n) v = 3 * v + (n < k ? codes[n] : 0u);
  return static_cast<uint8_t>((v * 256 + 242) / 243);
}

// Code n (0..4) of a TQ1_0 byte, as ggml's dequantizer and vec_dot read it (any byte, packed by
// the rule above or not, gives a code in 0..2).
uint8_t tq1_code(uint8_t byte, int n) {
  const uint8_t q = static_cast<uint8_t>(byte * kTq1Pow3[n]);
  return static_cast<uint8_t>((unsigned(q) * 3) >> 8);
}

// Trit codes (t + 1) of one block from trits or from values: `code(e)` for element e.
template <class Code>
void tq1_pack_codes(Code&& code, uint8_t* qs, uint8_t* qh) {
  uint8_t c[5];
  for (int m = 0; m < 32; ++m) {  // elements 32n + m
    for (int n = 0; n < 5; ++n) c[n] = code(32 * n + m);
    qs[m] = tq1_pack_byte(c, 5);
  }
  for (int m = 0; m < 16; ++m) {  // elements 160 + 16n + m
    for (int n = 0; n < 5; ++n) c[n] = code(160 + 16 * n + m);
    qs[32 + m] = tq1_pack_byte(c, 5);
  }
  for (int j = 0; j < 4; ++j) {  // elements 240 + 4n + j
    for (int n = 0; n < 4; ++n) c[n] = code(240 + 4 * n + j);
    qh[j] = tq1_pack_byte(c, 4);
  }
}

template <class Code>
void tq2_pack_codes(Code&& code, uint8_t* qs) {
  for (int h = 0; h < 2; ++h)
    for (int m = 0; m < 32; ++m) {
      unsigned q = 0;
      for (int l = 0; l < 4; ++l) q |= unsigned(code(128 * h + 32 * l + m)) << (2 * l);
      qs[32 * h + m] = static_cast<uint8_t>(q);
    }
}

// llama.cpp's scale and trit rule for one block of 256: d = amax (its MAX macro: a NaN element
// makes amax NaN), trit = lroundf(x * (1 / d)).
float ternary_scale(const float* x, float* id) {
  float amax = 0.0f;
  for (int j = 0; j < kQK_K; ++j) {
    const float a = std::fabs(x[j]);
    amax = amax > a ? amax : a;
  }
  *id = amax != 0.0f ? 1.0f / amax : 0.0f;
  return amax;
}
uint8_t ternary_code(float x, float id) { return static_cast<uint8_t>(std::lroundf(x * id) + 1); }

void check_trits(const int8_t* trits, const char* what) {
  for (int e = 0; e < kQK_K; ++e)
    if (trits[e] < -1 || trits[e] > 1) fail(what, ": element ", e, " is ", int(trits[e]), ", not a trit (-1, 0 or 1)");
}

}  // namespace

void tq1_0_pack_block(const int8_t* trits, float d, void* dst) {
  check_trits(trits, "tq1_0_pack_block");
  auto* b = static_cast<BlockTQ1_0*>(dst);
  tq1_pack_codes([&](int e) { return uint8_t(trits[e] + 1); }, b->qs, b->qh);
  b->d = f32_to_fp16(d);
}

void tq2_0_pack_block(const int8_t* trits, float d, void* dst) {
  check_trits(trits, "tq2_0_pack_block");
  auto* b = static_cast<BlockTQ2_0*>(dst);
  tq2_pack_codes([&](int e) { return uint8_t(trits[e] + 1); }, b->qs);
  b->d = f32_to_fp16(d);
}

float tq1_0_unpack_block(const void* src, int8_t* trits) {
  const auto* b = static_cast<const BlockTQ1_0*>(src);
  for (int n = 0; n < 5; ++n) {
    for (int m = 0; m < 32; ++m) trits[32 * n + m] = static_cast<int8_t>(tq1_code(b->qs[m], n) - 1);
    for (int m = 0; m < 16; ++m) trits[160 + 16 * n + m] = static_cast<int8_t>(tq1_code(b->qs[32 + m], n) - 1);
  }
  for (int n = 0; n < 4; ++n)
    for (int j = 0; j < 4; ++j) trits[240 + 4 * n + j] = static_cast<int8_t>(tq1_code(b->qh[j], n) - 1);
  return fp16_to_f32(b->d);
}

float tq2_0_unpack_block(const void* src, int8_t* trits) {
  const auto* b = static_cast<const BlockTQ2_0*>(src);
  for (int h = 0; h < 2; ++h)
    for (int l = 0; l < 4; ++l)
      for (int m = 0; m < 32; ++m) trits[128 * h + 32 * l + m] = static_cast<int8_t>(((b->qs[32 * h + m] >> (2 * l)) & 3) - 1);
  return fp16_to_f32(b->d);
}

bool tq1_0_byte_is_canonical(uint8_t byte, bool qh) {
  uint8_t c[5];
  for (int n = 0; n < 5; ++n) c[n] = tq1_code(byte, n);
  return tq1_pack_byte(c, qh ? 4 : 5) == byte;
}

// (float)(t) * d per element, t in {-1, 0, 1}: ggml's dequantizers.
void tq1_0_to_float(const void* src, float* dst, int64_t n) {
  int8_t t[kQK_K];
  for (int64_t ib = 0; ib < n / kQK_K; ++ib) {
    const float d = tq1_0_unpack_block(static_cast<const BlockTQ1_0*>(src) + ib, t);
    for (int e = 0; e < kQK_K; ++e) dst[ib * kQK_K + e] = float(t[e]) * d;
  }
}

void tq2_0_to_float(const void* src, float* dst, int64_t n) {
  int8_t t[kQK_K];
  for (int64_t ib = 0; ib < n / kQK_K; ++ib) {
    const float d = tq2_0_unpack_block(static_cast<const BlockTQ2_0*>(src) + ib, t);
    for (int e = 0; e < kQK_K; ++e) dst[ib * kQK_K + e] = float(t[e]) * d;
  }
}

void tq1_0_from_float(const float* src, void* dst, int64_t n) {
  for (int64_t ib = 0; ib < n / kQK_K; ++ib) {
    const float* x = src + ib * kQK_K;
    auto* b = static_cast<BlockTQ1_0*>(dst) + ib;
    float id;
    b->d = f32_to_fp16(ternary_scale(x, &id));
    tq1_pack_codes([&](int e) { return ternary_code(x[e], id); }, b->qs, b->qh);
  }
}

void tq2_0_from_float(const float* src, void* dst, int64_t n) {
  for (int64_t ib = 0; ib < n / kQK_K; ++ib) {
    const float* x = src + ib * kQK_K;
    auto* b = static_cast<BlockTQ2_0*>(dst) + ib;
    float id;
    b->d = f32_to_fp16(ternary_scale(x, &id));
    // ggml keeps the low 2 bits of lroundf(x / d) + 1: always 0..2 for finite x
    tq2_pack_codes([&](int e) { return uint8_t(ternary_code(x[e], id) & 3); }, b->qs);
  }
}

}  // namespace tern::codec

// MXFP4 (ggml's block_mxfp4, gpt-oss's expert weights): per 32 elements an E8M0 exponent and 32
// FP4 E2M1 indices (quant_traits.h). The quantizer is llama.cpp's reference rule
// (quantize_row_mxfp4_ref): the exponent from the block's largest magnitude, then each element
// the nearest of the 16 values; the same float operations in the same order, so the same bytes
// (tests/py/test_quant_llamacpp.py calls llama.cpp's own functions to check it).
#include <cmath>

#include "quant/quant_codecs.h"
#include "quant/quant_traits.h"

namespace tern::codec {

void mxfp4_to_float(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockMXFP4*>(src);
  for (int64_t ib = 0; ib < n / 32; ++ib) {
    const float d = e8m0_half(b[ib].e);
    for (int j = 0; j < 16; ++j) {
      dst[ib * 32 + j] = float(kMxfp4Values[b[ib].qs[j] & 0x0F]) * d;
      dst[ib * 32 + j + 16] = float(kMxfp4Values[b[ib].qs[j] >> 4]) * d;
    }
  }
}

namespace {

// The index of the value nearest x at scale d: |v_i d - x| smallest, the first on ties (so +0
// before -0, and the lower magnitude wins a tie between neighbours).
uint8_t mxfp4_nearest(float x, float d) {
  uint8_t best = 0;
  float best_err = std::fabs(float(kMxfp4Values[0]) * d - x);
  for (uint8_t i = 1; i < 16; ++i) {
    const float err = std::fabs(float(kMxfp4Values[i]) * d - x);
    if (err < best_err) {
      best = i;
      best_err = err;
    }
  }
  return best;
}

}  // namespace

// e = floor(log2(amax)) - 2 + 127 (so the largest value, 12 * 2^(e - 128) = 1.5 * 2^floor(log2
// amax), sits at amax's binade; amax up to twice that is clipped to it), 0 for an all-zero block.
// llama.cpp converts that float straight to uint8_t, which x86-64 compiles as a conversion to
// int32 keeping the low byte: a block whose amax is below 2^-125 gets e = 256 - k, not 0. The
// explicit int32 step reproduces that on every target (it is the value llama.cpp's x86 builds
// write, and such a block's elements are zeros at that scale either way).
void mxfp4_from_float(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockMXFP4*>(dst);
  for (int64_t ib = 0; ib < n / 32; ++ib) {
    const float* x = src + ib * 32;
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::fmax(amax, std::fabs(x[j]));
    const uint8_t e = amax > 0.0f ? static_cast<uint8_t>(static_cast<int32_t>(std::floor(std::log2(amax)) - 2 + 127)) : 0;
    const float d = e8m0_half(e);
    b[ib].e = e;
    for (int j = 0; j < 16; ++j)
      b[ib].qs[j] = static_cast<uint8_t>(mxfp4_nearest(x[j], d) | mxfp4_nearest(x[j + 16], d) << 4);
  }
}

}  // namespace tern::codec

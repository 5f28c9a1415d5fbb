#pragma once
// The quant-format traits table: one row per storage type, shared by the runtime (dequantize,
// pick the paired activation type) and `tern quantize` (quantize). A new format is one row in
// quant_traits.cpp plus its kernels and tests.
//
// Block layouts are llama.cpp's, byte for byte, so GGUF files interoperate both ways.
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

// Block structs (llama.cpp layouts).
struct BlockQ8_0 {
  uint16_t d;  // fp16 scale
  int8_t qs[32];
};
struct BlockQ4_0 {
  uint16_t d;        // fp16 scale
  uint8_t qs[16];    // low nibbles: elements 0..15, high nibbles: 16..31
};
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ4_0) == 18);

}  // namespace tern

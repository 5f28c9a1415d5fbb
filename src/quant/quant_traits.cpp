#include "quant/quant_traits.h"

#include <cstring>

#include "core/error.h"
#include "core/fp16.h"
#include "quant/quant_codecs.h"
#include "quant/quant_tern.h"

namespace tern {
namespace {

void f32_to_float(const void* src, float* dst, int64_t n) { std::memcpy(dst, src, size_t(n) * 4); }
void f32_from_float(const float* src, void* dst, int64_t n) { std::memcpy(dst, src, size_t(n) * 4); }

void f16_to_float(const void* src, float* dst, int64_t n) {
  const auto* s = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_f32(s[i]);
}
void f16_from_float(const float* src, void* dst, int64_t n) {
  auto* d = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) d[i] = f32_to_fp16(src[i]);
}
void bf16_to_float(const void* src, float* dst, int64_t n) {
  const auto* s = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
}
void bf16_from_float(const float* src, void* dst, int64_t n) {
  auto* d = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
}

using namespace codec;

const QuantTraits kTraits[] = {
    {DType::F32, "f32", 1, 4, f32_to_float, f32_from_float, DType::F32},
    {DType::F16, "f16", 1, 2, f16_to_float, f16_from_float, DType::F32},
    {DType::BF16, "bf16", 1, 2, bf16_to_float, bf16_from_float, DType::F32},
    {DType::Q8_0, "q8_0", 32, 34, q8_0_to_float, q8_0_from_float, DType::Q8_0},
    {DType::Q4_0, "q4_0", 32, 18, q4_0_to_float, q4_0_from_float, DType::Q8_0},
    {DType::Q4_K, "q4_k", kQK_K, sizeof(BlockQ4_K), q4_k_to_float, q4_k_from_float, DType::Q8_K},
    {DType::Q6_K, "q6_k", kQK_K, sizeof(BlockQ6_K), q6_k_to_float, q6_k_from_float, DType::Q8_K},
    // Q8_K exists to carry activations; as a weight it has no fast kernel (matmul falls back
    // to the reference), so it pairs with nothing.
    {DType::Q8_K, "q8_k", kQK_K, sizeof(BlockQ8_K), q8_k_to_float, q8_k_from_float, DType::F32},
};

}  // namespace

const QuantTraits* quant_traits(DType t) {
  for (const auto& q : kTraits)
    if (q.type == t) return &q;
  // tern's own formats (LLM.int8(), SmoothQuant, GPTQ/AWQ groups) have their rows in
  // quant_tern.cpp; nullptr for anything neither table knows.
  return tern_quant_traits(t);
}

const QuantTraits& require_quant_traits(DType t, const char* tensor_name) {
  const QuantTraits* q = quant_traits(t);
  if (!q) {
    const auto info = dtype_size(static_cast<uint32_t>(t));
    fail("unsupported tensor type ", info ? info->name : "?", " in tensor ", tensor_name);
  }
  return *q;
}

}  // namespace tern

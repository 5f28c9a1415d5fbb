#include "quant/quant_traits.h"

#include <cstring>

#include "core/error.h"
#include "core/fp16.h"
#include "quant/quant_billm.h"
#include "quant/quant_codecs.h"
#include "quant/quant_sparse.h"
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
    {DType::Q4_1, "q4_1", 32, sizeof(BlockQ4_1), q4_1_to_float, q4_1_from_float, DType::Q8_0},
    {DType::Q5_0, "q5_0", 32, sizeof(BlockQ5_0), q5_0_to_float, q5_0_from_float, DType::Q8_0},
    {DType::Q5_1, "q5_1", 32, sizeof(BlockQ5_1), q5_1_to_float, q5_1_from_float, DType::Q8_0},
    // MXFP4 pairs with Q8_0 activations, as in ggml (vec_dot_mxfp4_q8_0).
    {DType::MXFP4, "mxfp4", 32, sizeof(BlockMXFP4), mxfp4_to_float, mxfp4_from_float, DType::Q8_0},
    {DType::Q2_K, "q2_k", kQK_K, sizeof(BlockQ2_K), q2_k_to_float, q2_k_from_float, DType::Q8_K},
    {DType::Q3_K, "q3_k", kQK_K, sizeof(BlockQ3_K), q3_k_to_float, q3_k_from_float, DType::Q8_K},
    {DType::Q4_K, "q4_k", kQK_K, sizeof(BlockQ4_K), q4_k_to_float, q4_k_from_float, DType::Q8_K},
    {DType::Q5_K, "q5_k", kQK_K, sizeof(BlockQ5_K), q5_k_to_float, q5_k_from_float, DType::Q8_K},
    {DType::Q6_K, "q6_k", kQK_K, sizeof(BlockQ6_K), q6_k_to_float, q6_k_from_float, DType::Q8_K},
    // The ternary types pair with Q8_K activations, as in ggml (vec_dot_tq1_0_q8_K / _tq2_0_).
    {DType::TQ1_0, "tq1_0", kQK_K, sizeof(BlockTQ1_0), tq1_0_to_float, tq1_0_from_float, DType::Q8_K},
    {DType::TQ2_0, "tq2_0", kQK_K, sizeof(BlockTQ2_0), tq2_0_to_float, tq2_0_from_float, DType::Q8_K},
    // BiLLM's binarized blocks (quant_billm.h) pair with int8 activations per 32 as TQ does
    // (kernels/tern_int.h); from_float is the Hessian-free encoder (salient columns by |w|).
    {DType::BILLM_G64, "billm_g64", 64, 26, billm_g64_to_float, billm_g64_from_float, DType::Q8_0},
    {DType::BILLM_G128, "billm_g128", 128, 44, billm_g128_to_float, billm_g128_from_float, DType::Q8_0},
    // Q8_K exists to carry activations; as a weight it has no fast kernel (matmul falls back
    // to the reference), so it pairs with nothing.
    {DType::Q8_K, "q8_k", kQK_K, sizeof(BlockQ8_K), q8_k_to_float, q8_k_from_float, DType::F32},
};

}  // namespace

const QuantTraits* quant_traits(DType t) {
  for (const auto& q : kTraits)
    if (q.type == t) return &q;
  // tern's own formats (LLM.int8(), SmoothQuant, GPTQ/AWQ groups) have their rows in
  // quant_tern.cpp, the 2:4 sparse ones in quant_sparse.cpp; nullptr for anything no table knows.
  if (const QuantTraits* q = tern_quant_traits(t)) return q;
  return sparse24_quant_traits(t);
}

const QuantTraits& require_quant_traits(DType t, const char* tensor_name) {
  const QuantTraits* q = quant_traits(t);
  if (!q) {
    const auto info = dtype_size(static_cast<uint32_t>(t));
    fail("unsupported tensor type ", info ? info->name : "?", " in tensor ", tensor_name);
  }
  return *q;
}

uint32_t llama_file_type(DType type) {
  // llama_ftype values (llama.h): they are not the tensor type ids.
  switch (type) {
    case DType::F32: return 0;   // ALL_F32
    case DType::F16: return 1;   // MOSTLY_F16
    case DType::Q4_0: return 2;  // MOSTLY_Q4_0
    case DType::Q4_1: return 3;  // MOSTLY_Q4_1
    case DType::Q8_0: return 7;  // MOSTLY_Q8_0
    case DType::Q5_0: return 8;  // MOSTLY_Q5_0
    case DType::Q5_1: return 9;  // MOSTLY_Q5_1
    case DType::Q2_K: return 10; // MOSTLY_Q2_K
    case DType::Q3_K: return 11; // MOSTLY_Q3_K_S (tern applies no Q3_K_M mix)
    case DType::Q4_K: return 15; // MOSTLY_Q4_K_M (what llama-quantize calls "Q4_K")
    case DType::Q5_K: return 17; // MOSTLY_Q5_K_M (llama-quantize's "Q5_K")
    case DType::Q6_K: return 18; // MOSTLY_Q6_K
    case DType::BF16: return 32; // MOSTLY_BF16
    case DType::TQ1_0: return 36; // MOSTLY_TQ1_0
    case DType::TQ2_0: return 37; // MOSTLY_TQ2_0
    case DType::MXFP4: return 38; // MOSTLY_MXFP4_MOE
    default: return static_cast<uint32_t>(type);  // tern's own types: the type id itself
  }
}

DType fit_row_type(DType want, int64_t n_in) {
  if (dtype_row_bytes(want, n_in) >= 0) return want;
  // llama-quantize's substitutes for a k-quant whose rows are not a multiple of 256 (Qwen2's
  // 896, stories260K's 64): a 32-block type of at least its bits; f16 when that does not fit
  // either (a 32-block type's rows not a multiple of 32).
  DType alt = DType::F16;
  // (for q2_k / q3_k llama.cpp picks iq4_nl, which tern does not have: q4_0, the same 4.5 bpw)
  if (want == DType::Q2_K || want == DType::Q3_K) alt = DType::Q4_0;
  // (llama.cpp's own choice for the ternary types, "until a symmetric type" exists)
  else if (want == DType::TQ1_0 || want == DType::TQ2_0) alt = DType::Q4_0;
  else if (want == DType::Q4_K) alt = DType::Q5_0;
  else if (want == DType::Q5_K) alt = DType::Q5_1;
  else if (want == DType::Q6_K) alt = DType::Q8_0;
  if (alt != DType::F16 && dtype_row_bytes(alt, n_in) >= 0) return alt;
  return DType::F16;
}

}  // namespace tern

#pragma once
// Storage types of tensors, numbered as GGUF/ggml number them (the ids are part of the file
// format). This table only knows sizes and names; the maths of each format (to/from float,
// dot products, paired activation type) is the traits table in quant/quant_traits.h.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace tern {

enum class DType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22,
  IQ4_XS = 23, I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30,
  TQ1_0 = 34, TQ2_0 = 35,
  MXFP4 = 39,  // OCP microscaling FP4 (gpt-oss's experts): E2M1 values, an E8M0 exponent per 32
  // tern's own formats (docs/compression.md), numbered from 1000 so that they never collide
  // with ggml's ids. TI8*: int8 rows with a per-row scale and 16-bit outlier columns
  // (LLM.int8(), SmoothQuant W8A8); the suffix is the class's bits per weight. TQ*: b-bit
  // weights with an f16 scale and an integer zero point per group of g (GPTQ, AWQ). TS24*: 2:4
  // semi-structured sparse rows (2 values and their positions per 4 columns, quant/quant_sparse.h)
  // with int8 values and an f16 scale per 32 columns (_q8) or f16 values (_f16). BILLM_G*: BiLLM's
  // binarized blocks of g columns (quant/quant_billm.h): a sign bit and a magnitude-selector bit
  // per weight, four f16 magnitudes and g/32 salient-column indices per block.
  TI8 = 1000, TI8_O9 = 1001, TI8_O10 = 1002, TI8_O12 = 1003, TI8_O16 = 1004, TI8_O24 = 1005,
  TQ4_G64 = 1010, TQ4_G128 = 1011, TQ3_G64 = 1012, TQ3_G128 = 1013, TQ8_G64 = 1014, TQ8_G128 = 1015,
  TS24_Q8 = 1020, TS24_F16 = 1021,
  BILLM_G64 = 1030, BILLM_G128 = 1031,
};

struct DTypeSize {
  DType type;
  const char* name;      // llama.cpp's spelling, lower case ("q4_0", "f16")
  int64_t block_size;    // elements per block
  int64_t block_bytes;   // bytes per block
};

// Size info for a type id read from a file; nullopt for ids ggml does not define.
std::optional<DTypeSize> dtype_size(uint32_t type_id);
const DTypeSize& dtype_info(DType t);  // t must be a defined type
inline const char* dtype_name(DType t) { return dtype_info(t).name; }
// Parses "q4_0", "Q8_0", "f16"...; nullopt when unknown.
std::optional<DType> dtype_from_name(std::string_view name);
// Bytes of one row of n elements; -1 when n is not a multiple of the block size.
int64_t dtype_row_bytes(DType t, int64_t n);
// The float weight types the kernels read (F32, F16, BF16).
inline bool dtype_is_float(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

}  // namespace tern

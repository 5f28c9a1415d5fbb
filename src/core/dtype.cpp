#include "core/dtype.h"

#include <cctype>

#include "core/error.h"

namespace tern {
namespace {

constexpr DTypeSize kTypes[] = {
    {DType::F32, "f32", 1, 4},         {DType::F16, "f16", 1, 2},
    {DType::Q4_0, "q4_0", 32, 18},     {DType::Q4_1, "q4_1", 32, 20},
    {DType::Q5_0, "q5_0", 32, 22},     {DType::Q5_1, "q5_1", 32, 24},
    {DType::Q8_0, "q8_0", 32, 34},     {DType::Q8_1, "q8_1", 32, 36},
    {DType::Q2_K, "q2_k", 256, 84},    {DType::Q3_K, "q3_k", 256, 110},
    {DType::Q4_K, "q4_k", 256, 144},   {DType::Q5_K, "q5_k", 256, 176},
    {DType::Q6_K, "q6_k", 256, 210},   {DType::Q8_K, "q8_k", 256, 292},
    {DType::IQ2_XXS, "iq2_xxs", 256, 66}, {DType::IQ2_XS, "iq2_xs", 256, 74},
    {DType::IQ3_XXS, "iq3_xxs", 256, 98}, {DType::IQ1_S, "iq1_s", 256, 50},
    {DType::IQ4_NL, "iq4_nl", 32, 18}, {DType::IQ3_S, "iq3_s", 256, 110},
    {DType::IQ2_S, "iq2_s", 256, 82},  {DType::IQ4_XS, "iq4_xs", 256, 136},
    {DType::I8, "i8", 1, 1},           {DType::I16, "i16", 1, 2},
    {DType::I32, "i32", 1, 4},         {DType::I64, "i64", 1, 8},
    {DType::F64, "f64", 1, 8},         {DType::IQ1_M, "iq1_m", 256, 56},
    {DType::BF16, "bf16", 1, 2},       {DType::TQ1_0, "tq1_0", 256, 54},
    {DType::TQ2_0, "tq2_0", 256, 66},  {DType::MXFP4, "mxfp4", 32, 17},
    // tern's formats: row = n_in/32 blocks' worth of int8 + tail (scale, outliers), see
    // quant/quant_tern.h; group formats: f16 scale + u8 zero + packed values per group.
    {DType::TI8, "ti8", 32, 34},          {DType::TI8_O9, "ti8_o9", 32, 36},
    {DType::TI8_O10, "ti8_o10", 32, 40},  {DType::TI8_O12, "ti8_o12", 32, 48},
    {DType::TI8_O16, "ti8_o16", 32, 64},  {DType::TI8_O24, "ti8_o24", 32, 98},
    {DType::TQ4_G64, "tq4_g64", 64, 35},  {DType::TQ4_G128, "tq4_g128", 128, 67},
    {DType::TQ3_G64, "tq3_g64", 64, 27},  {DType::TQ3_G128, "tq3_g128", 128, 51},
    {DType::TQ8_G64, "tq8_g64", 64, 67},  {DType::TQ8_G128, "tq8_g128", 128, 131},
    // 2:4 sparse: per 32 columns 16 kept values + 4 bytes of 2-bit positions (quant/quant_sparse.h):
    // f16 scale + 16 int8 (22 bytes), or 16 f16 (36 bytes).
    {DType::TS24_Q8, "ts24_q8", 32, 22},  {DType::TS24_F16, "ts24_f16", 32, 36},
    // BiLLM: per g columns 2 bit planes (g/4 bytes) + 4 f16 magnitudes + g/32 salient column
    // indices (quant/quant_billm.h): 26 bytes per 64 (3.25 bits per weight), 44 per 128 (2.75).
    {DType::BILLM_G64, "billm_g64", 64, 26}, {DType::BILLM_G128, "billm_g128", 128, 44},
};

}  // namespace

std::optional<DTypeSize> dtype_size(uint32_t type_id) {
  for (const auto& t : kTypes)
    if (static_cast<uint32_t>(t.type) == type_id) return t;
  return std::nullopt;
}

const DTypeSize& dtype_info(DType t) {
  for (const auto& e : kTypes)
    if (e.type == t) return e;
  fail("unknown tensor type id ", static_cast<uint32_t>(t));
}

std::optional<DType> dtype_from_name(std::string_view name) {
  std::string lower;
  for (char c : name) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const auto& t : kTypes)
    if (lower == t.name) return t.type;
  return std::nullopt;
}

int64_t dtype_row_bytes(DType t, int64_t n) {
  const auto& info = dtype_info(t);
  if (n % info.block_size != 0) return -1;
  return n / info.block_size * info.block_bytes;
}

}  // namespace tern

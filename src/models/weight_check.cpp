#include "models/weight_check.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "quant/quant_billm.h"
#include "quant/quant_codecs.h"
#include "quant/quant_tern.h"
#include "quant/quant_traits.h"

namespace tern {
namespace {

// IEEE exponent fields: all ones means Inf or NaN.
constexpr uint32_t kF32Exp = 0x7F800000u;
constexpr uint16_t kF16Exp = 0x7C00u;
constexpr uint16_t kBF16Exp = 0x7F80u;

// Index of the first of n words (at p, `stride` bytes apart) whose exponent field is all
// ones, or -1. Chunks are OR-reduced first so that the common, clean case is a branch-free
// loop the compiler vectorizes for unit strides.
template <class Word>
int64_t first_non_finite(const uint8_t* p, int64_t n, Word exp_mask, size_t stride = sizeof(Word)) {
  constexpr int64_t kChunk = 4096;
  for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
    const int64_t i1 = std::min(n, i0 + kChunk);
    unsigned bad = 0;
    for (int64_t i = i0; i < i1; ++i) {
      Word w;
      std::memcpy(&w, p + size_t(i) * stride, sizeof w);
      bad |= unsigned((w & exp_mask) == exp_mask);
    }
    if (!bad) continue;
    for (int64_t i = i0; i < i1; ++i) {
      Word w;
      std::memcpy(&w, p + size_t(i) * stride, sizeof w);
      if ((w & exp_mask) == exp_mask) return i;
    }
  }
  return -1;
}

// Byte offsets of the f16 scale fields inside one block of llama.cpp's quantized types.
std::vector<size_t> f16_scale_offsets(DType t) {
  switch (t) {
    case DType::Q8_0: return {offsetof(BlockQ8_0, d)};
    case DType::Q4_0: return {offsetof(BlockQ4_0, d)};
    case DType::Q4_1: return {offsetof(BlockQ4_1, d), offsetof(BlockQ4_1, m)};
    case DType::Q5_0: return {offsetof(BlockQ5_0, d)};
    case DType::Q5_1: return {offsetof(BlockQ5_1, d), offsetof(BlockQ5_1, m)};
    case DType::Q2_K: return {offsetof(BlockQ2_K, d), offsetof(BlockQ2_K, dmin)};
    case DType::Q3_K: return {offsetof(BlockQ3_K, d)};
    case DType::Q4_K: return {offsetof(BlockQ4_K, d), offsetof(BlockQ4_K, dmin)};
    case DType::Q5_K: return {offsetof(BlockQ5_K, d), offsetof(BlockQ5_K, dmin)};
    case DType::Q6_K: return {offsetof(BlockQ6_K, d)};
    case DType::TQ1_0: return {offsetof(BlockTQ1_0, d)};
    case DType::TQ2_0: return {offsetof(BlockTQ2_0, d)};
    default: return {};
  }
}

[[noreturn]] void report(const std::string& file_path, const GgufTensorInfo& t, const std::string& where) {
  fail(file_path, ": tensor ", t.name, " (", dtype_name(t.type), ", ", t.shape_string(), ") holds a non-finite value ",
       "(NaN or Inf) ", where, ": the file is corrupt (re-download or re-convert it)");
}

[[noreturn]] void report_code(const std::string& file_path, const GgufTensorInfo& t, const std::string& what,
                              int64_t block, int64_t blocks_per_row) {
  fail(file_path, ": tensor ", t.name, " (", dtype_name(t.type), ", ", t.shape_string(), ") holds ", what,
       " in block ", block, " (row ", block / std::max<int64_t>(1, blocks_per_row),
       "): the file is corrupt or was not written by a ggml-compatible quantizer (re-download or re-convert it)");
}

// The first TQ2_0 block (of n) holding the 2-bit code 3, which is no trit (ggml would read it as
// +2 d), or -1: 8 bytes at a time, a code 3 is a pair of set bits at an even position.
int64_t first_tq2_0_code3(const uint8_t* p, int64_t n) {
  constexpr uint64_t kEven = 0x5555555555555555ull;
  for (int64_t b = 0; b < n; ++b) {
    const uint8_t* qs = p + b * int64_t(sizeof(BlockTQ2_0));
    uint64_t bad = 0;
    for (size_t i = 0; i < sizeof(BlockTQ2_0::qs); i += 8) {
      uint64_t w;
      std::memcpy(&w, qs + i, 8);
      bad |= w & (w >> 1) & kEven;
    }
    if (bad) return b;
  }
  return -1;
}

// The first TQ1_0 block (of n) holding a byte its packing never writes (quant_traits.h: 13 of the
// 256 values in qs, 175 in qh), or -1. Such a byte still decodes to trits (those of a canonical
// neighbour), so ggml would compute with it; but no writer of the format produces one, so it
// marks a damaged or foreign file.
int64_t first_tq1_0_non_canonical(const uint8_t* p, int64_t n) {
  static const auto kBad = [] {  // [0][byte]: in qs, [1][byte]: in qh
    std::array<std::array<uint8_t, 256>, 2> t{};
    for (int b = 0; b < 256; ++b)
      for (int qh = 0; qh < 2; ++qh) t[size_t(qh)][size_t(b)] = !codec::tq1_0_byte_is_canonical(uint8_t(b), qh == 1);
    return t;
  }();
  for (int64_t b = 0; b < n; ++b) {
    const auto* blk = reinterpret_cast<const BlockTQ1_0*>(p + b * int64_t(sizeof(BlockTQ1_0)));
    unsigned bad = 0;
    for (uint8_t v : blk->qs) bad |= kBad[0][v];
    for (uint8_t v : blk->qh) bad |= kBad[1][v];
    if (bad) return b;
  }
  return -1;
}

}  // namespace

void check_weights_finite(const std::string& file_path, const GgufTensorInfo& t) {
  const int64_t n_in = t.ne.empty() ? 1 : t.ne[0];
  const auto at_element = [&](int64_t i) {
    return str_cat("at element ", i, " (row ", i / n_in, ", column ", i % n_in, ")");
  };
  if (t.type == DType::F32 || t.type == DType::F16 || t.type == DType::BF16) {
    const int64_t n = int64_t(t.n_bytes / (t.type == DType::F32 ? 4 : 2));
    const int64_t bad = t.type == DType::F32   ? first_non_finite<uint32_t>(t.data, n, kF32Exp)
                        : t.type == DType::F16 ? first_non_finite<uint16_t>(t.data, n, kF16Exp)
                                               : first_non_finite<uint16_t>(t.data, n, kBF16Exp);
    if (bad >= 0) report(file_path, t, at_element(bad));
    return;
  }
  const DTypeSize& info = dtype_info(t.type);
  const int64_t n_blocks = int64_t(t.n_bytes) / info.block_bytes;
  const int64_t blocks_per_row = n_in / info.block_size;
  const auto in_block = [&](int64_t b) {
    return str_cat("in the scale of block ", b, " (row ", b / std::max<int64_t>(1, blocks_per_row), ")");
  };
  for (const size_t off : f16_scale_offsets(t.type)) {
    const int64_t bad = first_non_finite<uint16_t>(t.data + off, n_blocks, kF16Exp, size_t(info.block_bytes));
    if (bad >= 0) report(file_path, t, in_block(bad));
  }
  if (t.type == DType::TQ2_0) {
    const int64_t bad = first_tq2_0_code3(t.data, n_blocks);
    if (bad >= 0) report_code(file_path, t, "the 2-bit code 3, which is no trit (-1, 0, 1 are 0, 1, 2)", bad, blocks_per_row);
  } else if (t.type == DType::TQ1_0) {
    const int64_t bad = first_tq1_0_non_canonical(t.data, n_blocks);
    if (bad >= 0)
      report_code(file_path, t, "a byte that is no base-3 packing of trits (not one of the 243 values TQ1_0 packs to)", bad,
                  blocks_per_row);
  } else if (t.type == DType::MXFP4) {
    // An E8M0 exponent of 253 or more times a large code overflows f32 (what ggml decodes is
    // inf there): codes of doubled magnitude m (up to 12) in a block of exponent e decode to
    // m 2^(e - 128), infinite once m >= 2^(256 - e). tern's quantizer never writes such a block.
    for (int64_t b = 0; b < n_blocks; ++b) {
      const uint8_t* blk = t.data + b * info.block_bytes;
      if (blk[0] < 253) continue;
      const int limit = 1 << (256 - blk[0]);  // 8, 4 or 2
      for (int j = 0; j < 32; ++j) {
        const uint8_t code = j < 16 ? blk[1 + j] & 0x0F : blk[1 + j - 16] >> 4;
        if (std::abs(int(kMxfp4Values[code])) >= limit) report(file_path, t, in_block(b));
      }
    }
  } else if (is_tq(t.type)) {  // GPTQ / AWQ groups: an f16 scale at the start of every group
    const int64_t bad = first_non_finite<uint16_t>(t.data, n_blocks, kF16Exp, size_t(info.block_bytes));
    if (bad >= 0) report(file_path, t, in_block(bad));
  } else if (is_billm(t.type)) {  // BiLLM blocks: four f16 magnitudes and a salient-column list
    const BillmFormat f = billm_format(t.type);
    for (int64_t b = 0; b < n_blocks; ++b)
      if (const char* defect = billm_block_defect(f, t.data + b * info.block_bytes))
        fail(file_path, ": tensor ", t.name, " (", dtype_name(t.type), ", ", t.shape_string(), ") holds ", defect,
             " in block ", b % std::max<int64_t>(1, blocks_per_row), " of row ", b / std::max<int64_t>(1, blocks_per_row),
             ": the file is corrupt (re-download it or quantize it again)");
  } else if (is_ti8(t.type)) {  // LLM.int8() rows: int8 values, then the f16 scale and outliers
    const int64_t tail = n_in / 32 * ti8_tail(t.type), row_bytes = n_in + tail;
    for (int64_t r = 0; r < t.n_rows(); ++r) {
      const int64_t bad = first_non_finite<uint16_t>(t.data + r * row_bytes + n_in, tail / 2, kF16Exp);
      if (bad >= 0) report(file_path, t, str_cat("in the scale or outliers of row ", r));
    }
  }
}

}  // namespace tern

#pragma once
// Group-wise integer quantization of a weight matrix, the common ground of RTN, GPTQ and AWQ:
// b-bit values with a scale and an integer zero point per (row, group of columns),
// w ~= d * (q - z). The methods differ only in how they choose q (and the weights fed in).
#include <cstdint>
#include <optional>
#include <vector>

#include "quant/quant_tern.h"
#include "core/thread_pool.h"

namespace tern {

struct GroupQuant {
  int bits = 4;
  int64_t group = 128;    // columns per group; the last group of a row may be shorter
  int64_t n_out = 0, n_in = 0;
  std::vector<uint8_t> q;  // [n_out, n_in]
  std::vector<float> d;    // [n_out, n_groups] (f16-representable)
  std::vector<uint8_t> z;  // [n_out, n_groups]

  int64_t n_groups() const { return (n_in + group - 1) / group; }
  // The dequantized weights: [n_out, n_in].
  std::vector<float> dequantize() const;
};

// The group size for rows of n_in: `requested`, or the row length when that is smaller.
int64_t choose_group(int64_t n_in, int64_t requested);

// Round-to-nearest with GPTQ's min-max parameters per group.
GroupQuant rtn_group_quant(const float* w, int64_t n_out, int64_t n_in, int bits, int64_t group, ThreadPool& pool);

// The tern type storing a GroupQuant (TQ{bits}_G{group}); nullopt when the group size is not
// one tern stores (64, 128) or does not divide the rows.
std::optional<DType> group_quant_type(int bits, int64_t group, int64_t n_in);
// Packs into rows of that type: n_out * dtype_row_bytes(type, n_in) bytes.
std::vector<uint8_t> pack_group_quant(const GroupQuant& gq);

}  // namespace tern

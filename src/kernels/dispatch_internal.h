#pragma once
// What the matmul driver (dispatch.cpp), the variant choice (isa.cpp) and the interleaved
// layouts (interleave.cpp) share. Not for use outside src/kernels.
#include "core/dtype.h"
#include "kernels/kernel_iface.h"
#include "kernels/matmul.h"

namespace tern::kern {

// The kernel table of a variant (the reference's for Ref).
const KernelTable& table_of(Isa isa);
// Whether variant `isa` reads weights of `type` interleaved by 16 rows (the traits table in
// interleave.cpp).
bool reads_interleaved(Isa isa, DType type);
// BF16 rows with an even n_in are interleaved by pairs of elements (matmul.h).
bool bf16_pairs(const WeightView& w);

}  // namespace tern::kern

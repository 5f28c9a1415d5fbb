#pragma once
// The AVX2 row-lane tiles of weights interleaved by 16 rows (rowlanes_avx2.cpp), for the AVX2
// table (matmul_avx2.cpp). Include only from *_avx2.cpp.
#include <cstdint>

#include "kernels/kernel_iface.h"

namespace tern::kern {

// Rows [r0, r1) x every token of a.act (a Rows layout), a.w interleaved by 16 rows; the types
// with a tile (Q4_0, Q8_0, Q4_1, Q5_0, Q5_1, MXFP4, Q4_K, Q5_K, Q6_K) are a table by type.
void gemm_interleaved_avx2(const GemmArgs& a, int64_t r0, int64_t r1);

}  // namespace tern::kern

#pragma once
// Internal to train/gemm*.cpp (and its tests): the ISA blocks behind gemm().
//
// Each variant exposes one plain function over plain data, so that baseline code never calls
// an inline function compiled with other ISA flags (the ODR would let the linker keep either
// copy). gemm.cpp owns the tiling, the K blocking and the threads; a block function computes
//
//   C[m][n] (ldc) = (load_c ? C : 0) + sum_{k < kc} A(i, k) * B[k][n] (ldb)
//   A(i, k) = trans_a ? a[k * lda + i] : a[i * lda + k]
//
// for one tile, k in increasing order, one FMA per k into the running C value. That chain is
// what makes results independent of the tiling: a K block ends by storing the f32 sum to C
// and the next reloads it, which is exact, so any split of M, N or K into tiles (and any
// thread count) gives the same bits.
//
// b_pack: scratch for one packed panel of B (kc rows of up to 32 columns, contiguous, so that
// a power-of-two ldb cannot make the panel's rows fight over a few L1 sets), at least
// gemm_pack_floats(kc) floats, 64-byte aligned. Reads and writes stay inside the given matrices (edges use masks, never padding).
#include <cstdint>

#include "kernels/matmul.h"  // Isa

namespace tern::train::detail {

// Register tile of the AVX-512 variant: MR rows x NR columns (NR / 16 zmm per row).
inline constexpr int kAvx512Mr = 12;
inline constexpr int kAvx512Nr = 32;
// AVX2: 16 ymm registers hold 6 rows x 2 ymm of accumulators plus B and a broadcast.
inline constexpr int kAvx2Mr = 6;
inline constexpr int kAvx2Nr = 16;

// Floats of b_pack a block of kc rows needs (either variant: panels are at most 32 wide).
inline constexpr int64_t gemm_pack_floats(int64_t kc) { return kc * 32; }

void gemm_block_avx512(bool trans_a, int64_t m, int64_t n, int64_t kc, const float* a, int64_t lda,
                       const float* b, int64_t ldb, float* c, int64_t ldc, bool load_c, float* b_pack);
void gemm_block_avx2(bool trans_a, int64_t m, int64_t n, int64_t kc, const float* a, int64_t lda,
                     const float* b, int64_t ldb, float* c, int64_t ldc, bool load_c, float* b_pack);

// gemm() with a chosen variant (tests and benchmarks; gemm() passes selected_isa()). Throws
// tern::Error when the CPU cannot run `isa`.
void gemm_isa(Isa isa, ThreadPool* pool, bool trans_a, int64_t M, int64_t N, int64_t K, const float* a, int64_t lda,
              const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate);

}  // namespace tern::train::detail

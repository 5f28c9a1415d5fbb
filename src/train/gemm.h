#pragma once
// f32 matrix products for training (train/): the forward's Y = X W^T and the backward's
// dX = dY W and dW += dY^T X, all written as one row-major product
//
//   C[M][N] (ldc) = (accumulate ? C : 0) + sum_k A(i, k) * B[k][N] (ldb)
//   A(i, k) = trans_a ? a[k * lda + i] : a[i * lda + k]
//
// so the kernel streams rows of B and broadcasts scalars of A (both layouts of A are scalar
// reads). The forward passes W^T (the trainer keeps a transposed copy per optimizer step).
//
// Determinism: every C element is computed by exactly one thread as one chain of FMAs over k
// in increasing order (a K block ends by storing the f32 running sum, the next reloads it), so
// results are bit-identical for any thread count, tiling and schedule; they may differ from
// gemm_ref in the last bits (FMA against separate multiply and add), and the SIMD variants
// are only promised to agree with each other within rounding.
#include <cstdint>

namespace tern {
class ThreadPool;
}

namespace tern::train {

// Scalar reference: plain triple loop, k innermost in increasing order, double accumulation
// is NOT used (f32 as the fast kernels).
void gemm_ref(bool trans_a, int64_t M, int64_t N, int64_t K, const float* a, int64_t lda, const float* b,
              int64_t ldb, float* c, int64_t ldc, bool accumulate);

// The fast kernel for the selected ISA (kernels' selection: TERN_FORCE_ISA honoured), split
// over `pool` (nullptr: the calling thread). Any M, N, K >= 0 (0 is a no-op except that
// accumulate=false with K == 0 zeroes C).
void gemm(ThreadPool* pool, bool trans_a, int64_t M, int64_t N, int64_t K, const float* a, int64_t lda,
          const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate);

// out[c][r] = in[r][c] for an R x C matrix (ld_in >= C, ld_out >= R).
void transpose(ThreadPool* pool, int64_t R, int64_t C, const float* in, int64_t ld_in, float* out, int64_t ld_out);

}  // namespace tern::train

#pragma once
// Matmul kernels of the 2:4 sparse weight formats (quant/quant_sparse.h). The row kernels read
// the compressed blocks directly: per 32 columns 16 values and a 32-bit position word, from
// which each variant computes shuffle controls that gather the activations at the kept columns,
// so decode streams only the compressed bytes. A batch of tokens on a SIMD variant instead
// expands a few rows at a time into the dense type's blocks in L2 and runs the dense GEMM tiles
// on them (sparse24.cpp): still one compressed pass over the weights from memory.
//
//   ts24_q8  x int8 activations quantized per 32 columns (Q8_0's rule, d_x[b] = absmax / 127):
//              y[t][r] = sum_b d_w[b] * d_x[t][b] * sum_k q[b][k] * q_x[t][32b + c_k]
//   ts24_f16 x f32 activations:
//              y[t][r] = sum_b sum_k v[b][k] * x[t][32b + c_k]          (f32 accumulation)
//
// The integer sums are exact in every variant (ref, AVX2, AVX-512 VNNI, NEON), so variants
// differ from the reference only in the order of float additions. matmul() routes these types
// here (kernels/dispatch.cpp).
#include <cstdint>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/matmul.h"

namespace tern {

bool is_sparse24_type(DType t);

// y = W x for a ts24 weight with the row kernels of `isa` (ref, avx2, avx512; the ARM variants
// share one NEON build). Rows not a multiple of 32 fail with tern::Error.
void sparse24_matmul(Isa isa, const WeightView& w, const float* x, int64_t ldx, int64_t n_tokens, float* y,
                     int64_t ldy, ThreadPool& pool);

namespace kern {

// The quantized activations of ts24_q8, per token (stride bytes apart, 64-aligned):
//
//   xu [n_pad] u8 | dxv [n_pad / 128][16] f32          n_pad = n_in rounded up to 128
//
// xu = q_x + 128 (VNNI's vpdpbusd multiplies u8 by s8; the other variants flip the top bit
// back), padding columns hold 128 (q_x = 0). dxv holds the block scales d_x[b] in the lane
// order of the AVX-512 kernel's 32-bit sums over 4 blocks (b = 4c + r): lanes 0,1,4,5: r = 0;
// 2,3,6,7: r = 2; 8,9,12,13: r = 1; 10,11,14,15: r = 3 (padding blocks: 0). The AVX2 kernel
// reads each half as one vector. A block's scale: dxv[(b / 4) * 16 + (b % 2) * 8 + (b / 2 % 2) * 2].
struct Ts24Act {
  int64_t n_pad, off_dxv, stride;
};

// Per-ISA row kernels (plain data + function pointers: ISA translation units call no inline
// function of a shared header, see kernels/kernel_iface.h). Each computes out[t] for one weight
// row and n_tok tokens; scratch: room for sparse24_scratch_bytes(n_in) bytes, 64-aligned.
struct Sparse24Rows {
  // One ts24_q8 row (n_in / 32 blocks of 22 bytes) x n_tok activation rows (Ts24Act layout).
  void (*q8_dots)(const uint8_t* w, int64_t n_in, const uint8_t* act, int64_t stride, int64_t off_dxv, int64_t n_tok,
                  float* out, uint8_t* scratch);
  // One ts24_f16 row (n_in / 32 blocks of 36 bytes) x n_tok f32 rows x (ldx floats apart).
  void (*f16_dots)(const uint8_t* w, int64_t n_in, const float* x, int64_t ldx, int64_t n_tok, float* out,
                   uint8_t* scratch);
};

// Scratch bytes the row kernels may use for one row of n_in (a row prepared once for many tokens).
int64_t sparse24_scratch_bytes(int64_t n_in);

const Sparse24Rows& sparse24_rows_ref();
const Sparse24Rows& sparse24_rows_avx2();
const Sparse24Rows& sparse24_rows_avx512();
const Sparse24Rows& sparse24_rows_neon();  // all three ARM variants

}  // namespace kern
}  // namespace tern

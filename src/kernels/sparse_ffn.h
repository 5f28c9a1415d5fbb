#pragma once
// Sparse FFN kernels for activation sparsity (issue #31: Deja Vu / PowerInfer). A ReLU-fied
// FFN is ReGLU:
//
//   a_j = max(gate_j . xn, 0) * (up_j . xn)        y = sum_j a_j * down[:, j]
//
// and a predictor names the neurons S likely active for a token, so a decode step needs rows
// j in S of ffn_gate and ffn_up and columns j in S of ffn_down. Columns are strided inside
// quantized rows, so the caller keeps down_t [n_ff rows][n_embd] (build_down_t), where column j
// is row j. Reading |S| / n_ff of the FFN's bytes is the way past decode's bandwidth roofline.
//
// Rows are plain row-major copies in F32, F16, Q8_0 or Q4_0 (not interleaved by 16).
//
// Arithmetic, the same in every variant (ref, avx2, avx512, neon: all three ARM variants):
//   * float dots (F32, F16): 16 partial sums p[l] = fma chains over columns 16c + l, reduced as
//     p[l] + p[l + 8], then + [l + 4], + [l + 2], + [l + 1], then the n % 16 tail columns in
//     order by fma. Bit-identical across variants.
//   * quantized dots (Q8_0, Q4_0): x quantized once per call to Q8_0 activations (the dense
//     kernels' Q8_0Rows rule, kernels/kernel_iface.h); per block b an exact int32 sum
//     (Q4_0: nibble . x_q + 8 * nsum_b), then p[b % 8] = fma(float(isum_b), d_w[b] * d_x[b],
//     p[b % 8]) and the 8 lanes reduced as above. Bit-identical across variants; against the
//     dense GEMV (matmul) on the same rows only the float summation order differs (both use
//     the same quantized x and the same exact integer block sums): |diff| <= 1e-5 * sum_i
//     |w_i x_i| in the tests.
//   * axpy (all types): y[i] = fma(coef_k * d_w[block of i], q_i, y[i]) for k in index order
//     (float types: fma(coef_k, w_i, y[i]); Q4_0's q_i = nibble - 8): bit-identical across
//     variants, thread counts and column splits.
// The FMAs are explicit everywhere (std::fma in the reference): GCC contracts a multiply and an
// add of the x86 variants into an FMA by itself (-mfma, -ffp-contract=fast), so a separate
// multiply and add there would not be the reference's arithmetic.
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/matmul.h"

namespace tern {

// Whether the sparse row kernels read `type` (F32, F16, Q8_0, Q4_0).
bool is_sparse_ffn_type(DType type);

// out[k] = dot(row idx[k], x) for k < n_idx. rows: the weight rows, row_bytes apart (at least
// dtype_row_bytes(type, n_in)); x: [n_in] f32. Every idx[k] must be in [0, n_rows): checked
// once per call (tern::Error), as are the type and n_in (a multiple of 32 for Q8_0 / Q4_0).
// Runs on the calling thread.
void sparse_rows_dot(DType type, const void* rows, int64_t row_bytes, int64_t n_rows, int64_t n_in,
                     const int32_t* idx, int64_t n_idx, const float* x, float* out);
// y[0..n_out) += sum_k coef[k] * row idx[k] (rows of down_t, dequantized on the fly, f32
// accumulation in k order). Checks as sparse_rows_dot.
void sparse_rows_axpy(DType type, const void* rows, int64_t row_bytes, int64_t n_rows, int64_t n_out,
                      const int32_t* idx, const float* coef, int64_t n_idx, float* y);

// The weights of one ReGLU FFN for the sparse path (plain row-major copies).
struct SparseFfnWeights {
  DType type = DType::Q4_0;         // gate and up
  int64_t n_embd = 0, n_ff = 0;
  const void* gate = nullptr;       // [n_ff][n_embd] in type
  const void* up = nullptr;         // [n_ff][n_embd] in type
  DType down_t_type = DType::Q4_0;  // F32, F16, Q8_0 or Q4_0
  const void* down_t = nullptr;     // [n_ff][n_embd] in down_t_type (build_down_t)
  // Rows other than n_ff plain rows one after another (models/neuron_store.h: a store's slots,
  // each a neuron's gate, up and down_t rows side by side): the rows idx may name (0: n_ff), and
  // the bytes from one row to the next (0: a plain row of the type).
  int64_t n_rows = 0;
  int64_t gate_up_stride = 0, down_t_stride = 0;
};

// y[0..n_embd) = sum over j in idx of max(gate_j . xn, 0) * (up_j . xn) * down_t[j] (y is
// overwritten; with `accumulate`, added to y: the down rows are added into y in idx order either
// way, so a selection run in pieces, each accumulating, gives the bits of one call over it all). Neurons whose gate is <= 0 skip the up row and the down row (a_j = 0).
// Threads split idx for the dots and n_embd (in blocks of 32) for the down rows, so y is the
// same bits for every thread count. idx: any order, repeats allowed (each counts), checked once.
// Must be called from the thread that owns `pool`.
void sparse_ffn_reglu(const SparseFfnWeights& w, const float* xn, const int32_t* idx, int64_t n_idx, float* y,
                      ThreadPool& pool, bool accumulate = false);

// down_t [n_ff rows][n_embd] in out_type from a row-major down [n_embd rows][n_ff] (WeightView
// of type F32, F16, Q8_0 or Q4_0; interleaved16 rows too). The values are down's
// dequantized ones; out_type F32 keeps them exactly, F16 rounds each to nearest f16 (Q4_0 /
// Q8_0 values d * q carry up to 14 / 18 significant bits, so some round), Q8_0 / Q4_0 re-quantize
// each row of down_t per 32 elements with the codec's rule (quant_traits' from_float: a second
// rounding on top of down's own, across the other axis). n_embd must be a multiple of 32 for
// the quantized out types. Which pays (DISABLED_SparseFfnBench, TinyLlama's shape, AVX-512 and
// AVX2, 1 and 2 threads): down_t in the weights' own Q4_0 / Q8_0 at every sparsity (Q4_0, 80%,
// 1 thread: 0.54 ms against 0.88 ms with F16: the down rows are 3.6x the bytes in F16).
std::vector<uint8_t> build_down_t(const WeightView& down, DType out_type);

// --- variants, for tests and benchmarks -----------------------------------------------------
void sparse_rows_dot_isa(Isa isa, DType type, const void* rows, int64_t row_bytes, int64_t n_rows, int64_t n_in,
                         const int32_t* idx, int64_t n_idx, const float* x, float* out);
void sparse_rows_axpy_isa(Isa isa, DType type, const void* rows, int64_t row_bytes, int64_t n_rows,
                          int64_t n_out, const int32_t* idx, const float* coef, int64_t n_idx, float* y);
void sparse_ffn_reglu_isa(Isa isa, const SparseFfnWeights& w, const float* xn, const int32_t* idx, int64_t n_idx,
                          float* y, ThreadPool& pool, bool accumulate = false);

namespace kern {

// One call of a row kernel (plain data: ISA translation units call no inline function of a
// shared header, see kernel_iface.h). Indices are already checked.
struct SparseDotArgs {
  DType type;
  const uint8_t* rows;  // [n_rows][row_bytes]
  int64_t row_bytes;
  int64_t n_in;
  const int32_t* idx;  // [n_idx]
  int64_t n_idx;
  const float* x;      // [n_in] f32 (F32 / F16)
  const int8_t* xq;    // [n_in] Q8_0 activations (Q8_0 / Q4_0)
  const float* xd;     // [n_in / 32] their scales
  const int32_t* nsum; // [n_in / 32] -sum of each block's xq (Q4_0's -8 offset)
  float* out;          // [n_idx]
};

// y[c0, c1) += sum_k coef[k] * row idx[k][c0, c1); c0, c1 multiples of 32 (or c1 = the row's
// end for the float types).
struct SparseAxpyArgs {
  DType type;
  const uint8_t* rows;  // [n_rows][row_bytes]
  int64_t row_bytes;
  int64_t c0, c1;
  const int32_t* idx;   // [n_idx]
  const float* coef;    // [n_idx]
  int64_t n_idx;
  float* y;             // [n_out], indexed from 0 (not from c0)
};

struct SparseFfnRows {
  void (*dot)(const SparseDotArgs& a);
  void (*axpy)(const SparseAxpyArgs& a);
};

const SparseFfnRows& sparse_ffn_rows_ref();
const SparseFfnRows& sparse_ffn_rows_avx2();
const SparseFfnRows& sparse_ffn_rows_avx512();
const SparseFfnRows& sparse_ffn_rows_neon();  // all three ARM variants (baseline NEON)

}  // namespace kern
}  // namespace tern

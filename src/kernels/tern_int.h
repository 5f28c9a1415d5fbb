#pragma once
// Integer matmul kernels of tern's own weight formats (quant/quant_tern.h):
//
//   TI8* (LLM.int8(), SmoothQuant W8A8): per token, the non-outlier columns of x are quantized
//        to int8 with one absmax scale (vector-wise), the outlier columns are kept in 16 bits:
//          y[t][r] = d_w[r] * d_x[t] * sum_j q_w[r][j] q_x[t][j]  +  sum_i o[r][i] * f16(x[t][c_i])
//        (outlier columns have q_x = 0, so their -128 markers add nothing to the integer sum).
//   TQ*  (GPTQ, AWQ, RTN): x quantized to int8 per 32 columns (d_x[b], as Q8_0 activations);
//        with w = d_g * (q - z) per group g:
//          y[t][r] = sum_g d_g * ( sum_{b in g} d_x[b] * sum_{j in b} q[j] q_x[j]
//                                  - z_g * sum_{b in g} d_x[b] * sum_{j in b} q_x[j] )
//   BILLM_G* (BiLLM, quant/quant_billm.h): x quantized as for TQ; per block of g columns with
//        signs s_j, selector bits e_j, salient flags f_j and magnitudes a_c, a_s, a_1, a_2:
//          y[t][r] = sum_g [ a_c C_g + (a_s - a_c) E_g + a_1 S_g + a_2 R_g ]
//          C_g = sum_{b in g} d_x[b] sum_{j in b, !f_j} s_j q_x[j]        (non-salient)
//          E_g = sum_{b in g} d_x[b] sum_{j in b, !f_j} e_j s_j q_x[j]    (... in the sparse group)
//          S_g = sum_{b in g} d_x[b] sum_{j in b, f_j} s_j q_x[j]         (salient, first sign)
//          R_g = sum_{b in g} d_x[b] sum_{j in b, f_j} (e_j ? -1 : 1) q_x[j]   (residual sign)
//
// The integer sums are exact in every variant (ref, AVX2, AVX-512 VNNI, NEON), so variants differ only in
// the order of float additions. matmul() routes these types here (kernels/dispatch.cpp).
#include <cstdint>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/matmul.h"

namespace tern {

bool is_tern_int_type(DType t);

// y = W x for a TI8*, TQ* or BILLM_G* weight with the row kernels of `isa` (ref, avx2, avx512; the ARM
// variants share one NEON build).
void tern_int_matmul(Isa isa, const WeightView& w, const float* x, int64_t ldx, int64_t n_tokens, float* y,
                     int64_t ldy, ThreadPool& pool);

// LLM.int8()'s decomposition with explicit pieces, for tests and for callers that route columns
// themselves: w_i8 [n_out, n_in] int8 with per-row scales d_w [n_out], outlier columns cols [k]
// (ascending) with 16-bit weights w_o [n_out, k] (f16 bits). Every column in cols is computed in 16 bits,
// the rest in int8 (w_i8's entries in outlier columns are ignored).
void llm_int8_matmul(Isa isa, const int8_t* w_i8, const float* d_w, const int32_t* cols, int64_t k,
                     const uint16_t* w_o, int64_t n_in, int64_t n_out, const float* x, int64_t ldx,
                     int64_t n_tokens, float* y, int64_t ldy, ThreadPool& pool);

namespace kern {

// Per-ISA row kernels (plain data + function pointers: ISA translation units call no inline
// function of a shared header, see kernels/kernel_iface.h).
struct TernIntRows {
  // out[t] = sum_j w[j] * (xu[t][j] - 128) for n_tok activation rows xu (u8, stride bytes
  // apart); w is one int8 row of n_in (a multiple of 32).
  void (*i8_dots)(const int8_t* w, int64_t n_in, const uint8_t* xu, int64_t stride, int64_t n_tok, int32_t* out);
  // out[t] = one TQ row (bits, group) times n_tok activation rows laid out as TqAct.
  void (*tq_dots)(const uint8_t* w, int bits, int group, int64_t n_in, const uint8_t* act, int64_t stride,
                  int64_t off_dxv, int64_t off_xs, int64_t n_tok, float* out);
  // out[t] = one BILLM row (group 64 or 128) times n_tok activation rows laid out as TqAct
  // (only xq and dxv are read).
  void (*billm_dots)(const uint8_t* w, int group, int64_t n_in, const uint8_t* act, int64_t stride,
                     int64_t off_dxv, int64_t n_tok, float* out);
  // Optional (nullptr: tq_dots row by row): rows [r0, r1) of a TQ weight (row_bytes apart) times
  // n_tok activation rows laid out as TqAct, into y[t * ldy + r], in tiles of 16 (AVX-512) or 8
  // (AVX2) rows; false (and nothing written) for a bits / group it has no tiles for.
  bool (*tq_tiles)(const uint8_t* w, int64_t row_bytes, int64_t r0, int64_t r1, int bits, int group, int64_t n_in,
                    const uint8_t* act, int64_t stride, int64_t off_dxv, int64_t off_xs, int64_t n_tok, float* y,
                    int64_t ldy);
  // Optional (nullptr: i8_dots row by row): rows [r0, r1) of a stored TI8 weight (row_bytes
  // apart: n_in int8, f16 d, k f16 outlier weights) times n_tok activation rows laid out as
  // I8Layout (tern_int.cpp), into y[t * ldy + r], 16 rows at a time.
  void (*i8_rows16)(const uint8_t* w, int64_t row_bytes, int64_t r0, int64_t r1, int64_t n_in, int64_t k,
                    const uint8_t* act, int64_t stride, int64_t off_dx, int64_t off_xo, int64_t n_tok, float* y,
                    int64_t ldy);
};

// x86/tern_int_rows16_avx512.cpp: TernIntRows::i8_rows16 of the AVX-512 table.
void i8_rows16_avx512(const uint8_t* w, int64_t row_bytes, int64_t r0, int64_t r1, int64_t n_in, int64_t k,
                      const uint8_t* act, int64_t stride, int64_t off_dx, int64_t off_xo, int64_t n_tok, float* y,
                      int64_t ldy);
// x86/tern_int_rows8_avx2.cpp: TernIntRows::tq_tiles of the AVX2 table (4 and 8 bits).
bool tq_rows8_avx2(const uint8_t* w, int64_t row_bytes, int64_t r0, int64_t r1, int bits, int group, int64_t n_in,
                   const uint8_t* act, int64_t stride, int64_t off_dxv, int64_t off_xs, int64_t n_tok, float* y,
                   int64_t ldy);
// x86/tern_int_rows16_avx512.cpp: TernIntRows::tq_tiles of the AVX-512 table (4 and 8 bits).
bool tq_rows16_avx512(const uint8_t* w, int64_t row_bytes, int64_t r0, int64_t r1, int bits, int group, int64_t n_in,
                      const uint8_t* act, int64_t stride, int64_t off_dxv, int64_t off_xs, int64_t n_tok, float* y,
                      int64_t ldy);

const TernIntRows& tern_int_rows_ref();
const TernIntRows& tern_int_rows_avx2();
const TernIntRows& tern_int_rows_avx512();
const TernIntRows& tern_int_rows_neon();  // all three ARM variants

}  // namespace kern
}  // namespace tern

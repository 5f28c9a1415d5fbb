#pragma once
// BiLLM (Huang et al. 2024, "BiLLM: Pushing the Limit of Post-Training Quantization for LLMs"):
// binarize a linear layer's weights block by block of g columns, GPTQ-style, with the calibration
// Hessian H = X X^T. With U = chol(H^-1) upper triangular, for each block of columns:
//
//   1. saliency of column j:  s_j = sum_i w_ij^2 / U[j][j]^2   (the OBS loss of removing it)
//   2. the k most salient columns (k = 0 .. g/32, the format's slots) are binarized with residual
//      binarization, the others by the split search (quant/quant_billm.h); k is the one with the
//      least squared weight error over the block's rows
//   3. the block's binarization error is pushed onto the columns not yet binarized, one column at
//      a time, as GPTQ does:  e = (w_i - q_i) / U[i][i],  w_j -= e * U[i][j]  for j > i
//
// The salient columns are shared by the rows of a block (they are input features), the magnitudes
// and the split are per row. The result is stored as BILLM_G64 / BILLM_G128 rows.
#include <cstdint>
#include <vector>

#include "core/thread_pool.h"
#include "quant/quant_billm.h"

namespace tern {

struct BillmOptions {
  int group = 128;     // columns per block: 64 or 128 (the format's group)
  double damp = 0.01;  // added to H's diagonal, as a fraction of its mean
  // BiLLM's structured choice: the salient columns shared by every row of a block (k by the
  // block's total error). Off: each row its own, by w_ij^2 / U[j][j]^2 and its own error; the
  // format stores the list per row either way.
  bool shared_salient = false;
};

struct BillmStats {
  double damp_used = 0;
  int64_t dead_columns = 0;
  int64_t salient_columns = 0;  // summed over rows and blocks
  int64_t blocks = 0;
};

// Columns of a block ordered by decreasing Hessian saliency sum_i w_ij^2 / u_diag[j]^2 (ties by
// column). w: [n_out, ld] with the block's g columns at w[.. + 0 .. g); u_diag [g].
std::vector<int> billm_salient_order(const double* w, int64_t n_out, int64_t ld, int g, const double* u_diag);

// w: [n_out, n_in] (n_in a multiple of opts.group); hessian: [n_in, n_in] sum of x x^T. Returns
// the encoded rows (n_out * dtype_row_bytes(billm_type(group), n_in) bytes).
std::vector<uint8_t> billm_quantize(const float* w, int64_t n_out, int64_t n_in, const std::vector<double>& hessian,
                                    const BillmOptions& opts, ThreadPool& pool, BillmStats* stats = nullptr);

// The calibration-free encoders of the same format: BiLLM's binarizers with the salient columns by
// |w| per row and no error compensation (the type's from_float), and plain sign binarization.
std::vector<uint8_t> billm_encode_rows_rtn(const float* w, int64_t n_out, int64_t n_in, int group, ThreadPool& pool);
std::vector<uint8_t> billm_encode_rows_sign(const float* w, int64_t n_out, int64_t n_in, int group, ThreadPool& pool);

}  // namespace tern

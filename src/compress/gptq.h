#pragma once
// GPTQ (Frantar et al., 2022): quantize a linear layer's weights column by column and push each
// column's rounding error onto the columns not yet quantized, weighted by the inverse Hessian of
// the layer-wise objective ||W X - Q X||^2 (H = X X^T over calibration inputs). With
// U = chol(H^-1) upper triangular, for column i of every row:
//
//     q_i   = quant(w_i)                       (group scale/zero fixed at the group's first column)
//     e     = (w_i - q_i) / U[i][i]
//     w_j  -= e * U[i][j]      for j > i      (Optimal Brain Surgeon's update, one column at a time)
//
// Rows are independent given U, so rows are split across the pool.
#include <cstdint>
#include <vector>

#include "compress/group_quant.h"

namespace tern {

struct GptqOptions {
  int bits = 4;
  int64_t group = 128;
  double damp = 0.01;      // added to H's diagonal, as a fraction of its mean
  bool act_order = false;  // quantize columns in order of decreasing H[i][i]
};

struct GptqStats {
  double damp_used = 0;    // the damping that made H positive definite (raised x10 on failure)
  int64_t dead_columns = 0;  // inputs that were always 0: their weights are zeroed
};

// w: [n_out, n_in]; hessian: [n_in, n_in] sum of x x^T over n_tokens calibration tokens.
GroupQuant gptq_quantize(const float* w, int64_t n_out, int64_t n_in, const std::vector<double>& hessian,
                         const GptqOptions& opts, ThreadPool& pool, GptqStats* stats = nullptr);

}  // namespace tern

#pragma once
// Unstructured and semi-structured (N:M) pruning of one linear layer's weights W [n_out, n_in]
// (y = W x), the algorithms `tern prune` and the pruning methods of `tern compare` apply to
// every linear of a model (compress/methods.h). Each returns the pruned weights in place: the
// removed entries set to exactly 0, the others unchanged (magnitude, Wanda) or updated to
// compensate (SparseGPT).
//
//   magnitude   remove the smallest |W_ij| of the whole matrix (the layer-wise baseline)
//   Wanda       (Sun et al., 2023) score |W_ij| * ||X_j||_2 over calibration tokens; remove the
//               lowest scores of each output row, no weight update
//   SparseGPT   (Frantar & Alistarh, 2023) the OBS update of GPTQ with "quantize to 0": columns
//               are visited in order; in each block of `block` columns the mask is chosen by
//               w_ij^2 / U_jj^2 (U = chol(H^-1) upper, H = X X^T) over the block's rows and
//               columns, then every pruned weight's error is pushed onto the later columns:
//                   e = w_ij / U_jj ;  w_ik -= e * U_jk  (k > j)
//
// N:M ("2:4"): n of every m consecutive input weights are KEPT (2:4 keeps half); the choice is
// made per group of m in each row with the same score as the unstructured variant (SparseGPT
// chooses a group when its updated values reach it).
#include <cstdint>
#include <string>
#include <vector>

#include "core/thread_pool.h"

namespace tern {

// What to remove: a fraction of each matrix (unstructured) or n kept of every m (N:M, m > 0).
struct SparsityPattern {
  double sparsity = 0.5;  // unstructured: fraction removed, in (0, 1)
  int n = 0, m = 0;       // N:M: keep n of every m (0 < n < m); m == 0: unstructured

  bool nm() const { return m > 0; }
  double fraction() const { return nm() ? 1.0 - double(n) / double(m) : sparsity; }
  std::string name() const;  // "50%" / "2:4"
};

// Parses "50" / "0.5" (percent or fraction: a sparsity) or "2:4" (N:M); throws tern::Error for
// a sparsity outside (0, 1) or N:M with n >= m, n < 1.
SparsityPattern parse_sparsity(const std::string& s);
// Throws unless rows of n_in fit the pattern (N:M: m divides n_in), naming `what`.
void check_pattern(const SparsityPattern& p, int64_t n_in, const std::string& what);

// The number of weights a row of n_in loses at sparsity s (unstructured, per-row methods).
int64_t pruned_per_row(int64_t n_in, double sparsity);

// Magnitude pruning: unstructured over the whole matrix, or per N:M group.
void prune_magnitude(float* w, int64_t n_out, int64_t n_in, const SparsityPattern& p, ThreadPool& pool);

// Wanda: x_norm [n_in] = ||X_j||_2 over the calibration tokens (any common factor is fine:
// only the order of scores within a row matters).
void prune_wanda(float* w, int64_t n_out, int64_t n_in, const std::vector<double>& x_norm, const SparsityPattern& p,
                 ThreadPool& pool);

struct SparseGptOptions {
  double damp = 0.01;   // added to H's diagonal, as a fraction of its mean
  int64_t block = 128;  // columns whose unstructured mask is chosen together
};

struct SparseGptStats {
  double damp_used = 0;      // the damping that made H positive definite (raised x10 on failure)
  int64_t dead_columns = 0;  // inputs that were always 0: their weights are removed
};

// SparseGPT: hessian [n_in, n_in] = sum x x^T over the calibration tokens.
void prune_sparsegpt(float* w, int64_t n_out, int64_t n_in, const std::vector<double>& hessian,
                     const SparsityPattern& p, const SparseGptOptions& opts, ThreadPool& pool,
                     SparseGptStats* stats = nullptr);

// OWL (Yin et al., 2024): per-layer sparsities from each layer's share of outlier Wanda scores
// (score > m_outlier * the mean score of its matrix). lod[il] is that share; layers with more
// outliers keep more weights. The result averages to `target` (as a plain mean over layers),
// spans at most 2 * lambda, and is clamped to [0, 0.99].
std::vector<double> owl_layer_sparsity(const std::vector<double>& lod, double target, double lambda);
// The outlier share of one matrix's Wanda scores: the fraction of |W_ij| * x_norm_j above
// m_outlier times their mean.
double wanda_outlier_share(const float* w, int64_t n_out, int64_t n_in, const std::vector<double>& x_norm,
                           double m_outlier);

// Fraction of exact zeros in w [n].
double zero_fraction(const float* w, int64_t n);

}  // namespace tern

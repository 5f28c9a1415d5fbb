#pragma once
// Low-rank compression of a model's linear layers (`tern lowrank`, docs/lowrank.md): each
// weight W [n_out, n_in] (y = W x) becomes W' = B A of rank r, B [n_out, r], A [r, n_in].
//   svd:  the truncated SVD of W (Eckart-Young: ||W - W'||_F^2 = the discarded sigma^2).
//   asvd: the truncated SVD of W S, S = chol(H + damp * mean(diag H) * I) with H = sum x x^T
//         over calibration inputs (SVD-LLM's whitening), mapped back by S^-1: it minimises the
//         output error ||(W - W') X||_F instead.
// Both are computed through the eigendecomposition of the smaller Gram matrix (compress/svd.h)
// as a projection, so no division by a singular value is ever needed:
//   n_out <= n_in: U_r = top eigenvectors of M M^T (M = W or W S); B = U_r, A = U_r^T W.
//   n_out >  n_in: V_r = top eigenvectors of M^T M;   B = M V_r,  A = V_r^T S^-1 (S = I: V_r^T).
// A budget picks the ranks: greedily by largest energy (sigma^2) gained per parameter
// (n_in + n_out per unit of rank) over all matrices, never past the rank where the factors cost
// as much as the dense matrix (that matrix stays dense).
//
// Output: factored, blk.N.<stem>.lr_a.weight (ne {n_in, r}) and blk.N.<stem>.lr_b.weight
// (ne {r, n_out}) in place of blk.N.<stem>.weight (models/linear.h runs them as y = B (A x)),
// or merged: B A multiplied back into a dense matrix of the source's type.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "compress/calibrate.h"
#include "compress/quantize.h"
#include "core/dtype.h"
#include "core/thread_pool.h"

namespace tern {

enum class LowRankMethod { Svd, Asvd };

struct LowRankOptions {
  LowRankMethod method = LowRankMethod::Svd;
  double budget = 0;              // fraction of the linears' parameters kept, (0, 1]; or
  int64_t rank = 0;               // a fixed rank for every matrix (> 0)
  bool merge = false;             // write B A as a dense matrix instead of the factors
  std::optional<DType> type;      // factored storage type (default: the source's float type)
  bool relative = false;          // budget by each matrix's energy fraction (sigma^2 / sum sigma^2)
                                  // instead of raw sigma^2 (which starves small-norm matrices)
  double damp = 0.01;             // asvd: fraction of the mean diagonal of H added to it
  CalibOptions calib;             // asvd: the calibration run (hessian is set by the driver)
  int n_threads = 0;              // 0: all cores
  ProgressFn progress;            // optional
};

// What happened to one matrix.
struct LowRankEntry {
  std::string name;
  int64_t n_in = 0, n_out = 0;
  int64_t rank = 0;               // 0: kept dense
  int64_t params_before = 0;      // n_in * n_out
  int64_t params_after = 0;       // r (n_in + n_out), or n_in * n_out when dense
  double rel_error = 0;           // svd: ||W - W'||/||W||; asvd: ||(W - W')S||/||W S|| (output error)
  DType type_a = DType::F32, type_b = DType::F32;  // storage of the factors (merged: the matrix's)
};

struct LowRankReport {
  std::string method;             // "svd", "asvd"
  std::vector<LowRankEntry> entries;
  int64_t params_before = 0, params_after = 0;  // over the linears
  int64_t src_bytes = 0, bytes = 0;             // all tensor data
  double calib_seconds = 0, seconds = 0;
  bool merged = false;
};

// The factors of one matrix: b [n_out, rank], a [rank, n_in], row-major.
struct LowRankFactors {
  int64_t n_in = 0, n_out = 0, rank = 0;
  std::vector<double> a, b;
  std::vector<double> energy;     // the whole spectrum (squared singular values of W or W S), descending
};

// The spectrum (descending sigma^2) of W, or of W S with `hessian` ([n_in, n_in]) given.
std::vector<double> lowrank_spectrum(const float* w, int64_t n_out, int64_t n_in, const std::vector<double>* hessian,
                                     double damp, ThreadPool& pool);
// The rank-`rank` factors of W (svd), or whitened by `hessian` (asvd). w: [n_out, n_in].
LowRankFactors lowrank_factor(const float* w, int64_t n_out, int64_t n_in, int64_t rank,
                              const std::vector<double>* hessian, double damp, ThreadPool& pool);

// The same in two steps, so that a budget's ranks can be chosen between them without a second
// eigendecomposition: the spectrum and the top n_vectors eigenvectors of the smaller Gram matrix
// of W (or W S), then the factors of any rank up to n_vectors.
struct LowRankBasis {
  int64_t n_in = 0, n_out = 0, n_vectors = 0;
  std::vector<double> energy;   // [min(n_out, n_in)] descending
  std::vector<double> vectors;  // [n_vectors, min(n_out, n_in)] eigenvectors as rows
};
LowRankBasis lowrank_basis(const float* w, int64_t n_out, int64_t n_in, int64_t n_vectors,
                           const std::vector<double>* hessian, double damp, ThreadPool& pool);
LowRankFactors lowrank_factor(const float* w, const LowRankBasis& basis, int64_t rank,
                              const std::vector<double>* hessian, double damp, ThreadPool& pool);
// B A: [n_out, n_in].
std::vector<float> lowrank_merge(const LowRankFactors& f);

// Ranks for a parameter budget: spectra[i] (descending energies of matrix i, shapes[i] =
// {n_out, n_in}); keeps at most budget * sum(n_out * n_in) parameters. 0 means dense (chosen
// when the greedy order would take a matrix past the rank where factors cost as much).
std::vector<int64_t> allocate_ranks(const std::vector<std::vector<double>>& spectra,
                                    const std::vector<std::pair<int64_t, int64_t>>& shapes, double budget);

// Compresses IN into OUT. Throws tern::Error on bad options or input (named in the message).
LowRankReport lowrank_model(const std::string& in_path, const std::string& out_path, const LowRankOptions& opts);

}  // namespace tern

#pragma once
// The small dense linear algebra the compression methods need (f64 Cholesky and inverse for
// GPTQ, f32 products for AWQ's search), written plainly and split across a pool by rows.
#include <cstdint>
#include <vector>

#include "core/thread_pool.h"

namespace tern {

// In place: a = L L^T with L lower triangular (the upper triangle is zeroed). a: [n, n].
// Returns false when a is not positive definite.
bool cholesky_lower(std::vector<double>& a, int64_t n);
// The inverse of a symmetric positive definite matrix from its Cholesky factor L.
std::vector<double> inverse_from_cholesky(const std::vector<double>& l, int64_t n, ThreadPool& pool);

// Inputs that are always 0 (H[i][i] == 0) say nothing about their weights: GPTQ and SparseGPT
// drop those weights and set H[i][i] = 1 so that H stays invertible. Returns the dead inputs
// [n] and their count in *n_dead.
std::vector<bool> mark_dead_inputs(std::vector<double>& h, int64_t n, int64_t* n_dead);

// U, upper triangular with U^T U = (H + damp * mean(diag H) * I)^-1: the factor GPTQ and
// SparseGPT walk column by column. A failure (H numerically singular) retries with 10x the
// damping, up to 6 times, then throws naming `who`. *damp_used: the damping that worked.
std::vector<double> inverse_cholesky_upper(const std::vector<double>& h, int64_t n, double damp, ThreadPool& pool,
                                           double* damp_used, const char* who);

// y[t][o] = sum_i x[t][i] * w[o][i]: x [n_t, n_in], w [n_out, n_in], y [n_t, n_out].
void matmul_nt(const float* x, int64_t n_t, const float* w, int64_t n_out, int64_t n_in, float* y,
               ThreadPool& pool);

// ||X W^T - X Q^T||_F^2 over calibration data given as its Gram matrix H = sum_t x_t x_t^T
// ([n_in, n_in]): sum_o d_o^T H d_o with d = w - q. Exact over every calibration token.
double output_error_gram(const float* w, const float* q, int64_t n_out, int64_t n_in,
                         const std::vector<double>& h, ThreadPool& pool);
// The same over sampled rows x [n_t, n_in].
double output_error_samples(const float* w, const float* q, int64_t n_out, int64_t n_in, const float* x,
                            int64_t n_t, ThreadPool& pool);

}  // namespace tern

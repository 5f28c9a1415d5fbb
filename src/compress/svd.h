#pragma once
// Symmetric eigendecomposition and the (thin) SVD built on it, in double, for low-rank
// compression (compress/lowrank.h). The eigensolver is the classic EISPACK pair (Householder
// tridiagonalization tred2, then implicit QL tql2, as in JAMA), with the eigenvector matrix kept
// transposed so that every inner loop runs over contiguous memory, and tql2's rotations, which
// depend on the tridiagonal alone, recorded and applied across the pool by coordinate blocks.
// A 2048 x 2048 Gram matrix takes seconds, where cyclic Jacobi would take minutes.
#include <cstdint>
#include <vector>

#include "core/thread_pool.h"

namespace tern {

// Eigenvalues of the symmetric a [n, n] (row-major; only symmetry is assumed), in descending
// order, into `values` [n]. With `vectors` non-null, the eigenvectors of the first n_vectors
// (< 0: all) as its rows: (*vectors)[i * n + k] is coordinate k of the unit eigenvector of
// values[i]. Fewer than all of a large matrix's vectors come from inverse iteration on the
// tridiagonal form (clusters closer than 1e-3 of the norm re-orthogonalised), all of them from
// the QL rotations.
void sym_eigen(std::vector<double> a, int64_t n, std::vector<double>& values, std::vector<double>* vectors,
               ThreadPool& pool, int64_t n_vectors = -1);

// g = a a^T for a [m, n] row-major: g [m, m] (the Gram matrix of a's rows).
std::vector<double> gram_rows(const double* a, int64_t m, int64_t n, ThreadPool& pool);
// g = a^T a for a [m, n] row-major: g [n, n] (the Gram matrix of a's columns).
std::vector<double> gram_cols(const double* a, int64_t m, int64_t n, ThreadPool& pool);

// The thin SVD a = U diag(s) V^T of a [m, n], k = min(m, n): s [k] descending, u [m, k] and
// v [n, k] row-major with orthonormal columns. From the eigendecomposition of the smaller Gram
// matrix; the other side's vectors are a^T u / s (a singular value below ~1e-8 of the largest
// leaves its partner vector inaccurate, which is what the Gram route costs).
struct Svd {
  int64_t m = 0, n = 0, k = 0;
  std::vector<double> s;  // [k]
  std::vector<double> u;  // [m, k]
  std::vector<double> v;  // [n, k]
};
Svd svd_thin(const std::vector<double>& a, int64_t m, int64_t n, ThreadPool& pool);

}  // namespace tern

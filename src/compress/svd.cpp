#include "compress/svd.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace tern {
namespace {

// One Givens rotation of tql2: rows i and i + 1 of the (transposed) eigenvector matrix.
struct SvdRotation {
  int64_t i;
  double c, s;
};

// Applies recorded rotations, in order, to vt [n, n] (row = eigenvector), by blocks of
// coordinates across the pool: a rotation mixes two rows at every coordinate alike, so the
// blocks are independent, and each block's two-row slices stay in cache.
void apply_rotations(const std::vector<SvdRotation>& rots, double* vt, int64_t n, ThreadPool& pool) {
  if (rots.empty()) return;
  constexpr int64_t kBlock = 64;
  const int64_t n_blocks = (n + kBlock - 1) / kBlock;
  pool.for_chunks(n_blocks, [&](int64_t b, int) {
    const int64_t k0 = b * kBlock, k1 = std::min(n, k0 + kBlock);
    for (const SvdRotation& r : rots) {
      double* x = vt + r.i * n;
      double* y = x + n;
      for (int64_t k = k0; k < k1; ++k) {
        const double h = y[k];
        y[k] = r.s * x[k] + r.c * h;
        x[k] = r.c * x[k] - r.s * h;
      }
    }
  });
}

// Parallel over [0, n) when the work is large enough to pay for a pool region.
template <class Fn>
void maybe_parallel(ThreadPool& pool, int64_t n, int64_t work, Fn&& fn) {
  if (work < (int64_t(1) << 15) || pool.size() == 1) {
    fn(int64_t(0), n, 0);
    return;
  }
  pool.parallel_for(n, fn);
}

// Below this size tql2's rotations of every vector cost little: inverse iteration is for large n.
constexpr int64_t kInverseMinN = 256;

// Eigenvectors of the symmetric tridiagonal T (diagonal d [n], off-diagonal e [n] with
// T(i - 1, i) = e[i]) for its first n_vectors eigenvalues `values` (accurate, from QL), by
// inverse iteration: (T - lambda I) x = y solved with partial pivoting (a zero pivot becomes
// eps * ||T||, which is what makes one or two solves enough), each vector orthogonalised against
// those of eigenvalues closer than 1e-3 ||T|| (LAPACK dstein's clusters). Rows of the result.
std::vector<double> tridiagonal_vectors(const std::vector<double>& d, const std::vector<double>& e,
                                        const std::vector<double>& values, int64_t n_vectors) {
  const int64_t n = int64_t(d.size());
  double tnorm = 0.0;
  for (int64_t i = 0; i < n; ++i)
    tnorm = std::max(tnorm, std::fabs(d[size_t(i)]) + std::fabs(e[size_t(i)]) + (i + 1 < n ? std::fabs(e[size_t(i + 1)]) : 0.0));
  if (tnorm == 0.0) tnorm = 1.0;
  const double tiny = std::ldexp(1.0, -52) * tnorm, cluster = 1e-3 * tnorm;
  std::vector<double> z(size_t(n_vectors * n), 0.0);
  std::vector<double> u0(static_cast<size_t>(n)), u1(static_cast<size_t>(n)), u2(static_cast<size_t>(n)),
      mult(static_cast<size_t>(n));  // LU of T - lambda I
  std::vector<uint8_t> swapped(static_cast<size_t>(n));
  std::vector<double> y(static_cast<size_t>(n));
  uint64_t seed = 0x9e3779b97f4a7c15ull;
  for (int64_t v = 0; v < n_vectors; ++v) {
    const double lambda = values[size_t(v)];
    // Factor: rows k (cur: columns k, k+1, k+2) and k + 1 (nxt), the larger pivot on top.
    double c0 = d[0] - lambda, c1 = n > 1 ? e[1] : 0.0, c2 = 0.0;
    for (int64_t k = 0; k + 1 < n; ++k) {
      double n0 = e[size_t(k + 1)], n1 = d[size_t(k + 1)] - lambda, n2 = k + 2 < n ? e[size_t(k + 2)] : 0.0;
      swapped[size_t(k)] = std::fabs(n0) > std::fabs(c0);
      if (swapped[size_t(k)]) {
        std::swap(c0, n0);
        std::swap(c1, n1);
        std::swap(c2, n2);
      }
      if (c0 == 0.0) c0 = tiny;
      const double m = n0 / c0;
      mult[size_t(k)] = m;
      u0[size_t(k)] = c0;
      u1[size_t(k)] = c1;
      u2[size_t(k)] = c2;
      c0 = n1 - m * c1;
      c1 = n2 - m * c2;
      c2 = 0.0;
    }
    u0[size_t(n - 1)] = c0 == 0.0 ? tiny : c0;
    // A deterministic pseudo-random start (no eigenvector is orthogonal to it in practice).
    for (int64_t k = 0; k < n; ++k) {
      seed ^= seed << 13;
      seed ^= seed >> 7;
      seed ^= seed << 17;
      y[size_t(k)] = double(seed >> 11) * 0x1.0p-53 - 0.5;
    }
    double* x = z.data() + v * n;
    for (int iter = 0; iter < 3; ++iter) {
      for (int64_t k = 0; k + 1 < n; ++k) {
        if (swapped[size_t(k)]) std::swap(y[size_t(k)], y[size_t(k + 1)]);
        y[size_t(k + 1)] -= mult[size_t(k)] * y[size_t(k)];
      }
      for (int64_t k = n - 1; k >= 0; --k) {
        double acc = y[size_t(k)];
        if (k + 1 < n) acc -= u1[size_t(k)] * x[k + 1];
        if (k + 2 < n) acc -= u2[size_t(k)] * x[k + 2];
        x[k] = acc / u0[size_t(k)];
      }
      for (int64_t j = v - 1; j >= 0 && values[size_t(j)] - lambda <= cluster; --j) {
        const double* xj = z.data() + j * n;
        double dot = 0.0;
        for (int64_t k = 0; k < n; ++k) dot += xj[k] * x[k];
        for (int64_t k = 0; k < n; ++k) x[k] -= dot * xj[k];
      }
      double nn = 0.0;
      for (int64_t k = 0; k < n; ++k) nn += x[k] * x[k];
      nn = std::sqrt(nn);
      if (nn == 0.0) fail("eigendecomposition: inverse iteration lost vector ", v, " of ", n);
      for (int64_t k = 0; k < n; ++k) {
        x[k] /= nn;
        y[size_t(k)] = x[k];
      }
    }
  }
  return z;
}

}  // namespace

void sym_eigen(std::vector<double> a, int64_t n, std::vector<double>& values, std::vector<double>* vectors,
               ThreadPool& pool, int64_t n_vectors) {
  TERN_ASSERT(int64_t(a.size()) == n * n);
  values.assign(size_t(n), 0.0);
  if (n_vectors < 0 || n_vectors > n) n_vectors = n;
  if (n == 0) {
    if (vectors) vectors->clear();
    return;
  }
  const bool want = vectors != nullptr;
  // Few of many vectors: inverse iteration on the tridiagonal, then back through tred2's Q, in
  // place of tql2's rotations of all n vectors (most of the time at n = 2048).
  const bool inverse = want && n > kInverseMinN && n_vectors < n;
  const bool rotate = want && !inverse;
  // JAMA's V(r, c) stored transposed: column c of V (an eigenvector at the end) is row c here.
  // a is symmetric, so it is its own transpose to start with.
  std::vector<double>& vt = a;
  const auto V = [&](int64_t r, int64_t c) -> double& { return vt[size_t(c * n + r)]; };
  std::vector<double> d(static_cast<size_t>(n)), e(static_cast<size_t>(n));

  // tred2: Householder reduction to tridiagonal form (d: diagonal, e: sub-diagonal).
  for (int64_t j = 0; j < n; ++j) d[size_t(j)] = V(n - 1, j);
  std::vector<double> d_old(static_cast<size_t>(n));
  for (int64_t i = n - 1; i > 0; --i) {
    double scale = 0.0, h = 0.0;
    for (int64_t k = 0; k < i; ++k) scale += std::fabs(d[size_t(k)]);
    if (scale == 0.0) {
      e[size_t(i)] = d[size_t(i - 1)];
      for (int64_t j = 0; j < i; ++j) {
        d[size_t(j)] = V(i - 1, j);
        V(i, j) = 0.0;
        V(j, i) = 0.0;
      }
    } else {
      for (int64_t k = 0; k < i; ++k) {
        d[size_t(k)] /= scale;
        h += d[size_t(k)] * d[size_t(k)];
      }
      double f = d[size_t(i - 1)];
      double g = std::sqrt(h);
      if (f > 0) g = -g;
      e[size_t(i)] = scale * g;
      h -= f * g;
      d[size_t(i - 1)] = f - g;
      for (int64_t j = 0; j < i; ++j) e[size_t(j)] = 0.0;
      // e = A d over the lower triangle (the serial part: e[k] gathers from every column).
      for (int64_t j = 0; j < i; ++j) {
        f = d[size_t(j)];
        V(j, i) = f;
        g = e[size_t(j)] + V(j, j) * f;
        const double* col = &vt[size_t(j * n)];
        for (int64_t k = j + 1; k <= i - 1; ++k) {
          g += col[k] * d[size_t(k)];
          e[size_t(k)] += col[k] * f;
        }
        e[size_t(j)] = g;
      }
      f = 0.0;
      for (int64_t j = 0; j < i; ++j) {
        e[size_t(j)] /= h;
        f += e[size_t(j)] * d[size_t(j)];
      }
      const double hh = f / (h + h);
      for (int64_t j = 0; j < i; ++j) e[size_t(j)] -= hh * d[size_t(j)];
      // The rank-2 update, column by column (independent: parallel), then d takes row i - 1.
      std::copy(d.begin(), d.begin() + i, d_old.begin());
      maybe_parallel(pool, i, i * i, [&](int64_t j0, int64_t j1, int) {
        for (int64_t j = j0; j < j1; ++j) {
          const double fj = d_old[size_t(j)], gj = e[size_t(j)];
          double* col = &vt[size_t(j * n)];
          for (int64_t k = j; k <= i - 1; ++k) col[k] -= fj * e[size_t(k)] + gj * d_old[size_t(k)];
        }
      });
      for (int64_t j = 0; j < i; ++j) {
        d[size_t(j)] = V(i - 1, j);
        V(i, j) = 0.0;
      }
    }
    d[size_t(i)] = h;
  }
  // Accumulate the transformations (only when the vectors are wanted).
  if (want) {
    for (int64_t i = 0; i < n - 1; ++i) {
      V(n - 1, i) = V(i, i);
      V(i, i) = 1.0;
      const double h = d[size_t(i + 1)];
      if (h != 0.0) {
        const double* ci1 = &vt[size_t((i + 1) * n)];
        for (int64_t k = 0; k <= i; ++k) d[size_t(k)] = ci1[k] / h;
        maybe_parallel(pool, i + 1, (i + 1) * (i + 1), [&](int64_t j0, int64_t j1, int) {
          for (int64_t j = j0; j < j1; ++j) {
            double* cj = &vt[size_t(j * n)];
            double g = 0.0;
            for (int64_t k = 0; k <= i; ++k) g += ci1[k] * cj[k];
            for (int64_t k = 0; k <= i; ++k) cj[k] -= g * d[size_t(k)];
          }
        });
      }
      for (int64_t k = 0; k <= i; ++k) V(k, i + 1) = 0.0;
    }
    for (int64_t j = 0; j < n; ++j) {
      d[size_t(j)] = V(n - 1, j);
      V(n - 1, j) = 0.0;
    }
    V(n - 1, n - 1) = 1.0;
  } else {
    // tred2 leaves the diagonal in the last row as it accumulates; without accumulation the
    // diagonal entries are the V(i, i) the loop above would have moved there.
    for (int64_t j = 0; j < n; ++j) d[size_t(j)] = V(j, j);
  }
  e[0] = 0.0;
  const std::vector<double> d0 = d, e0 = e;  // the tridiagonal: T(i, i) = d0[i], T(i - 1, i) = e0[i]

  // tql2: implicit QL on the tridiagonal; the rotations are recorded and applied in batches.
  for (int64_t i = 1; i < n; ++i) e[size_t(i - 1)] = e[size_t(i)];
  e[size_t(n - 1)] = 0.0;
  std::vector<SvdRotation> rots;
  double f = 0.0, tst1 = 0.0;
  const double eps = std::ldexp(1.0, -52);
  for (int64_t l = 0; l < n; ++l) {
    tst1 = std::max(tst1, std::fabs(d[size_t(l)]) + std::fabs(e[size_t(l)]));
    int64_t m = l;
    while (m < n) {
      if (std::fabs(e[size_t(m)]) <= eps * tst1) break;
      ++m;
    }
    if (m > l) {
      int iter = 0;
      do {
        if (++iter > 200) fail("eigendecomposition: QL iteration did not converge (n = ", n, ")");
        double g = d[size_t(l)];
        double p = (d[size_t(l + 1)] - g) / (2.0 * e[size_t(l)]);
        double r = std::hypot(p, 1.0);
        if (p < 0) r = -r;
        d[size_t(l)] = e[size_t(l)] / (p + r);
        d[size_t(l + 1)] = e[size_t(l)] * (p + r);
        const double dl1 = d[size_t(l + 1)];
        double h = g - d[size_t(l)];
        for (int64_t i = l + 2; i < n; ++i) d[size_t(i)] -= h;
        f += h;
        p = d[size_t(m)];
        double c = 1.0, c2 = c, c3 = c;
        const double el1 = e[size_t(l + 1)];
        double s = 0.0, s2 = 0.0;
        for (int64_t i = m - 1; i >= l; --i) {
          c3 = c2;
          c2 = c;
          s2 = s;
          g = c * e[size_t(i)];
          h = c * p;
          r = std::hypot(p, e[size_t(i)]);
          e[size_t(i + 1)] = s * r;
          s = e[size_t(i)] / r;
          c = p / r;
          p = c * d[size_t(i)] - s * g;
          d[size_t(i + 1)] = h + s * (c * g + s * d[size_t(i)]);
          if (rotate) rots.push_back(SvdRotation{i, c, s});
        }
        p = -s * s2 * c3 * el1 * e[size_t(l)] / dl1;
        e[size_t(l)] = s * p;
        d[size_t(l)] = c * p;
      } while (std::fabs(e[size_t(l)]) > eps * tst1);
    }
    d[size_t(l)] += f;
    e[size_t(l)] = 0.0;
    if (rots.size() > (size_t(1) << 16)) {
      apply_rotations(rots, vt.data(), n, pool);
      rots.clear();
    }
  }
  if (rotate) apply_rotations(rots, vt.data(), n, pool);

  // Descending order.
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return d[size_t(x)] > d[size_t(y)]; });
  for (int64_t i = 0; i < n; ++i) values[size_t(i)] = d[size_t(order[size_t(i)])];
  if (rotate) {
    vectors->assign(size_t(n_vectors * n), 0.0);
    for (int64_t i = 0; i < n_vectors; ++i)
      std::copy_n(vt.data() + order[size_t(i)] * n, n, vectors->data() + i * n);
  } else if (inverse) {
    const std::vector<double> z = tridiagonal_vectors(d0, e0, values, n_vectors);  // [n_vectors, n]
    // x_i = Q z_i: vt's row c is Q's column c.
    vectors->assign(size_t(n_vectors * n), 0.0);
    pool.parallel_for(n_vectors, [&](int64_t i0, int64_t i1, int) {
      for (int64_t i = i0; i < i1; ++i) {
        double* x = vectors->data() + i * n;
        const double* zi = z.data() + i * n;
        for (int64_t c = 0; c < n; ++c) {
          const double zc = zi[c];
          if (zc == 0.0) continue;
          const double* q = vt.data() + c * n;
          for (int64_t k = 0; k < n; ++k) x[k] += zc * q[k];
        }
      }
    });
  }
}

std::vector<double> gram_rows(const double* a, int64_t m, int64_t n, ThreadPool& pool) {
  std::vector<double> g(size_t(m * m));
  // Row pairs (i, j <= i); the rows are interleaved across chunks so every chunk gets a share
  // of the long and the short triangle rows.
  const int64_t n_chunks = std::max<int64_t>(1, std::min<int64_t>(m, 4 * int64_t(pool.size())));
  pool.for_chunks(n_chunks, [&](int64_t c, int) {
    for (int64_t i = c; i < m; i += n_chunks) {
      const double* ai = a + i * n;
      for (int64_t j = 0; j <= i; ++j) {
        const double* aj = a + j * n;
        double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        int64_t k = 0;
        for (; k + 4 <= n; k += 4) {
          s0 += ai[k] * aj[k];
          s1 += ai[k + 1] * aj[k + 1];
          s2 += ai[k + 2] * aj[k + 2];
          s3 += ai[k + 3] * aj[k + 3];
        }
        for (; k < n; ++k) s0 += ai[k] * aj[k];
        g[size_t(i * m + j)] = g[size_t(j * m + i)] = (s0 + s1) + (s2 + s3);
      }
    }
  });
  return g;
}

std::vector<double> gram_cols(const double* a, int64_t m, int64_t n, ThreadPool& pool) {
  // Through the transpose: the row kernel reads contiguous memory.
  std::vector<double> t(size_t(m * n));
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < n; ++c) t[size_t(c * m + r)] = a[r * n + c];
  return gram_rows(t.data(), n, m, pool);
}

Svd svd_thin(const std::vector<double>& a, int64_t m, int64_t n, ThreadPool& pool) {
  TERN_ASSERT(int64_t(a.size()) == m * n);
  Svd r;
  r.m = m;
  r.n = n;
  r.k = std::min(m, n);
  const int64_t k = r.k;
  const bool rows = m <= n;  // eigendecompose the smaller Gram matrix
  std::vector<double> lambda, vec;  // vec [k, k]: eigenvectors as rows
  sym_eigen(rows ? gram_rows(a.data(), m, n, pool) : gram_cols(a.data(), m, n, pool), k, lambda, &vec, pool, k);
  r.s.resize(size_t(k));
  for (int64_t i = 0; i < k; ++i) r.s[size_t(i)] = std::sqrt(std::max(0.0, lambda[size_t(i)]));
  r.u.assign(size_t(m * k), 0.0);
  r.v.assign(size_t(n * k), 0.0);
  // The small side's vectors are the eigenvectors; the other side's: a^T u / s or a v / s.
  std::vector<double>& small = rows ? r.u : r.v;
  std::vector<double>& other = rows ? r.v : r.u;
  const int64_t n_small = rows ? m : n, n_other = rows ? n : m;
  for (int64_t i = 0; i < k; ++i)
    for (int64_t x = 0; x < n_small; ++x) small[size_t(x * k + i)] = vec[size_t(i * k + x)];
  pool.parallel_for(n_other, [&](int64_t y0, int64_t y1, int) {
    for (int64_t y = y0; y < y1; ++y)
      for (int64_t i = 0; i < k; ++i) {
        const double si = r.s[size_t(i)];
        if (si == 0.0) continue;
        double acc = 0.0;
        for (int64_t x = 0; x < n_small; ++x) {
          const double axy = rows ? a[size_t(x * n + y)] : a[size_t(y * n + x)];
          acc += axy * small[size_t(x * k + i)];
        }
        other[size_t(y * k + i)] = acc / si;
      }
  });
  return r;
}

}  // namespace tern

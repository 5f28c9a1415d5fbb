#include "compress/linalg.h"

#include <cmath>

#include "core/error.h"

namespace tern {

bool cholesky_lower(std::vector<double>& a, int64_t n) {
  // Column-oriented (left-looking) Cholesky: row j of L from the rows above it.
  for (int64_t j = 0; j < n; ++j) {
    double* aj = a.data() + j * n;
    for (int64_t k = 0; k < j; ++k) {
      const double* ak = a.data() + k * n;
      double s = aj[k];
      for (int64_t m = 0; m < k; ++m) s -= aj[m] * ak[m];
      aj[k] = s / ak[k];
    }
    double d = aj[j];
    for (int64_t m = 0; m < j; ++m) d -= aj[m] * aj[m];
    if (!(d > 0.0) || !std::isfinite(d)) return false;
    aj[j] = std::sqrt(d);
    for (int64_t m = j + 1; m < n; ++m) aj[m] = 0.0;
  }
  return true;
}

std::vector<double> inverse_from_cholesky(const std::vector<double>& l, int64_t n, ThreadPool& pool) {
  // L^-1 column by column (forward substitution), then A^-1 = L^-T L^-1.
  std::vector<double> li(size_t(n * n), 0.0);  // [n, n] lower: li[i][j], i >= j
  pool.parallel_for(n, [&](int64_t c0, int64_t c1, int) {
    for (int64_t c = c0; c < c1; ++c) {
      li[size_t(c * n + c)] = 1.0 / l[size_t(c * n + c)];
      for (int64_t i = c + 1; i < n; ++i) {
        double s = 0.0;
        for (int64_t k = c; k < i; ++k) s -= l[size_t(i * n + k)] * li[size_t(k * n + c)];
        li[size_t(i * n + c)] = s / l[size_t(i * n + i)];
      }
    }
  });
  std::vector<double> inv(size_t(n * n), 0.0);
  pool.parallel_for(n, [&](int64_t i0, int64_t i1, int) {
    for (int64_t i = i0; i < i1; ++i)
      for (int64_t j = 0; j <= i; ++j) {
        // (L^-T L^-1)[i][j] = sum_k li[k][i] li[k][j], k >= max(i, j) = i
        double s = 0.0;
        for (int64_t k = i; k < n; ++k) s += li[size_t(k * n + i)] * li[size_t(k * n + j)];
        inv[size_t(i * n + j)] = s;
      }
  });
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = i + 1; j < n; ++j) inv[size_t(i * n + j)] = inv[size_t(j * n + i)];
  return inv;
}

std::vector<bool> mark_dead_inputs(std::vector<double>& h, int64_t n, int64_t* n_dead) {
  std::vector<bool> dead(size_t(n), false);
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i)
    if (h[size_t(i * n + i)] == 0.0) {
      dead[size_t(i)] = true;
      h[size_t(i * n + i)] = 1.0;
      ++count;
    }
  if (n_dead) *n_dead = count;
  return dead;
}

std::vector<double> inverse_cholesky_upper(const std::vector<double>& h, int64_t n, double damp, ThreadPool& pool,
                                           double* damp_used, const char* who) {
  double mean_diag = 0;
  for (int64_t i = 0; i < n; ++i) mean_diag += h[size_t(i * n + i)];
  mean_diag /= double(n);
  for (int attempt = 0;; ++attempt) {
    std::vector<double> a = h;
    for (int64_t i = 0; i < n; ++i) a[size_t(i * n + i)] += damp * mean_diag;
    if (cholesky_lower(a, n)) {
      std::vector<double> inv = inverse_from_cholesky(a, n, pool);
      if (cholesky_lower(inv, n)) {  // inv = L L^T, so U = L^T
        std::vector<double> u(size_t(n * n), 0.0);
        for (int64_t i = 0; i < n; ++i)
          for (int64_t j = i; j < n; ++j) u[size_t(i * n + j)] = inv[size_t(j * n + i)];
        if (damp_used) *damp_used = damp;
        return u;
      }
    }
    if (attempt >= 6) fail(who, ": the calibration Hessian is not positive definite even with damping ", damp);
    damp = damp > 0 ? damp * 10 : 1e-4;
  }
}

void matmul_nt(const float* x, int64_t n_t, const float* w, int64_t n_out, int64_t n_in, float* y,
               ThreadPool& pool) {
  pool.parallel_for(n_out, [&](int64_t o0, int64_t o1, int) {
    for (int64_t t = 0; t < n_t; ++t) {
      const float* xt = x + t * n_in;
      for (int64_t o = o0; o < o1; ++o) {
        const float* wo = w + o * n_in;
        float s = 0.0f;
        for (int64_t i = 0; i < n_in; ++i) s += xt[i] * wo[i];
        y[t * n_out + o] = s;
      }
    }
  });
}

double output_error_gram(const float* w, const float* q, int64_t n_out, int64_t n_in,
                         const std::vector<double>& h, ThreadPool& pool) {
  std::vector<double> part(size_t(pool.size()), 0.0);
  pool.parallel_for(n_out, [&](int64_t o0, int64_t o1, int c) {
    std::vector<double> d(static_cast<size_t>(n_in));
    double acc = 0.0;
    for (int64_t o = o0; o < o1; ++o) {
      for (int64_t i = 0; i < n_in; ++i) d[size_t(i)] = double(w[o * n_in + i]) - double(q[o * n_in + i]);
      for (int64_t i = 0; i < n_in; ++i) {
        if (d[size_t(i)] == 0.0) continue;
        const double* hi = h.data() + i * n_in;
        double s = 0.0;
        for (int64_t j = 0; j < n_in; ++j) s += hi[j] * d[size_t(j)];
        acc += d[size_t(i)] * s;
      }
    }
    part[size_t(c)] += acc;
  });
  double total = 0.0;
  for (double p : part) total += p;
  return total;
}

double output_error_samples(const float* w, const float* q, int64_t n_out, int64_t n_in, const float* x,
                            int64_t n_t, ThreadPool& pool) {
  std::vector<double> part(size_t(pool.size()), 0.0);
  pool.parallel_for(n_out, [&](int64_t o0, int64_t o1, int c) {
    double acc = 0.0;
    for (int64_t o = o0; o < o1; ++o)
      for (int64_t t = 0; t < n_t; ++t) {
        const float* xt = x + t * n_in;
        double s = 0.0;
        for (int64_t i = 0; i < n_in; ++i) s += double(xt[i]) * (double(w[o * n_in + i]) - double(q[o * n_in + i]));
        acc += s * s;
      }
    part[size_t(c)] += acc;
  });
  double total = 0.0;
  for (double p : part) total += p;
  return total;
}

}  // namespace tern

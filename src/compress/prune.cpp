#include "compress/prune.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>

#include "compress/linalg.h"
#include "core/error.h"

namespace tern {
namespace {

// Leaves in idx[0..k) the indices of the k smallest of score[0..n) (ties: the lower index first,
// so the result does not depend on the selection algorithm).
void lowest_indices(const double* score, int64_t n, int64_t k, std::vector<int32_t>& idx) {
  idx.resize(size_t(n));
  std::iota(idx.begin(), idx.end(), 0);
  auto less = [&](int32_t a, int32_t b) { return score[a] < score[b] || (score[a] == score[b] && a < b); };
  if (k > 0 && k < n) std::nth_element(idx.begin(), idx.begin() + k, idx.end(), less);
}

// Sets to 0 the k entries of w[0..n) with the smallest score.
void zero_lowest(float* w, const double* score, int64_t n, int64_t k, std::vector<int32_t>& idx) {
  if (k <= 0) return;
  lowest_indices(score, n, k, idx);
  for (int64_t i = 0; i < std::min(k, n); ++i) w[idx[size_t(i)]] = 0.0f;
}

// Per row and per N:M group, or per row at the unstructured per-row count: zero the lowest
// scores. score(row, j) fills s [n_in].
template <class ScoreFn>
void prune_rows(float* w, int64_t n_out, int64_t n_in, const SparsityPattern& p, ThreadPool& pool, ScoreFn score) {
  const int64_t k_row = p.nm() ? 0 : pruned_per_row(n_in, p.sparsity);
  pool.parallel_for(n_out, [&](int64_t o0, int64_t o1, int) {
    std::vector<double> s(static_cast<size_t>(n_in));  // [n_in] scores of one row
    std::vector<int32_t> idx;
    for (int64_t o = o0; o < o1; ++o) {
      float* row = w + o * n_in;
      score(row, s.data());
      if (p.nm()) {
        for (int64_t g = 0; g < n_in; g += p.m) zero_lowest(row + g, s.data() + g, p.m, p.m - p.n, idx);
      } else {
        zero_lowest(row, s.data(), n_in, k_row, idx);
      }
    }
  });
}

}  // namespace

std::string SparsityPattern::name() const {
  if (nm()) return str_cat(n, ":", m);
  return str_cat(std::lround(sparsity * 1000) % 10 == 0 ? std::to_string(std::lround(sparsity * 100))
                                                        : std::to_string(sparsity * 100),
                 "%");
}

SparsityPattern parse_sparsity(const std::string& s) {
  SparsityPattern p;
  if (const size_t colon = s.find(':'); colon != std::string::npos) {
    char* e1 = nullptr;
    char* e2 = nullptr;
    const std::string a = s.substr(0, colon), b = s.substr(colon + 1);
    const long n = std::strtol(a.c_str(), &e1, 10), m = std::strtol(b.c_str(), &e2, 10);
    if (a.empty() || b.empty() || *e1 || *e2) fail("bad N:M pattern '", s, "' (expected e.g. 2:4)");
    if (n < 1 || m < 2 || n >= m || m > 64)
      fail("bad N:M pattern '", s, "': keep N of every M needs 1 <= N < M <= 64 (e.g. 2:4, 4:8)");
    p.n = int(n);
    p.m = int(m);
    return p;
  }
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end || !std::isfinite(v)) fail("bad sparsity '", s, "' (expected a fraction like 0.5, 50, or N:M)");
  if (v >= 1.0) v /= 100.0;  // "50" is percent
  if (!(v > 0.0 && v < 1.0)) fail("sparsity ", s, " is outside (0, 1): give a fraction (0.5), a percent (50) or N:M (2:4)");
  p.sparsity = v;
  return p;
}

void check_pattern(const SparsityPattern& p, int64_t n_in, const std::string& what) {
  if (p.nm() && n_in % p.m != 0)
    fail(what, ": rows of ", n_in, " do not split into groups of ", p.m, " for ", p.name(), " sparsity");
}

int64_t pruned_per_row(int64_t n_in, double sparsity) { return int64_t(std::floor(double(n_in) * sparsity)); }

void prune_magnitude(float* w, int64_t n_out, int64_t n_in, const SparsityPattern& p, ThreadPool& pool) {
  check_pattern(p, n_in, "magnitude pruning");
  if (p.nm()) {
    prune_rows(w, n_out, n_in, p, pool, [&](const float* row, double* s) {
      for (int64_t j = 0; j < n_in; ++j) s[j] = std::fabs(row[j]);
    });
    return;
  }
  // Layer-wise: one threshold for the whole matrix.
  const int64_t n = n_out * n_in;
  std::vector<double> s(static_cast<size_t>(n));  // [n_out * n_in] |w|
  for (int64_t i = 0; i < n; ++i) s[size_t(i)] = std::fabs(double(w[i]));
  std::vector<int32_t> idx;
  zero_lowest(w, s.data(), n, int64_t(std::floor(double(n) * p.sparsity)), idx);
}

void prune_wanda(float* w, int64_t n_out, int64_t n_in, const std::vector<double>& x_norm, const SparsityPattern& p,
                 ThreadPool& pool) {
  check_pattern(p, n_in, "wanda");
  if (int64_t(x_norm.size()) != n_in) fail("wanda: ", x_norm.size(), " input norms for rows of ", n_in);
  prune_rows(w, n_out, n_in, p, pool, [&](const float* row, double* s) {
    for (int64_t j = 0; j < n_in; ++j) s[j] = std::fabs(double(row[j])) * x_norm[size_t(j)];
  });
}

void prune_sparsegpt(float* w, int64_t n_out, int64_t n_in, const std::vector<double>& hessian,
                     const SparsityPattern& p, const SparseGptOptions& opts, ThreadPool& pool, SparseGptStats* stats) {
  check_pattern(p, n_in, "sparsegpt");
  if (int64_t(hessian.size()) != n_in * n_in) fail("sparsegpt: the Hessian is not ", n_in, " x ", n_in);
  if (opts.damp < 0) fail("--damp must be >= 0");
  if (opts.block <= 0) fail("sparsegpt: the block size must be positive");
  std::vector<double> h = hessian;
  int64_t n_dead = 0;
  const std::vector<bool> dead = mark_dead_inputs(h, n_in, &n_dead);
  double damp = opts.damp;
  const std::vector<double> u = inverse_cholesky_upper(h, n_in, opts.damp, pool, &damp, "sparsegpt");  // U^T U = H^-1

  std::vector<double> wd(static_cast<size_t>(n_out * n_in));  // [n_out, n_in] working copy, updated in place
  for (int64_t o = 0; o < n_out; ++o)
    for (int64_t j = 0; j < n_in; ++j) wd[size_t(o * n_in + j)] = dead[size_t(j)] ? 0.0 : double(w[o * n_in + j]);
  std::vector<uint8_t> pruned(static_cast<size_t>(n_out * n_in), 0);  // [n_out, n_in] 1: removed

  for (int64_t b0 = 0; b0 < n_in; b0 += opts.block) {
    const int64_t b1 = std::min(n_in, b0 + opts.block), nb = b1 - b0;
    if (!p.nm()) {
      // The block's mask, over all its rows and columns at once, from the values the earlier
      // blocks' updates left: the exact count, so the matrix ends at the requested sparsity.
      std::vector<double> s(static_cast<size_t>(n_out * nb));  // [n_out, nb]
      for (int64_t o = 0; o < n_out; ++o)
        for (int64_t j = b0; j < b1; ++j) {
          const double d = u[size_t(j * n_in + j)], v = wd[size_t(o * n_in + j)];
          s[size_t(o * nb + j - b0)] = v * v / (d * d);
        }
      const int64_t k = int64_t(std::floor(double(n_out * nb) * p.sparsity));
      std::vector<int64_t> idx(static_cast<size_t>(n_out * nb));
      std::iota(idx.begin(), idx.end(), 0);
      auto less = [&](int64_t a, int64_t c) { return s[size_t(a)] < s[size_t(c)] || (s[size_t(a)] == s[size_t(c)] && a < c); };
      if (k < int64_t(idx.size())) std::nth_element(idx.begin(), idx.begin() + k, idx.end(), less);
      for (int64_t i = 0; i < k; ++i) {
        const int64_t o = idx[size_t(i)] / nb, j = b0 + idx[size_t(i)] % nb;
        pruned[size_t(o * n_in + j)] = 1;
      }
    }
    // Rows are independent given U and the mask: each removes its block's pruned weights one
    // column at a time and pushes the error onto every later column.
    pool.parallel_for(n_out, [&](int64_t o0, int64_t o1, int) {
      std::vector<double> sc(static_cast<size_t>(std::max(p.m, 1)));  // [m] scores of one N:M group
      std::vector<int32_t> gi;
      for (int64_t o = o0; o < o1; ++o) {
        double* row = wd.data() + o * n_in;
        uint8_t* mask = pruned.data() + o * n_in;
        for (int64_t j = b0; j < b1; ++j) {
          if (p.nm() && (j % p.m) == 0) {
            // The group's weights as the updates so far left them decide which ones go.
            for (int64_t t = 0; t < p.m; ++t) {
              const double d = u[size_t((j + t) * n_in + j + t)], v = row[j + t];
              sc[size_t(t)] = v * v / (d * d);
            }
            lowest_indices(sc.data(), p.m, p.m - p.n, gi);
            for (int64_t t = 0; t < p.m - p.n; ++t) mask[j + gi[size_t(t)]] = 1;
          }
          if (!mask[j] && !dead[size_t(j)]) continue;
          const double* uj = u.data() + j * n_in;
          const double e = row[j] / uj[j];
          row[j] = 0.0;
          for (int64_t c = j + 1; c < n_in; ++c) row[c] -= e * uj[c];
        }
      }
    });
  }
  for (int64_t o = 0; o < n_out; ++o)
    for (int64_t j = 0; j < n_in; ++j) {
      const size_t i = size_t(o * n_in + j);
      w[i] = pruned[i] || dead[size_t(j)] ? 0.0f : float(wd[i]);
    }
  if (stats) {
    stats->damp_used = damp;
    stats->dead_columns = n_dead;
  }
}

double wanda_outlier_share(const float* w, int64_t n_out, int64_t n_in, const std::vector<double>& x_norm,
                           double m_outlier) {
  const int64_t n = n_out * n_in;
  if (n == 0) return 0;
  double sum = 0;
  for (int64_t o = 0; o < n_out; ++o)
    for (int64_t j = 0; j < n_in; ++j) sum += std::fabs(double(w[o * n_in + j])) * x_norm[size_t(j)];
  const double thr = m_outlier * sum / double(n);
  int64_t count = 0;
  for (int64_t o = 0; o < n_out; ++o)
    for (int64_t j = 0; j < n_in; ++j) count += std::fabs(double(w[o * n_in + j])) * x_norm[size_t(j)] > thr;
  return double(count) / double(n);
}

std::vector<double> owl_layer_sparsity(const std::vector<double>& lod, double target, double lambda) {
  const size_t n = lod.size();
  std::vector<double> s(n, target);
  if (n == 0) return s;
  const auto [lo, hi] = std::minmax_element(lod.begin(), lod.end());
  if (*hi - *lo <= 0) return s;
  // Kept fraction: (LOD - min) scaled to [0, 2 lambda], centred on 1 - target.
  std::vector<double> keep(n);
  double mean = 0;
  for (size_t i = 0; i < n; ++i) {
    keep[i] = (lod[i] - *lo) / (*hi - *lo) * 2.0 * lambda;
    mean += keep[i] / double(n);
  }
  for (size_t i = 0; i < n; ++i) s[i] = std::clamp(1.0 - (keep[i] - mean + (1.0 - target)), 0.0, 0.99);
  return s;
}

double zero_fraction(const float* w, int64_t n) {
  int64_t z = 0;
  for (int64_t i = 0; i < n; ++i) z += w[i] == 0.0f;
  return n > 0 ? double(z) / double(n) : 0.0;
}

}  // namespace tern

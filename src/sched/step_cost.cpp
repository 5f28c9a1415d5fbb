#include "sched/step_cost.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace tern {

double StepShape::kpairs(int64_t n_past, int64_t n_tokens) {
  // sum over i < n_tokens of (n_past + i + 1)
  const double n = double(n_tokens);
  return (n * double(n_past) + n * (n + 1) / 2) / 1000.0;
}

void StepShape::add(int64_t n_past, int64_t n, bool sampled) {
  ++n_seqs;
  n_tokens += n;
  n_sampled += sampled ? 1 : 0;
  attn_kpairs += kpairs(n_past, n);
}

void StepShape::remove(int64_t n_past, int64_t n, bool sampled) {
  --n_seqs;
  n_tokens -= n;
  n_sampled -= sampled ? 1 : 0;
  attn_kpairs = std::max(0.0, attn_kpairs - kpairs(n_past, n));
}

StepCostModel::StepCostModel(int window) : window_(window) {
  TERN_ASSERT(window > 0);
  recent_.reserve(size_t(window));
  errors_.reserve(size_t(window));
}

std::array<double, StepCostModel::kFeatures> StepCostModel::features(const StepShape& s) {
  return {1.0, double(s.n_tokens), double(s.n_sampled), s.attn_kpairs};
}

double StepCostModel::predict_ms(const StepShape& s) const {
  if (!ready_) return 0;
  const auto x = features(s);
  double t = 0;
  for (int j = 0; j < kFeatures; ++j) t += coefs_[size_t(j)] * x[size_t(j)];
  return t;
}

void StepCostModel::observe_anchor(const StepShape& s, double ms) {
  if (!(ms >= 0) || !std::isfinite(ms)) return;
  anchors_.push_back({features(s), ms});
  ++n_observed_;
  refit();
}

void StepCostModel::observe(const StepShape& s, double ms) {
  if (!(ms >= 0) || !std::isfinite(ms)) return;
  if (ready_ && ms > 0) {
    const double err = std::fabs(predict_ms(s) - ms) / ms;
    if (errors_.size() < size_t(window_)) errors_.push_back(err);
    else errors_[next_err_] = err;
    next_err_ = (next_err_ + 1) % size_t(window_);
  }
  const Obs o{features(s), ms};
  if (recent_.size() < size_t(window_)) recent_.push_back(o);
  else recent_[next_] = o;
  next_ = (next_ + 1) % size_t(window_);
  ++n_observed_;
  refit();
}

static double percentile_of(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double r = p / 100.0 * double(v.size() - 1);
  const size_t lo = size_t(std::floor(r)), hi = size_t(std::ceil(r));
  return v[lo] + (v[hi] - v[lo]) * (r - double(lo));
}

double StepCostModel::rel_error_p50() const { return percentile_of(errors_, 50); }
double StepCostModel::rel_error_p90() const { return percentile_of(errors_, 90); }

namespace {

constexpr int kF = StepCostModel::kFeatures;
using Mat = std::array<std::array<double, kF>, kF>;
using Vec = std::array<double, kF>;

// Solves the normal equations restricted to the features in `mask` (Gaussian elimination with
// partial pivoting; the Gram matrix is scaled and regularized, so it is well conditioned).
// Features outside the mask are 0. Returns false when singular.
bool solve_subset(const Mat& g, const Vec& b, unsigned mask, Vec& out) {
  int idx[kF], m = 0;
  for (int j = 0; j < kF; ++j)
    if (mask & (1u << j)) idx[m++] = j;
  double a[kF][kF + 1];
  for (int r = 0; r < m; ++r) {
    for (int c = 0; c < m; ++c) a[r][c] = g[size_t(idx[r])][size_t(idx[c])];
    a[r][m] = b[size_t(idx[r])];
  }
  for (int c = 0; c < m; ++c) {
    int piv = c;
    for (int r = c + 1; r < m; ++r)
      if (std::fabs(a[r][c]) > std::fabs(a[piv][c])) piv = r;
    if (std::fabs(a[piv][c]) < 1e-12) return false;
    if (piv != c)
      for (int k = 0; k <= m; ++k) std::swap(a[c][k], a[piv][k]);
    for (int r = 0; r < m; ++r) {
      if (r == c) continue;
      const double f = a[r][c] / a[c][c];
      for (int k = c; k <= m; ++k) a[r][k] -= f * a[c][k];
    }
  }
  out.fill(0.0);
  for (int r = 0; r < m; ++r) out[size_t(idx[r])] = a[r][m] / a[r][r];
  return true;
}

}  // namespace

// Non-negative least squares over `obs`; false when there is nothing to fit.
using Sample = std::pair<const Vec*, double>;  // features, measured ms

static bool fit_nnls(const std::vector<Sample>& samples, StepCostModel::Coefs& out) {
  Mat g{};
  Vec b{};
  double yy = 0;
  for (const auto& [xp, y] : samples) {
    const Vec& x = *xp;
    for (int i = 0; i < kF; ++i) {
      for (int j = 0; j < kF; ++j) g[size_t(i)][size_t(j)] += x[size_t(i)] * x[size_t(j)];
      b[size_t(i)] += x[size_t(i)] * y;
    }
    yy += y * y;
  }
  if (samples.size() < 2) return false;
  // Column scaling (features differ by orders of magnitude) and a small ridge, so that a
  // feature the data never varied (e.g. only decode steps seen) stays near 0 instead of
  // taking an arbitrary value.
  Vec scale{};
  for (int j = 0; j < kF; ++j) scale[size_t(j)] = std::sqrt(std::max(g[size_t(j)][size_t(j)], 1e-30));
  Mat gs{};
  Vec bs{};
  for (int i = 0; i < kF; ++i) {
    for (int j = 0; j < kF; ++j) gs[size_t(i)][size_t(j)] = g[size_t(i)][size_t(j)] / (scale[size_t(i)] * scale[size_t(j)]);
    gs[size_t(i)][size_t(i)] += 1e-9;
    bs[size_t(i)] = b[size_t(i)] / scale[size_t(i)];
  }
  // Non-negative least squares by enumeration: every subset of free coefficients, solved
  // unconstrained; the best one whose solution is all >= 0 wins (15 solves of <= 4x4).
  double best_loss = 1e300;
  Vec best{};
  for (unsigned mask = 1; mask < (1u << kF); ++mask) {
    Vec th;
    if (!solve_subset(gs, bs, mask, th)) continue;
    bool ok = true;
    for (double v : th) ok = ok && v >= 0;
    if (!ok) continue;
    // loss = yy - 2 th.b + th' G th (in scaled coordinates)
    double loss = yy;
    for (int i = 0; i < kF; ++i) {
      loss -= 2 * th[size_t(i)] * bs[size_t(i)];
      for (int j = 0; j < kF; ++j) loss += th[size_t(i)] * gs[size_t(i)][size_t(j)] * th[size_t(j)];
    }
    if (loss < best_loss) {
      best_loss = loss;
      best = th;
    }
  }
  if (best_loss == 1e300) return false;
  for (int j = 0; j < kF; ++j) out[size_t(j)] = best[size_t(j)] / scale[size_t(j)];
  return true;
}

void StepCostModel::refit() {
  std::vector<Sample> all;
  double lo = 1e300, hi = -1e300;  // range of n_tokens seen
  for (const Obs& o : anchors_) all.emplace_back(&o.x, o.ms);
  for (const Obs& o : recent_) all.emplace_back(&o.x, o.ms);
  for (const Sample& smp : all) {
    lo = std::min(lo, (*smp.first)[1]);
    hi = std::max(hi, (*smp.first)[1]);
  }
  Coefs c{};
  if (!fit_nnls(all, c)) return;
  // Trimming: a step slowed by something else on the machine (another process, a page-fault
  // storm) is not the machine's cost. Recent steps whose time is far above the fit (relative
  // residual more than max(0.15, 3 x MAD) above the median residual) are left out and the fit
  // repeated (three passes at most: the first fit is pulled up by the outliers themselves).
  for (int pass = 0; pass < 3 && recent_.size() >= 8; ++pass) {
    const auto predict = [&](const Obs& o) {
      double t = 0;
      for (int j = 0; j < kFeatures; ++j) t += c[size_t(j)] * o.x[size_t(j)];
      return t;
    };
    std::vector<double> rel;
    for (const Obs& o : recent_) rel.push_back(o.ms > 0 ? (o.ms - predict(o)) / o.ms : 0);
    const double med = percentile_of(rel, 50);
    std::vector<double> dev(rel.size());
    for (size_t i = 0; i < rel.size(); ++i) dev[i] = std::fabs(rel[i] - med);
    const double cut = med + std::max(0.15, 3 * percentile_of(dev, 50));
    std::vector<Sample> kept;
    for (const Obs& o : anchors_) kept.emplace_back(&o.x, o.ms);
    for (size_t i = 0; i < recent_.size(); ++i)
      if (rel[i] <= cut) kept.emplace_back(&recent_[i].x, recent_[i].ms);
    if (kept.size() == all.size()) break;
    Coefs c2{};
    if (!fit_nnls(kept, c2)) break;
    c = c2;
  }
  coefs_ = c;
  // Ready once steps of at least two sizes were measured (one size cannot separate the
  // per-step cost from the per-token cost).
  ready_ = hi > lo;
}

}  // namespace tern

#include "compress/awq.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "compress/linalg.h"
#include "core/error.h"

namespace tern {

namespace {

// down(silu(x gate^T) * (x up^T)): x [n_t, n_in], gate/up [n_ff, n_in], down [n_embd, n_ff].
std::vector<float> mlp_out(const float* x, int64_t n_t, int64_t n_in, const float* gate, const float* up,
                           int64_t n_ff, const float* down, int64_t n_embd, ThreadPool& pool) {
  std::vector<float> g(static_cast<size_t>(n_t * n_ff)), u(static_cast<size_t>(n_t * n_ff));
  matmul_nt(x, n_t, gate, n_ff, n_in, g.data(), pool);
  matmul_nt(x, n_t, up, n_ff, n_in, u.data(), pool);
  for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  std::vector<float> y(static_cast<size_t>(n_t * n_embd));
  matmul_nt(g.data(), n_t, down, n_embd, n_ff, y.data(), pool);
  return y;
}

}  // namespace

AwqScales awq_search(const std::vector<const float*>& w, const std::vector<int64_t>& n_out, int64_t n_in,
                     const SiteStats& site, const std::vector<int32_t>& tie, const AwqOptions& opts,
                     ThreadPool& pool, const float* down, int64_t down_n_out) {
  if (down && (w.size() != 2 || n_out[0] != n_out[1])) fail("awq: the MLP objective needs gate and up");
  if (site.n_in != n_in) fail("awq: calibration input has ", site.n_in, " channels, the weight ", n_in);
  if (site.n_samples == 0) fail("awq: no calibration samples");
  // Per-channel activation magnitude, averaged within tie classes.
  std::vector<double> xm(static_cast<size_t>(n_in));
  for (int64_t j = 0; j < n_in; ++j) xm[size_t(j)] = site.mean_abs(j);
  if (!tie.empty()) {
    const int32_t n_cls = *std::max_element(tie.begin(), tie.end()) + 1;
    std::vector<double> sum(size_t(n_cls), 0.0);
    std::vector<int> cnt(size_t(n_cls), 0);
    for (int64_t j = 0; j < n_in; ++j) {
      sum[size_t(tie[size_t(j)])] += xm[size_t(j)];
      ++cnt[size_t(tie[size_t(j)])];
    }
    for (int64_t j = 0; j < n_in; ++j) xm[size_t(j)] = sum[size_t(tie[size_t(j)])] / cnt[size_t(tie[size_t(j)])];
  }

  // Duo scaling's weight term: per channel, the mean over every row of the site's linears of
  // |w| / max|w| of its group.
  std::vector<double> wm(static_cast<size_t>(n_in), 1.0);
  if (opts.duo) {
    std::fill(wm.begin(), wm.end(), 0.0);
    int64_t rows = 0;
    const int64_t g = opts.group;
    for (size_t k = 0; k < w.size(); ++k) {
      for (int64_t o = 0; o < n_out[k]; ++o) {
        const float* r = w[k] + o * n_in;
        for (int64_t c0 = 0; c0 < n_in; c0 += g) {
          const int64_t c1 = std::min(n_in, c0 + g);
          float mx = 0;
          for (int64_t j = c0; j < c1; ++j) mx = std::max(mx, std::fabs(r[j]));
          if (mx > 0)
            for (int64_t j = c0; j < c1; ++j) wm[size_t(j)] += std::fabs(r[j]) / mx;
        }
      }
      rows += n_out[k];
    }
    for (auto& v : wm) v /= double(rows);
    if (!tie.empty()) {
      const int32_t n_cls = *std::max_element(tie.begin(), tie.end()) + 1;
      std::vector<double> sum(static_cast<size_t>(n_cls), 0.0);
      std::vector<int> cnt(static_cast<size_t>(n_cls), 0);
      for (int64_t j = 0; j < n_in; ++j) {
        sum[size_t(tie[size_t(j)])] += wm[size_t(j)];
        ++cnt[size_t(tie[size_t(j)])];
      }
      for (int64_t j = 0; j < n_in; ++j) wm[size_t(j)] = sum[size_t(tie[size_t(j)])] / cnt[size_t(tie[size_t(j)])];
    }
  }

  const float* x = site.samples.data();
  const int64_t n_t = site.n_samples;
  std::vector<float> y_ref;
  if (down) y_ref = mlp_out(x, n_t, n_in, w[0], w[1], n_out[0], down, down_n_out, pool);
  std::vector<std::vector<float>> deq(w.size());
  AwqScales best;
  best.err = std::numeric_limits<double>::infinity();
  std::vector<float> s(static_cast<size_t>(n_in)), ws, q;
  for (int gi = 0; gi < opts.grid; ++gi) {
    const double alpha = double(gi) / opts.grid;
    double smax = 0, smin = std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < n_in; ++j) {
      const double v = std::max(std::pow(xm[size_t(j)], alpha) / (std::pow(wm[size_t(j)], 1.0 - alpha) + 1e-4), 1e-4);
      s[size_t(j)] = float(v);
      smax = std::max(smax, v);
      smin = std::min(smin, v);
    }
    const double norm = std::sqrt(smax * smin);
    for (auto& v : s) v = float(v / norm);
    double err = 0;
    for (size_t k = 0; k < w.size(); ++k) {
      const int64_t m = n_out[k];
      ws.resize(size_t(m * n_in));
      for (int64_t o = 0; o < m; ++o)
        for (int64_t j = 0; j < n_in; ++j) ws[size_t(o * n_in + j)] = w[k][o * n_in + j] * s[size_t(j)];
      const GroupQuant gq = rtn_group_quant(ws.data(), m, n_in, opts.bits, opts.group, pool);
      q = gq.dequantize();
      for (int64_t o = 0; o < m; ++o)
        for (int64_t j = 0; j < n_in; ++j) q[size_t(o * n_in + j)] /= s[size_t(j)];
      if (down) deq[k] = q;
      else err += output_error_samples(w[k], q.data(), m, n_in, x, n_t, pool);
    }
    if (down) {
      const std::vector<float> y = mlp_out(x, n_t, n_in, deq[0].data(), deq[1].data(), n_out[0], down, down_n_out, pool);
      for (size_t i = 0; i < y.size(); ++i) err += double(y[i] - y_ref[i]) * double(y[i] - y_ref[i]);
    }
    if (gi == 0) best.err_rtn = err;
    if (err < best.err) {
      best.err = err;
      best.alpha = alpha;
      best.s = s;
    }
  }
  return best;
}

GroupQuant awq_quantize(const float* ws, int64_t n_out, int64_t n_in, const float* xs, int64_t n_t, bool clip,
                        const AwqOptions& opts, ThreadPool& pool) {
  if (!clip || n_t == 0) return rtn_group_quant(ws, n_out, n_in, opts.bits, opts.group, pool);
  GroupQuant gq;
  gq.bits = opts.bits;
  gq.group = opts.group;
  gq.n_out = n_out;
  gq.n_in = n_in;
  gq.q.resize(size_t(n_out * n_in));
  const int64_t ng = gq.n_groups();
  gq.d.resize(size_t(n_out * ng));
  gq.z.resize(size_t(n_out * ng));
  const TqFormat f{opts.bits, int(opts.group)};
  const int maxq = f.maxq();
  pool.parallel_for(n_out, [&](int64_t o0, int64_t o1, int) {
    for (int64_t o = o0; o < o1; ++o)
      for (int64_t g = 0; g < ng; ++g) {
        const int64_t c0 = g * opts.group, c1 = std::min(n_in, c0 + opts.group);
        const float* wg = ws + o * n_in + c0;
        float lo = 0, hi = 0;
        for (int64_t i = 0; i < c1 - c0; ++i) {
          lo = std::min(lo, wg[i]);
          hi = std::max(hi, wg[i]);
        }
        // The group's share of every sampled output: sum_i x[t][c0+i] * (w_i - q_i).
        double best_err = std::numeric_limits<double>::infinity();
        float best_d = 0;
        int best_z = 0;
        for (int step = 0; step < opts.clip_grid; ++step) {
          const float r = float(1.0 - opts.max_shrink * step / opts.clip_grid);
          float d;
          int z;
          tq_params_range(f, lo * r, hi * r, &d, &z);
          double err = 0;
          for (int64_t t = 0; t < n_t && err < best_err; ++t) {
            const float* xt = xs + t * n_in + c0;
            double e = 0;
            for (int64_t i = 0; i < c1 - c0; ++i) {
              const int qv = tq_quantize_value(wg[i], d, z, maxq);
              e += double(xt[i]) * (double(wg[i]) - double(d) * (qv - z));
            }
            err += e * e;
          }
          if (err < best_err) {
            best_err = err;
            best_d = d;
            best_z = z;
          }
        }
        gq.d[size_t(o * ng + g)] = best_d;
        gq.z[size_t(o * ng + g)] = uint8_t(best_z);
        for (int64_t i = c0; i < c1; ++i)
          gq.q[size_t(o * n_in + i)] = uint8_t(tq_quantize_value(ws[o * n_in + i], best_d, best_z, maxq));
      }
  });
  return gq;
}

}  // namespace tern

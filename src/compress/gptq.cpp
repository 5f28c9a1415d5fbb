#include "compress/gptq.h"

#include <algorithm>
#include <numeric>

#include "compress/linalg.h"
#include "core/error.h"

namespace tern {

GroupQuant gptq_quantize(const float* w, int64_t n_out, int64_t n_in, const std::vector<double>& hessian,
                         const GptqOptions& opts, ThreadPool& pool, GptqStats* stats) {
  if (int64_t(hessian.size()) != n_in * n_in) fail("gptq: the Hessian is not ", n_in, " x ", n_in);
  if (opts.damp < 0) fail("--damp must be >= 0");
  std::vector<double> h = hessian;
  int64_t n_dead = 0;
  const std::vector<bool> dead = mark_dead_inputs(h, n_in, &n_dead);

  // Processing order: act-order sorts by decreasing H[i][i] (the most active inputs first, while
  // many columns remain to absorb their error). perm[k] = original column of step k.
  std::vector<int64_t> perm(static_cast<size_t>(n_in));
  std::iota(perm.begin(), perm.end(), 0);
  if (opts.act_order)
    std::stable_sort(perm.begin(), perm.end(), [&](int64_t a, int64_t b) {
      return h[size_t(a * n_in + a)] > h[size_t(b * n_in + b)];
    });
  std::vector<int64_t> inv_perm(static_cast<size_t>(n_in));  // original column -> step
  for (int64_t k = 0; k < n_in; ++k) inv_perm[size_t(perm[size_t(k)])] = k;
  std::vector<double> hp(static_cast<size_t>(n_in * n_in));  // [n_in, n_in] H permuted
  for (int64_t a = 0; a < n_in; ++a)
    for (int64_t b = 0; b < n_in; ++b) hp[size_t(a * n_in + b)] = h[size_t(perm[size_t(a)] * n_in + perm[size_t(b)])];

  double damp = opts.damp;
  const std::vector<double> u = inverse_cholesky_upper(hp, n_in, opts.damp, pool, &damp, "gptq");  // U^T U = H^-1

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
    std::vector<double> row(static_cast<size_t>(n_in));       // [n_in] permuted, updated in place
    std::vector<float> grp(static_cast<size_t>(opts.group));
    std::vector<bool> have(static_cast<size_t>(ng));
    for (int64_t o = o0; o < o1; ++o) {
      for (int64_t k = 0; k < n_in; ++k) {
        const int64_t c = perm[size_t(k)];
        row[size_t(k)] = dead[size_t(c)] ? 0.0 : double(w[o * n_in + c]);
      }
      std::fill(have.begin(), have.end(), false);
      for (int64_t k = 0; k < n_in; ++k) {
        const int64_t c = perm[size_t(k)];
        const int64_t g = c / opts.group;
        if (!have[size_t(g)]) {
          // The group's parameters come from its columns' values now, i.e. after the updates of
          // every column quantized so far (GPTQ fixes them at the group's first column).
          const int64_t c0 = g * opts.group, c1 = std::min(n_in, c0 + opts.group);
          for (int64_t cc = c0; cc < c1; ++cc) grp[size_t(cc - c0)] = float(row[size_t(inv_perm[size_t(cc)])]);
          float d;
          int z;
          tq_params(f, grp.data(), c1 - c0, &d, &z);
          gq.d[size_t(o * ng + g)] = d;
          gq.z[size_t(o * ng + g)] = uint8_t(z);
          have[size_t(g)] = true;
        }
        const float d = gq.d[size_t(o * ng + g)];
        const int z = gq.z[size_t(o * ng + g)];
        const int q = tq_quantize_value(float(row[size_t(k)]), d, z, maxq);
        gq.q[size_t(o * n_in + c)] = uint8_t(q);
        const double deq = double(d) * double(q - z);
        const double* uk = u.data() + k * n_in;
        const double e = (row[size_t(k)] - deq) / uk[k];
        for (int64_t j = k + 1; j < n_in; ++j) row[size_t(j)] -= e * uk[j];
      }
    }
  });
  if (stats) {
    stats->damp_used = damp;
    stats->dead_columns = n_dead;
  }
  return gq;
}

}  // namespace tern
